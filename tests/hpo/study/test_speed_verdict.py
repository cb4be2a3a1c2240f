"""A throughput study's verdict on a noisy host (issue 54, item 3), with tests/hpo/fake_trainer.py trials logging a
planted ``perf/throughput`` and real SQLite storage, from a directory of the user's own.

* ``confirm`` re-measures until the fastest pick separates from the user's config or ``study.throughput.max_repeats``
  seeds ran; a pick whose speed-up its interval does not support is "no setting faster than yours was found on this
  host", and ``best`` prints the user's own settings (``study.baseline``), never the pick's;
* a trial stopped at its time limit is slower than the slowest finished one (its partial rate kept), not -inf, and
  ranks below every finished trial (the summary of how busy the host was:
  ``tests/hpo/reporting/test_speed_search.py``)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import yaml
from optuna.trial import TrialState

from hpo.record import is_confirm
from tests.hpo.conftest import FAKE_TRAINER, PY, cli_env, load

NONE_FASTER = "no setting faster than yours was found on this host"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(cwd / "studies")], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=300)


def _speed_yaml(cwd: Path, name: str, params: dict[str, Any], overrides: dict[str, Any], **study: Any) -> Path:
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.test_freq": -1, "trainer.val_before_train": False, "fake.step_s": 0.0, **overrides},
        "params": params,
        "objective": {"metric": "perf/throughput", "direction": "maximize", "aggregate": "mean"},
        "study": {"kind": "throughput", "heartbeat_interval": 1, "grace_period": 3, **study},
        "trial": {"command": [PY, str(FAKE_TRAINER), "train"]},
    }
    path = cwd / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_pick_not_separated_from_yours_gives_back_your_settings(tmp_path: Path) -> None:
    """The pick (110/s) against the user's 100/s on a host whose speed moves +-30% run to run: one paired run (no
    interval), then a second seed (max_repeats 2): 1.232x [0.160, 9.486], not separated. Before: 'recommended: trial
    0, ... (no interval: 1 paired run)' and best printed the pick's fake.throughput=110.0; now the user's own 100.0
    with the verdict line."""
    path = _speed_yaml(
        tmp_path, "noisy", {"tp": {"key": "fake.throughput", "type": "categorical", "choices": [110.0]}},
        {"trainer.total_training_steps": 2, "fake.throughput_jitter": 0.3},
        n_trials=1, sampler={"type": "random", "seed": 0}, baseline={"fake.throughput": 100.0},
        throughput={"warmup_steps": 1, "repeats": 1, "max_repeats": 2, "top_k": 1, "neutral_keys": ["fake.*"]})
    search = _cli(tmp_path, "search", "--space", str(path))
    assert search.returncode == 0, search.stderr
    assert "host: other processes used " in search.stdout, search.stdout  # how busy the host was
    assert load(tmp_path / "studies", "noisy").trials[0].user_attrs["host_busy"] >= 0.0

    confirm = _cli(tmp_path, "confirm", "--study", "noisy")
    assert confirm.returncode == 0, confirm.stderr
    assert "not separated from your config: re-measuring on one more seed (2 of at most 2" in confirm.stdout, \
        confirm.stdout
    runs = [t for t in load(tmp_path / "studies", "noisy").trials if is_confirm(t)]
    assert len(runs) == 5 and all(t.state == TrialState.COMPLETE for t in runs)  # 2 seeds x 2 runs + the control
    assert sorted({t.user_attrs["confirm_seed"] for t in runs}) == [1000, 1001]
    verdict = confirm.stdout.strip().splitlines()[-1]
    assert verdict.startswith(f"recommended: keep your config ({NONE_FASTER}: the fastest, trial 0 1.232x [0.160, "
                              "9.486] over 2 paired run(s), is not separated"), verdict

    best = _cli(tmp_path, "best", "--study", "noisy", "--format", "overrides")
    assert best.returncode == 0, best.stderr
    assert best.stdout.strip() == "fake.throughput=100.0", (best.stdout, best.stderr)
    assert NONE_FASTER in best.stderr
    yaml_out = _cli(tmp_path, "best", "--study", "noisy", "--format", "yaml")
    assert yaml.safe_load(yaml_out.stdout) == {"fake": {"throughput": 100.0}}, yaml_out.stdout


def test_a_timed_out_throughput_trial_ranks_below_every_finished_one(tmp_path: Path) -> None:
    """Trial 2 (200/s) hangs at step 3 and is stopped at trial.timeout_s, after trials 0 (100/s) and 1 (400/s)
    finished: told just below the slowest finished (99.9), its partial rate (200, over its measured step) kept, last
    in the table, never the best or a pick. Before: -inf, the same as a crash. (The Latin-hypercube start of seed 0
    gives (100, 99), (400, 98), (200, 3).)"""
    path = _speed_yaml(
        tmp_path, "slow", {"tp": {"key": "fake.throughput", "type": "categorical", "choices": [100.0, 200.0, 400.0]},
                           "hang": {"key": "fake.hang_at", "type": "categorical", "choices": [3, 98, 99]}},
        {"trainer.total_training_steps": 4}, n_trials=3, sampler={"type": "tpe", "seed": 0, "n_startup_trials": 3},
        throughput={"warmup_steps": 1, "neutral_keys": ["fake.*"]})
    raw = yaml.safe_load(path.read_text())
    raw["trial"]["timeout_s"] = 6
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    search = _cli(tmp_path, "search", "--space", str(path))
    assert search.returncode == 0, search.stderr
    trials = {t.number: t for t in load(tmp_path / "studies", "slow").trials}
    assert [(t.params["tp"], t.params["hang"]) for t in trials.values()] == [(100.0, 99), (400.0, 98), (200.0, 3)]
    slow, finished = trials[2], [trials[0], trials[1]]
    assert slow.user_attrs["fail_reason"] == "timeout" and slow.user_attrs["timeout_rate"] == 200.0
    assert math.isfinite(slow.values[0]) and slow.values[0] == 100.0 * (1 - 1e-3)
    assert all(slow.values[0] < t.values[0] for t in finished)
    lines = search.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["trial"] and "outcome" in line)
    rows = [line.split() for line in lines[head + 1:head + 4]]
    assert [(r[0], r[2]) for r in rows] == [("1", "ok"), ("0", "ok"), ("2", "timeout")], search.stdout
    assert "timed out: trial(s) 2 (200 over its measured steps)" in search.stdout, search.stdout
    best = _cli(tmp_path, "best", "--study", "slow", "--format", "overrides")
    assert best.returncode == 0 and best.stdout.strip() == "fake.throughput=400.0 fake.hang_at=98", best.stdout
