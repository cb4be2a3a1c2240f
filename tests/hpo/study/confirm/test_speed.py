"""A throughput study's re-measurement killed half-way (issue 53 item 11): its retry must not be paired with a run
of the user's config made minutes (or, after a resumed kill, hours) earlier. The seed's block (the user's config and
the pick on that seed) is re-made whole after the rest, the retry in the killed run's place, so the runs the report
pairs (the newest of each config on a seed) ran back to back. Through the real CLI, from a directory of the user's
own, with tests/hpo/fake_trainer.py logging a planted ``perf/throughput`` and real SQLite storage."""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, is_confirm
from tests.hpo.conftest import FAKE_TRAINER, PY, cli_env, load

CONTROL_OF = -2  # hpo.study._confirm: the control's hpo:confirm_of


def _cli(cwd: Path, *args: str) -> list[str]:
    return [PY, "-m", "hpo", *args, "--studies-dir", str(cwd / "studies")]


def _space(cwd: Path, held: int) -> Path:
    """The fake trainer's throughput study (2 steps, the first warm-up): one pick (400/s) against the user's 100/s;
    every run from the ``held``-th finished one on holds at step 1 while ``gate`` exists."""
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 2, "trainer.test_freq": -1, "trainer.val_before_train": False,
                      "fake.step_s": 0.0, "fake.log_file": str(cwd / "runs.jsonl"), "fake.gate_at": 1,
                      "fake.gate_file": str(cwd / "gate"), "fake.gate_from_run": held},
        "params": {"tp": {"key": "fake.throughput", "type": "categorical", "choices": [400.0]}},
        "objective": {"metric": "perf/throughput", "direction": "maximize", "aggregate": "mean"},
        "study": {"kind": "throughput", "n_trials": 1, "sampler": {"type": "random", "seed": 0},
                  "baseline": {"fake.throughput": 100.0}, "heartbeat_interval": 1, "grace_period": 3,
                  "throughput": {"warmup_steps": 1, "repeats": 2, "top_k": 1, "neutral_keys": ["fake.*"]}},
        "trial": {"command": [PY, str(FAKE_TRAINER), "train"]},
    }
    path = cwd / "speed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _held_run(cwd: Path, proc: subprocess.Popen[str], number: int) -> FrozenTrial:
    """Trial ``number`` (held at its gate), once it runs."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        running = [t for t in load(cwd / "studies", "speed").get_trials(states=(TrialState.RUNNING,))
                   if t.number == number]
        if running:
            return running[0]
        time.sleep(0.1)
    raise AssertionError(f"trial {number} never ran: {proc.poll()=}")


def _what(t: FrozenTrial) -> str:
    of = t.system_attrs[ATTR_CONFIRM_OF]
    return "control" if of == CONTROL_OF else "yours" if t.system_attrs.get(ATTR_BASELINE) else "pick"


# The confirmation runs #1 yours (seed 1000), #2 the control, #3 the pick (1000), #4 the pick (1001), #5 yours (1001).
@pytest.mark.parametrize("held, killed_is, n_done", [
    (1, "yours", 5),  # the first of its block: the pick on its seed still waits (it must not run: its partner is gone)
    (3, "pick", 6),  # the second of its block: the user's config on its seed ran before the kill (it must run again)
])
def test_a_killed_re_measurement_is_re_made_with_its_seeds_block(tmp_path: Path, held: int, killed_is: str,
                                                                  n_done: int) -> None:
    search = subprocess.run(_cli(tmp_path, "search", "--space", str(_space(tmp_path, held))), cwd=tmp_path,
                            env=cli_env(), capture_output=True, text=True, timeout=120)
    assert search.returncode == 0, search.stderr
    (tmp_path / "gate").touch()
    first = subprocess.Popen(_cli(tmp_path, "confirm", "--study", "speed"), cwd=tmp_path, env=cli_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        killed = _held_run(tmp_path, first, held)  # the held-th finished run is trial #held's start
        first.send_signal(signal.SIGTERM)  # the driver stops: the held run is killed, its retry queued
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert _what(killed) == killed_is and "Traceback" not in err, err
    (tmp_path / "gate").unlink()
    again = subprocess.run(_cli(tmp_path, "confirm", "--study", "speed"), cwd=tmp_path, env=cli_env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr

    runs = sorted((t for t in load(tmp_path / "studies", "speed").trials if is_confirm(t)), key=lambda t: t.number)
    seed = killed.system_attrs[ATTR_CONFIRM_SEED]
    done = [t for t in runs if t.state == TrialState.COMPLETE]
    newest = {(_what(t), t.system_attrs[ATTR_CONFIRM_SEED]): t for t in done}  # what the report pairs
    yours, pick = newest[("yours", seed)], newest[("pick", seed)]
    assert min(yours.number, pick.number) > killed.number  # neither was made before the kill
    retry = yours if killed_is == "yours" else pick
    assert retry.user_attrs.get("retry_of") == killed.number
    by_start = sorted(done, key=lambda t: t.datetime_start or datetime.min)  # a finished run has its start
    assert by_start.index(pick) == by_start.index(yours) + 1, [(t.number, _what(t)) for t in by_start]  # ABBA order
    for t in runs:  # nothing else failed; an old run of the block still waiting never ran
        assert t.state == TrialState.COMPLETE or t.number == killed.number or (
            t.user_attrs.get("stop_reason") == "surplus" and "trial_dir" not in t.user_attrs), (t.number, t.state)
    assert len(done) == n_done  # the 5 runs and the 2 of the re-made block, less the one killed and any surplus
    assert "same math: agrees" in again.stdout and "4.000x" in again.stdout, again.stdout
