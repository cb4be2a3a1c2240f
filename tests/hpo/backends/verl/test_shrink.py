"""The rehearsal's shrink step (``hpo/backends/verl/_shrink.py``, run in verl's interpreter): a small model of the
experiment's architecture, the training rows with the longest prompts, a validation row of every data source, the
reward function scored on every validation row and on the training rows with the most unusual ground truths, and the
set keys nothing in verl reads. Its reward check bounded in time and in what the user's function prints (issue 44
item 8: a looping function costs the limit, not 15 minutes; a function that prints 50 MB costs 64 KiB), and a reward
module that does not load named by its root cause."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpo.backends.verl._rehearse_steps import SHRINK_SCRIPT
from tests.hpo.backends.verl.conftest import (
    ARITH,
    VERL_PY,
    arith_experiment,
    arith_rows,
    arith_space,
    needs_verl,
    user_experiment,
)
from tests.hpo.conftest import ROOT

pytestmark = needs_verl


def test_shrink_builds_a_small_model_of_the_same_architecture_and_keeps_the_longest_rows(tmp_path: Path) -> None:
    """One run of ``_shrink.py`` (a few seconds): the arith model's ``config.json`` -> 2 layers with heads of 64 (vLLM's
    CPU attention refuses 16), its tokenizer beside it, the rows with the longest prompts and their lengths, every
    validation row and the unusual training truths scored, and the one set key nothing in verl reads."""
    arith_space(tmp_path)  # the prepare step: model, data, reward.py
    config = json.loads((ARITH / "model" / "config.json").read_text())
    config.update(num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2)
    request = {"config_dir": None, "config_name": "ppo_trainer", "out": str(tmp_path / "out"), "train_rows": 20,
               "val_rows": 5, "tokenizer": None, "models": {"actor_rollout_ref.model.path": config},
               "overrides": [f"actor_rollout_ref.model.path={ARITH / 'model'}",
                             f"data.train_files={ARITH / 'train.parquet'}", f"data.val_files={ARITH / 'val.parquet'}",
                             f"reward.custom_reward_function.path={ARITH / 'reward.py'}",
                             "+algorithm.kl_ctrl.kl_coeff=0.1", "+actor_rollout_ref.model.override_config.x=1"],
               "set_keys": ["+algorithm.kl_ctrl.kl_coeff", "+actor_rollout_ref.model.override_config.x",
                            "data.train_batch_size"]}
    res = subprocess.run([str(VERL_PY), str(SHRINK_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=300)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok" and reply["problems"] == [], reply
    model = reply["models"]["actor_rollout_ref.model.path"]
    assert model["from"] == "24 layers, hidden 896, 14 heads (2 kv), vocab 304"
    assert model["to"] == "2 layers, hidden 128, 2 heads (1 kv), vocab 305"
    built = json.loads((Path(model["dir"]) / "config.json").read_text())
    assert built["hidden_size"] // built["num_attention_heads"] == 64 and built["model_type"] == "qwen2"
    assert (Path(model["dir"]) / "tokenizer.json").is_file() and (Path(model["dir"]) / "model.safetensors").is_file()
    assert reply["data"]["train"]["rows"] == 20 and reply["data"]["val"]["rows"] == 5
    assert 4 <= reply["data"]["train"]["prompt_tokens"]["mean"] <= reply["data"]["train"]["prompt_tokens"]["max"] <= 16
    unusual = reply["data"]["train"]["unusual"]  # the training rows with the longest and the shortest truths
    assert 2 <= unusual <= 4 and reply["data"]["train"]["picked"] == "longest"
    assert reply["reward"]["calls"] == (5 + unusual) * 4
    assert reply["reward"]["where"].endswith("reward.py:compute_score")
    assert reply["unread"] == ["+algorithm.kl_ctrl.kl_coeff"]


def test_the_rehearsal_keeps_the_longest_prompts_and_scores_unusual_training_truths(tmp_path: Path) -> None:
    """The shrink step (verl's interpreter, a few seconds) keeps the training rows with the longest prompts, not the
    first; the reward function is called on the training row whose ground truth is the odd one out (an empty string
    at row 300, which the user's int() cannot read), so the rehearsal names that row before any corner runs."""
    space = arith_experiment(tmp_path, arith_rows(400, empty_truth=300))
    reward = space.parent / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                      "    return float(str(int(ground_truth)) in solution_str)\n")
    config = json.loads((ARITH / "model" / "config.json").read_text())
    request = {"config_dir": None, "config_name": "ppo_trainer", "out": str(tmp_path / "out"), "train_rows": 8,
               "val_rows": 4, "tokenizer": None, "models": {"actor_rollout_ref.model.path": config},
               "overrides": [f"actor_rollout_ref.model.path={ARITH / 'model'}",
                             f"data.train_files={space.parent / 'train.parquet'}",
                             f"data.val_files={space.parent / 'val.parquet'}",
                             f"reward.custom_reward_function.path={reward}"], "set_keys": []}
    res = subprocess.run([str(VERL_PY), str(SHRINK_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=300)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok", reply
    kept = pq.read_table(tmp_path / "out" / "data" / "train.parquet").to_pylist()
    questions = [r["prompt"][0]["content"] for r in kept]
    assert len(kept) == 8 and questions[kept.index(max(kept, key=lambda r: len(r["prompt"][0]["content"])))] \
        .startswith("add these numbers") and "0+1=" not in questions, questions  # the longest, not the first
    assert reply["data"]["train"]["picked"] == "longest" and reply["data"]["train"]["total"] == 400
    assert [p["check"] for p in reply["problems"]] == ["reward"], reply["problems"]
    line = reply["problems"][0]["message"]
    assert "raised on training row train.parquet:300" in line and "ValueError" in line, line


def test_the_rehearsal_keeps_a_validation_row_of_every_data_source(user_models: Path, tmp_path: Path) -> None:
    """The objective's data source first appears at validation row 8: the shrunk validation set keeps the first rows
    and a row of each source they lack, so verl logs the objective (not "was never logged" and another task's
    metric)."""
    space = user_experiment(tmp_path / "mine", user_models / "model", val_name="val.parquet")
    config = json.loads((user_models / "model" / "config.json").read_text())
    request = {"config_dir": None, "config_name": "ppo_trainer", "out": str(tmp_path / "out"), "train_rows": 8,
               "val_rows": 4, "tokenizer": None, "models": {"actor_rollout_ref.model.path": config},
               "overrides": [f"actor_rollout_ref.model.path={user_models / 'model'}",
                             f"data.train_files={space.parent / 'train.parquet'}",
                             f"data.val_files={space.parent / 'val.parquet'}",
                             f"reward.custom_reward_function.path={space.parent / 'reward.py'}"], "set_keys": []}
    res = subprocess.run([str(VERL_PY), str(SHRINK_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=600)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok" and not reply["problems"], reply
    kept = pq.read_table(tmp_path / "out" / "data" / "val.parquet").to_pylist()
    assert [r["data_source"] for r in kept] == ["mine/a"] * 4 + ["mine/b"], kept
    assert kept[-1]["extra_info"]["index"] == 8


# ----------------------------------------------------------------------------- the reward check
def _check(tmp_path: Path, body: str, timeout_s: float) -> tuple[dict, float, int]:
    reward = tmp_path / "reward.py"
    reward.write_text(textwrap.dedent(body))
    val = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "mine", "reward_model": {"ground_truth": "4"},
                                          "extra_info": {"index": i}} for i in range(3)]), val)
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT / "hpo" / "backends" / "verl")!r})
        import _shrink
        from omegaconf import OmegaConf
        cfg = OmegaConf.create({{"reward": {{"custom_reward_function": {{"path": {str(reward)!r},
                                                                         "name": "compute_score"}}}}}})
        print(json.dumps(_shrink.check_reward(cfg, {str(val)!r}, timeout_s={timeout_s})))
    """)
    started = time.monotonic()
    res = subprocess.run([str(VERL_PY), "-c", script], capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.decode().strip().splitlines()[-1]), time.monotonic() - started, len(res.stdout)


def test_a_looping_reward_function_is_stopped_at_the_limit(tmp_path: Path) -> None:
    out, seconds, _ = _check(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            while True:
                pass
    """, timeout_s=5)
    msg = out["problem"]["message"]
    # on a busy host the limit may already end the module's load ("its first call"), else the first row's call
    assert "did not return within 5 s" in msg and "--reward-timeout" in msg, msg
    assert "validation row 0" in msg or "its first call" in msg, msg
    assert seconds < 240, seconds  # the limit, not the 900 s it was


def test_what_a_reward_function_prints_is_capped_and_counted(tmp_path: Path) -> None:
    out, _, stdout_bytes = _check(tmp_path, """
        import sys
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            sys.stdout.write("x" * 5_000_000)
            print("y" * 1_000_000, file=sys.stderr)
            return 1.0 if solution_str.strip() == ground_truth else 0.0
    """, timeout_s=60)
    assert "problem" not in out and out["calls"] > 0
    assert out["printed_bytes"] >= 6_000_000 * out["calls"] and out["printed_dropped_bytes"] > 5_000_000
    assert stdout_bytes < 100_000  # none of it reached the reply's stream


@pytest.mark.parametrize("body, needles", [
    ("def compute_score(:\n    pass\n", ["SyntaxError", "reward.py:1"]),
    ("import nonexistent_scoring_lib\ndef compute_score(*a, **k):\n    return 0.0\n",
     ["ModuleNotFoundError", "'nonexistent_scoring_lib' is not installed", "reward.py:1"]),
    ("def helper():\n    raise KeyError('oops')\nhelper()\n", ["KeyError", "reward.py:2"]),
])
def test_a_reward_module_that_does_not_load_names_its_root_cause(tmp_path: Path, body: str,
                                                                  needles: list[str]) -> None:
    """verl wraps every load failure in ``RuntimeError: Error loading module from module_path=...``: the line says
    the real exception, the file and line, and the missing module (issue 43 item 5)."""
    out, _, _ = _check(tmp_path, body, timeout_s=60)
    msg = out["problem"]["message"]
    assert "does not load" in msg and "Error loading module" not in msg, msg
    for n in needles:
        assert n in msg, msg
