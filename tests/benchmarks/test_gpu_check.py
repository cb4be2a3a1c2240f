"""``benchmarks/gpu_check.py --dry-run``: the GPU plan on CPU with the tiny model prints its one table; the real verl
stage prints its search command and validates the same space with real verl (``.venv-verl``) on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HAS_VERL = (REPO / ".venv-verl" / "bin" / "python").exists()


@pytest.mark.timeout(900)
def test_dry_run_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--json", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    names = ["device", "train (grad checkpointing, fp32)", "memory estimate", "rollout vLLM vs HF",
             "checkpoint resume", "4-bit reward model", "verl study", "verl memory estimate"]
    assert list(rows) == names
    for name in ("device", "train (grad checkpointing, fp32)", "memory estimate", "checkpoint resume"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["4-bit reward model"]["status"] == "skipped" and "CUDA" in rows["4-bit reward model"]["detail"]
    assert rows["rollout vLLM vs HF"]["status"] in ("ok", "skipped")
    assert "ratio" in rows["memory estimate"]["detail"] and "resumed at step 2" in rows["checkpoint resume"]["detail"]
    table = proc.stdout
    assert "gpu-check: DRY RUN on CPU" in table and all(n in table for n in names)
    verl = rows["verl study"]
    assert "would run: -m hpo search --space verl_grpo_gsm8k" in verl["detail"]
    if HAS_VERL:  # every corner composed by real verl, with its memory estimate
        assert verl["status"] == "ok" and "corner(s) composed by verl 0.9.1" in verl["detail"], verl
    else:
        assert verl["status"] == "skipped" and "make install-verl" in verl["detail"]
    assert rows["verl memory estimate"]["status"] == "skipped"


def test_the_verl_stage_command_is_a_valid_search() -> None:
    """The plumbing of the GPU verl stage: its argv parses as ``verl-hpo search`` and its overrides shrink the
    shipped space to a 2-step trial on the local model and data (no verl needed)."""
    from hpo._cli import build_parser
    from hpo._space import load_space

    # in a subprocess: this test package is also called `benchmarks`
    code = ("import json, sys; from pathlib import Path; from benchmarks import gpu_check as g; "
            "o = g.verl_space_overrides(Path('/tmp/w'), Path('/tmp/w/model'), '/venv/bin/python', 2); "
            "print(json.dumps([o, g.verl_search_argv(Path('/tmp/w'), o), g.ray_processes(float('inf'))]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    overrides, argv, ray_left = json.loads(proc.stdout)
    work, model = Path("/tmp/w"), Path("/tmp/w/model")
    assert argv[1:3] == ["-m", "hpo"]
    args = build_parser().parse_args(argv[3:])
    assert args.cmd == "search" and args.space == "verl_grpo_gsm8k" and args.override == overrides
    space = load_space("verl_grpo_gsm8k", overrides, check=False)
    assert space.trial.is_verl and space.trial.python == "/venv/bin/python" and space.study.n_trials == 2
    assert space.param("mini_batch").choices == (16,)
    assert space.overrides["trainer.total_training_steps"] == 2 and space.overrides["trainer.test_freq"] == 2
    assert space.overrides["actor_rollout_ref.model.path"] == str(model)
    assert space.overrides["data.train_files"] == str(work / "gsm8k" / "train.parquet")
    assert ray_left == []


def test_steps_below_two_is_an_error() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--steps", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --steps 1: the resume check needs at least 2"
