"""``python -m verl_core validate``: exit 0 with the table and ``All checks passed``, or one ``error:`` line, exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_core import cli

REPO = Path(__file__).resolve().parents[2]
NO_GPU = shutil.which("nvidia-smi") is None


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["validate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_good_config_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--config", "tiny_arith")
    assert rc == 0, err
    assert "actor AdamW states" in out and "TOTAL (peak)" in out and "available" in out
    assert out.strip().splitlines()[-1].startswith("All checks passed")
    assert err == ""


def test_pretrained_config_passes_with_its_warning(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--config", "smollm2_addition", "--memory-limit-gb", "16")
    assert rc == 0
    assert "134.5M params x 4 B (fp32)" in out
    assert "All checks passed" in out


@pytest.mark.parametrize("argv, expected", [
    (["--config", "tiny_arith", "data.train_batch_size=48"], "is not divisible by"),
    (["--config", "tiny_arith", "no.such.key=1"], "unknown config key 'no.such.key'"),
    (["--config", "nope"], "no such file or shipped config"),
    (["--config", "smollm2_addition", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     "does not divide the model's num_attention_heads=9"),
    (["--config", "tiny_arith", "actor_rollout_ref.model.path=/nonexistent"], "no config.json"),
    (["--config", "tiny_arith", "--memory-limit-gb", "0.3"], "memory: does not fit: 'framework baseline'"),
    (["--config", "smollm2_addition", "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=256", "--memory-limit-gb", "8"],
     "memory: does not fit: 'actor activations'"),
])
def test_bad_configs_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err


def test_tensor_parallel_vs_kv_heads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 6, "head_dim": 64}))
    rc, _, err = run(capsys, "--config", "tiny_arith", f"actor_rollout_ref.model.path={tmp_path}",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=4")
    assert rc == 2 and err.strip() == ("error: actor_rollout_ref.rollout.tensor_model_parallel_size=4 and the "
                                       "model's num_key_value_heads=6: one must divide the other")
    rc, _, err = run(capsys, "--config", "tiny_arith", f"actor_rollout_ref.model.path={tmp_path}",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert rc == 0, err


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU case")
def test_cuda_without_gpu_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "--config", "tiny_arith", "trainer.device=cuda")
    assert rc == 2 and err.startswith("error: trainer.device='cuda' but no GPU is visible")
    rc, _, err = run(capsys, "--config", "tiny_arith", "--device", "cuda")
    assert rc == 2 and "--memory-limit-gb" in err
    # planning for a GPU this machine does not have: the estimate in bf16 against the given memory
    rc, out, _ = run(capsys, "--config", "smollm2_addition", "--device", "cuda", "--memory-limit-gb", "80",
                     "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    assert rc == 0 and "checkpointed, bf16 autocast" in out
    assert next(line for line in out.splitlines() if line.startswith("TOTAL (peak)")).split()[2] == "cuda"


def test_best_practice_warnings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "data": {"response_length/clip_ratio": 0.5}}) + "\n"
                               for s in range(1, 5)))
    rc, out, _ = run(capsys, "--config", "tiny_arith", "--metrics", str(metrics),
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=2e-4")
    assert rc == 0
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert any("ppo_epochs=4 with actor.optim.lr=0.0002" in w for w in warnings), warnings
    assert any("16 gradient-accumulation micro-batches" in w for w in warnings), warnings
    assert any("clip_ratio averaged 50% over 4 steps" in w for w in warnings), warnings
    rc, out, _ = run(capsys, "--config", "tiny_arith", "data.train_batch_size=32")
    assert any("below twice" in line for line in out.splitlines())


def test_cli_subprocess_no_traceback_and_no_torch(tmp_path: Path) -> None:
    code = ("import sys; from verl_core.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'validate imported torch'; sys.exit(rc)")
    ok = subprocess.run([sys.executable, "-c", code, "validate", "--config", "smollm2_addition"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "verl_core", "validate", "--config", "tiny_arith",
                          "--metrics", str(tmp_path / "missing.jsonl")], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [f"error: --metrics {tmp_path / 'missing.jsonl'}: cannot read "
                                               "(No such file or directory)"]
