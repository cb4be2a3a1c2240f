"""The TRL launcher (``hpo/backends/trl/_train.py``, run in TRL's interpreter) and retries of its trials with real
checkpoints: the launcher (TRL's GRPOTrainer on the tiny arith model, ~6 s) saves ``checkpoint-N`` directories; the
backend finds the newest complete one along a retry chain, the launcher continues from it, and the curve the chain
logged up to it is replayed as one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.backends.trl import LAUNCHER, checkpoint_complete, resume_point
from hpo.execution import MetricsTail
from tests.hpo.conftest import ROOT

CONFIG = ROOT / "search_spaces" / "trl_configs" / "grpo_arith.yaml"
KEYS = ["max_steps=6", "eval_steps=3", "save_steps=3", "save_total_limit=null", "learning_rate=1.0e-4"]


def _attempt(trial_dir: Path, attempt: int, resume: Path | None = None) -> list[tuple[int, dict[str, float]]]:
    """Run one attempt as the driver does (command.json first) and return its metrics."""
    metrics = trial_dir / ("metrics.jsonl" if attempt == 0 else f"metrics.attempt{attempt}.jsonl")
    argv = [sys.executable, str(LAUNCHER), "--config", str(CONFIG), "--metrics-file", str(metrics), *KEYS,
            f"output_dir={trial_dir / 'checkpoints'}", *([f"resume_from_checkpoint={resume}"] if resume else [])]
    trial_dir.mkdir(parents=True)
    (trial_dir / "command.json").write_text(json.dumps({"argv": argv}))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return MetricsTail(metrics).read()


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """trials/7: a first attempt that saved checkpoint-3 and checkpoint-6; its step-6 checkpoint is then cut short
    (no trainer_state.json), so its retry, trials/9, continued from checkpoint-3 and saved its own checkpoint-6."""
    trials = tmp_path_factory.mktemp("trials")
    _attempt(trials / "7", 0)
    (trials / "7" / "checkpoints" / "checkpoint-6" / "trainer_state.json").unlink()
    _attempt(trials / "9", 1, resume=trials / "7" / "checkpoints" / "checkpoint-3")
    return trials


def test_a_checkpoint_is_complete_once_its_trainer_state_is_written(chain: Path) -> None:
    first = chain / "7" / "checkpoints"
    assert checkpoint_complete(first / "checkpoint-3")
    assert not checkpoint_complete(first / "checkpoint-6")  # trainer_state.json is the Trainer's last write
    assert checkpoint_complete(chain / "9" / "checkpoints" / "checkpoint-6")
    broken = chain / "broken" / "checkpoint-3"
    shutil.copytree(first / "checkpoint-3", broken)
    (broken / "optimizer.pt").unlink()  # half removed by the Trainer's rotation
    assert not checkpoint_complete(broken)


def test_the_newest_complete_checkpoint_of_the_chain_and_its_lineage(chain: Path) -> None:
    first = resume_point(chain, [7])
    assert first is not None and first.step == 3 and first.checkpoint == chain / "7" / "checkpoints" / "checkpoint-3"
    point = resume_point(chain, [7, 9])
    assert point is not None and point.step == 6
    assert point.checkpoint == chain / "9" / "checkpoints" / "checkpoint-6"
    assert point.lineage == (chain / "7" / "metrics.jsonl", chain / "9" / "metrics.attempt1.jsonl")
    assert point.starts == (None, 3)
    assert resume_point(chain, [5]) is None  # no such attempt: the retry starts afresh


def test_the_retry_continued_after_the_checkpoint_and_the_curve_is_replayed(chain: Path) -> None:
    resumed = MetricsTail(chain / "9" / "metrics.attempt1.jsonl").read()
    assert min(step for step, _ in resumed) == 4  # no step 0 evaluation, no re-run of steps 1-3
    records = resume_point(chain, [7, 9]).records()  # type: ignore[union-attr]
    evals = {step: data["eval/reward_mean"] for step, data in records if "eval/reward_mean" in data}
    assert sorted(evals) == [0, 3, 6]
    first = dict(MetricsTail(chain / "7" / "metrics.jsonl").read_evals()) if False else None  # noqa: F841
    original = {s: d["eval/reward_mean"] for s, d in MetricsTail(chain / "7" / "metrics.jsonl").read()
                if "eval/reward_mean" in d}
    assert evals[0] == original[0] and evals[3] == original[3]
    assert evals[6] == next(d["eval/reward_mean"] for s, d in resumed if s == 6 and "eval/reward_mean" in d)
    assert evals[6] == original[6]  # the Trainer restores weights, optimizer, scheduler, RNG and data position: exact
    assert all(k in dict(records)[5] for k in ("train/loss", "train/entropy", "timing_s/step"))
