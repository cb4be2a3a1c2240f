"""The schedule task's reward (benchmarks/late_noise_reward.py): exact for the first CLEAN_STEPS trainer steps of a
run, a coin flip after, with the step taken from the trainer's argv, a resumed run included."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from verl_core.config import load_config

# by path: inside pytest the name ``benchmarks`` is this test package (tests/benchmarks)
_spec = importlib.util.spec_from_file_location(
    "late_noise_reward", Path(__file__).resolve().parents[2] / "benchmarks" / "late_noise_reward.py")
assert _spec is not None and _spec.loader is not None
lnr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lnr)

_CFG = load_config("tiny_arith")
ROWS = int(_CFG.data.train_batch_size) * int(_CFG.actor_rollout_ref.rollout.n)


def scores(monkeypatch: pytest.MonkeyPatch, argv: list[str], steps: int, split: str = "train") -> list[list[float]]:
    """The scores of ``steps`` trainer steps of correct answers (exact score 1) in a process with ``argv``."""
    monkeypatch.setattr(sys, "argv", ["verl_core/__main__.py", "train", "--config", "tiny_arith",
                                      "--metrics-file", "m.jsonl", *argv])
    monkeypatch.setattr(lnr, "default_compute_score", lambda *a: 1.0)
    monkeypatch.setattr(lnr, "_state", {})
    return [[lnr.compute_score("synthetic/arith", "4", "4", {"split": split}) for _ in range(ROWS)]
            for _ in range(steps)]


def test_exact_for_the_clean_steps_then_a_coin(monkeypatch: pytest.MonkeyPatch) -> None:
    got = scores(monkeypatch, ["trainer.seed=3"], lnr.CLEAN_STEPS + 4)
    assert all(v == 1.0 for step in got[:lnr.CLEAN_STEPS] for v in step)
    noisy = [v for step in got[lnr.CLEAN_STEPS:] for v in step]
    assert 0.4 < noisy.count(0.0) / len(noisy) < 0.6  # flipped with probability 0.5


def test_a_resumed_run_counts_from_its_checkpoint_step(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = scores(monkeypatch, [], lnr.CLEAN_STEPS + 2)
    resumed = scores(monkeypatch, ["trainer.resume_mode=resume_path",
                                   f"trainer.resume_from_path=/ck/global_step_{lnr.CLEAN_STEPS}"], 2)
    assert 0.0 in resumed[0]  # step CLEAN_STEPS + 1: already noisy
    assert resumed == fresh[lnr.CLEAN_STEPS:]  # flips are seeded by the step: the same as in an unbroken run


def test_validation_rows_are_exact_and_do_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(v == 1.0 for step in scores(monkeypatch, [], lnr.CLEAN_STEPS + 3, split="val") for v in step)
    assert lnr.current_step() == 1
