"""Throughput studies end to end with the real verl_core trainer, from a directory of the user's own: warm-up steps
not measured, the picks re-measured against the user's config with the same-math check, a predicted OOM never
launched; plus the statistics as pure functions. ``study.speed_from`` (a separated confirmation only, which two
paired real runs on a busy host do not always give) is tested with fake-trainer studies of planted speeds:
tests/hpo/reporting/test_speed_from.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import TrialState

from hpo.record import is_confirm
from hpo.reporting._same_math import LOOSE_FLOOR
from hpo.reporting._speed import _ratio
from tests.hpo.conftest import cli_env, load

MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def _cli(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpo", *args, "--studies-dir", str(cwd / "studies")], cwd=cwd,
                          env=cli_env(), capture_output=True, text=True, timeout=timeout)


def _throughput_space(cwd: Path, name: str, params: dict[str, Any], **study: Any) -> Path:
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 3, "trainer.test_freq": -1, "trainer.val_before_train": False,
                      "trainer.cpu_threads": 1},
        "params": params,
        "study": {"kind": "throughput", "n_trials": 1, "sampler": {"type": "random", "seed": 0},
                  "throughput": {"warmup_steps": 1, "repeats": 2, "top_k": 1}, **study},
        "trial": {"n_jobs": 1, "timeout_s": 300},
    }
    path = cwd / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- the statistics
def test_the_speedup_is_the_geometric_mean_of_paired_ratios_with_a_t_interval() -> None:
    ratio, low, high = _ratio([(1, 200.0, 100.0), (2, 220.0, 100.0), (3, 180.0, 100.0)], faster_is_higher=True)
    assert ratio == pytest.approx((2.0 * 2.2 * 1.8) ** (1 / 3))
    assert low is not None and high is not None and low < ratio < high and low > 1.0
    inverse, _, _ = _ratio([(1, 0.5, 1.0)], faster_is_higher=False)  # a step time: half the time is 2x
    assert inverse == pytest.approx(2.0)
    assert _ratio([(1, 200.0, 100.0)], True)[1:] == (None, None)  # one pair: no interval


def test_a_pair_out_of_range_is_skipped_never_an_exception() -> None:
    """Issue 53: 5e-324 / 100 underflowed to 0 (log: 'math domain error'), 1e308 / 1e-300 overflowed to inf
    (statistics.stdev: AttributeError); such pairs are not measurements and are left out of the ratio."""
    assert _ratio([(1, 5e-324, 100.0), (2, 200.0, 100.0)], True) == (pytest.approx(2.0), None, None)
    assert _ratio([(1, 1e308, 1e-300), (2, 1e308, 1e-300)], True) == (None, None, None)
    assert _ratio([(1, -5.0, 100.0), (2, math.inf, 100.0), (3, 100.0, 0.0)], False) == (None, None, None)
    ratio, low, high = _ratio([(1, 1e11, 1e-8), (2, 1e-8, 1e11)], True)  # the widest in range: no overflow either
    assert ratio == pytest.approx(1.0) and low is not None and high is not None and 0.0 <= low < 1.0 < high


# ----------------------------------------------------------------------------- end to end
def test_a_throughput_study_measures_after_warmup_confirms_and_recommends(tmp_path: Path) -> None:
    """The fast setting (micro-batch 32) against the user's slow one (2): measured steps only, a paired ratio well
    above 1, the same first update, and its speed settings from ``best --format overrides``."""
    path = _throughput_space(tmp_path, "fast", {"micro": {"key": MICRO, "type": "categorical", "choices": [32]}},
                             baseline={MICRO: 2})
    search = _cli(tmp_path, "search", "--space", str(path))
    assert search.returncode == 0, search.stderr
    assert "throughput spread over each trial's measured steps" in search.stdout
    study = load(tmp_path / "studies", "fast")
    [trial] = study.trials
    assert trial.user_attrs["throughput_steps"] == 2  # 3 steps, the first dropped
    lines = [json.loads(line) for line in (Path(trial.user_attrs["trial_dir"]) / "metrics.jsonl").read_text()
             .splitlines()]
    measured = [line["data"]["perf/throughput"] for line in lines if line["step"] > 1]
    assert trial.values[0] == pytest.approx(sum(measured) / len(measured))
    assert trial.user_attrs["first_step"]["step"] == 1 and "actor/grad_norm" in trial.user_attrs["first_step"]

    confirm = _cli(tmp_path, "confirm", "--study", "fast")
    assert confirm.returncode == 0, confirm.stderr
    runs = [t for t in load(tmp_path / "studies", "fast").trials if is_confirm(t)]
    order = [t.user_attrs["confirm_of"] if t.system_attrs.get("hpo:baseline") else "pick"
             for t in sorted(runs, key=lambda t: t.number)]
    assert order[:5] == ["baseline", "control", "pick", "pick", "baseline"]  # ABBA, the control after the first
    assert len(order) % 2 == 1  # and a seed more (its 2 runs) while not separated on a busy host (max_repeats)
    assert all(t.state == TrialState.COMPLETE for t in runs)
    assert "same math: agrees" in confirm.stdout and "recommended: trial 0" in confirm.stdout, confirm.stdout
    assert "the first step reproduces exactly; the same-math check is strict" in confirm.stdout  # verl_core
    ratio = float(confirm.stdout.split("trial 0 (micro=32): ")[1].split("x")[0])
    assert ratio > 1.5, confirm.stdout  # 16x fewer forward/backward passes in the update
    best = _cli(tmp_path, "best", "--study", "fast", "--format", "overrides")
    assert best.returncode == 0 and best.stdout.strip() == f"{MICRO}=32", (best.stdout, best.stderr)


def test_a_config_that_changes_the_math_is_reported_and_not_recommended(tmp_path: Path) -> None:
    """A key the user declared neutral that is not: the actor's mini-batch halved (two more optimizer steps inside
    the first training step, a ~10-40% change of its losses and gradient norm, issue 54 item 1). verl_core's first
    step reproduces, so the check is strict: the pick is reported with the metric and both values, and nothing is
    recommended."""
    mini = "actor_rollout_ref.actor.ppo_mini_batch_size"
    path = _throughput_space(
        tmp_path, "planted", {"mini": {"key": mini, "type": "categorical", "choices": [16]}},
        baseline={mini: 32},
        throughput={"warmup_steps": 1, "repeats": 1, "top_k": 1, "neutral_keys": [mini]})
    assert _cli(tmp_path, "search", "--space", str(path)).returncode == 0
    confirm = _cli(tmp_path, "confirm", "--study", "planted")
    assert confirm.returncode == 0, confirm.stderr
    assert "same math: DIFFERS (seed 1000: actor/" in confirm.stdout, confirm.stdout
    assert "the first step reproduces exactly; the same-math check is strict" in confirm.stdout, confirm.stdout
    assert "recommended: keep your config (no pick computes the same update" in confirm.stdout
    line = next(x for x in confirm.stdout.splitlines() if x.startswith("trial 0 (mini=16)"))
    grad = line.split("actor/grad_norm ")[1].split(";")[0].split(" vs ")
    # ~15%: a change of size, not of scale, and less than the loose check allows (LOOSE_FLOOR, 50%): the strict
    # check caught it. (The critic's loss moves by ~2.5%: reported on the builds of the tiny model before, within the
    # strict tolerance on an AMD EPYC without AVX-512, whose line named the actor's two metrics only.)
    assert 1.05 < float(grad[1]) / float(grad[0]) < 1 + LOOSE_FLOOR, line
    best = _cli(tmp_path, "best", "--study", "planted", "--format", "overrides")
    assert best.returncode == 1 and best.stdout == "", (best.stdout, best.stderr)
    assert "DIFFERS" in best.stderr
    learning = tmp_path / "learning.yaml"
    learning.write_text(yaml.safe_dump({
        "config": "tiny_arith", "params": {"lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float",
                                                   "low": 1e-6, "high": 1e-4, "log": True}},
        "study": {"speed_from": "planted"}}))
    refused = _cli(tmp_path, "search", "--space", str(learning))
    assert refused.returncode == 2 and "study.speed_from: 'planted'" in refused.stderr, refused.stderr
    assert not (tmp_path / "studies" / "learning.db").exists()


def test_a_predicted_oom_is_not_launched(tmp_path: Path) -> None:
    """Micro-batches of 512 samples of 64 tokens are estimated at ~1.3 GiB, over the trial's 1 GB cap: recorded with
    the estimate and the worst value, no process started, and the summary says how many were skipped; the other
    choice (8: ~0.6 GiB) runs. The Latin-hypercube start gives each choice one of the 2 trials."""
    path = _throughput_space(tmp_path, "oom", {"micro": {"key": MICRO, "type": "categorical", "choices": [8, 512]}},
                             n_trials=2, sampler={"type": "tpe", "seed": 0, "n_startup_trials": 2})
    raw = yaml.safe_load(path.read_text())
    raw["overrides"].update({"actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
                             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
                             "critic.ppo_micro_batch_size_per_gpu": 8, "data.max_response_length": 64})
    raw["trial"]["memory_limit_gb"] = 1.0
    path.write_text(yaml.safe_dump(raw))
    search = _cli(tmp_path, "search", "--space", str(path))
    assert search.returncode == 0, search.stderr
    by_micro = {t.params["micro"]: t for t in load(tmp_path / "studies", "oom").trials}
    trial = by_micro[512]
    assert trial.user_attrs["fail_reason"] == "predicted_oom" and trial.values == [-math.inf]
    assert "fail_reason" not in by_micro[8].user_attrs and by_micro[8].values[0] > 0
    assert trial.user_attrs["predicted_memory_gb"] > 1.0 and "exit_code" not in trial.user_attrs
    assert not (Path(trial.user_attrs["trial_dir"]) / "metrics.jsonl").exists()
    assert "memory: 1 trial(s) not launched (predicted OOM" in search.stdout
