"""A throughput study's values and confirmation as a learning study may trust them (``study.speed_from``:
``hpo/reporting/_speed_from.py``; issue 53, items 5, 9 and 11's ``--devices``), with tests/hpo/fake_trainer.py trials
logging a planted ``perf/throughput`` and real SQLite storage.

Item 5: a throughput outside (0, bound) is not a measurement: the trial is recorded failed (worst value, a reason),
never ``COMPLETE inf``; stored values an attacker planted (5e-324, 1e308, negative, inf) are skipped with a note by
``confirm``, ``best`` and ``study.speed_from``, never a traceback. Item 9: ``speed_from`` only from a complete
confirmation (separated, same math, its paired runs all there), checked by ``validate``, re-checked by ``resume``.
What ``--devices`` takes: ``tests/hpo/commands/test_study.py``."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from tests.hpo.conftest import FAKE_TRAINER, PY, cli_env, load

BASELINE_OF = -1  # hpo.study._confirm: a baseline run's hpo:confirm_of
FAST, SLOW = 400.0, 100.0  # the pick's and the user's config's planted throughput: 4x


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(cwd / "studies")], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=120)


def _no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


def _speed_yaml(cwd: Path, choices: list[float], name: str = "speed") -> Path:
    """A throughput study of the fake trainer: its speed knob is the throughput it logs (2 steps, the first warm-up)."""
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 2, "trainer.test_freq": -1, "trainer.val_before_train": False,
                      "fake.step_s": 0.0},
        "params": {"tp": {"key": "fake.throughput", "type": "categorical", "choices": choices}},
        "objective": {"metric": "perf/throughput", "direction": "maximize", "aggregate": "mean"},
        "study": {"kind": "throughput", "n_trials": 1, "sampler": {"type": "random", "seed": 0},
                  "baseline": {"fake.throughput": SLOW}, "heartbeat_interval": 1, "grace_period": 3,
                  "throughput": {"warmup_steps": 1, "repeats": 2, "top_k": 1, "neutral_keys": ["fake.*"]}},
        "trial": {"command": [PY, str(FAKE_TRAINER), "train"]},
    }
    path = cwd / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _learning_yaml(cwd: Path, speed_from: str = "speed") -> Path:
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 2, "trainer.test_freq": 1, "fake.step_s": 0.0,
                      "fake.throughput": SLOW},
        "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 1, "pruner": {"type": "none"}, "speed_from": speed_from, "heartbeat_interval": 1,
                  "grace_period": 3},
        "trial": {"command": [PY, str(FAKE_TRAINER), "train"]},
    }
    path = cwd / "learning.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A searched throughput study (``searched.db``: its one trial, 400/s) and the same study confirmed for real
    (``studies/speed.db``: 4.000x [4.000, 4.000] over 2 paired runs, same math)."""
    cwd = tmp_path_factory.mktemp("speed_home")
    search = _cli(cwd, "search", "--space", str(_speed_yaml(cwd, [FAST])))
    assert search.returncode == 0, search.stderr
    shutil.copy(cwd / "studies" / "speed.db", cwd / "searched.db")
    confirm = _cli(cwd, "confirm", "--study", "speed")
    assert confirm.returncode == 0, confirm.stderr
    assert "4.000x your config's speed [4.000, 4.000] (95%, 2 paired runs)" in confirm.stdout, confirm.stdout
    return cwd


def _copy(home: Path, cwd: Path, db: str = "studies/speed.db") -> optuna.Study:
    (cwd / "studies").mkdir(exist_ok=True)
    shutil.copy(home / db, cwd / "studies" / "speed.db")
    return load(cwd / "studies", "speed")


def _plant(study: optuna.Study, of: int, seed: int, value: float | None, first_step: dict[str, Any] | None = None,
           state: TrialState = TrialState.COMPLETE) -> None:
    """A confirmation run as a storage could hold it (the newest run of (of, seed) is the one read)."""
    pick = study.trials[0]
    attrs: dict[str, Any] = {ATTR_CONFIRM_OF: of, ATTR_CONFIRM_SEED: seed}
    if of == BASELINE_OF:
        attrs[ATTR_BASELINE] = True
    study.add_trial(optuna.create_trial(
        state=state, value=value if state == TrialState.COMPLETE else None,
        params={} if of == BASELINE_OF else pick.params, distributions={} if of == BASELINE_OF else pick.distributions,
        user_attrs={"first_step": first_step or pick.user_attrs["first_step"]}, system_attrs=attrs))


# ----------------------------------------------------------------------------- item 5: recording
def test_a_throughput_out_of_range_is_recorded_as_a_failed_measurement(tmp_path: Path) -> None:
    """Before: COMPLETE with the value logged (1e308 ranked fastest, 5e-324 and -5 as measurements). After: each
    the worst value with fail_reason bad_metrics and the reason. (The Latin-hypercube start gives each choice one of
    the 3 trials.)"""
    path = _speed_yaml(tmp_path, [5e-324, 1e308, -5.0])
    raw = yaml.safe_load(path.read_text())
    raw["study"].update(n_trials=3, sampler={"type": "tpe", "seed": 0, "n_startup_trials": 3})
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    proc = _cli(tmp_path, "search", "--space", str(path))
    _no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    trials = load(tmp_path / "studies", "speed").trials
    assert sorted(t.params["tp"] for t in trials) == [-5.0, 5e-324, 1e308]
    for trial in trials:
        assert trial.values == [-math.inf], (trial.params, trial.values)
        assert trial.user_attrs["fail_reason"] == "bad_metrics"
        assert "perf/throughput" in trial.user_attrs["error"] and "not a valid measurement" in trial.user_attrs["error"]


# ----------------------------------------------------------------------------- item 5: stored values
def test_planted_throughput_values_are_skipped_by_confirm_best_and_speed_from(home: Path, tmp_path: Path) -> None:
    """Runs a storage could hold: the pick at 5e-324 (5e-324 / 100 underflows to 0: 'math domain error' before),
    1e308 against the user's 1e-300 (an infinite ratio: statistics.stdev's AttributeError before), -5 and inf (taken
    as failed runs before, silently). Each is skipped with a note, and speed_from refuses in one line."""
    study = _copy(home, tmp_path)
    for of, seed, value in [(0, 1000, 5e-324), (0, 1001, 1e308), (BASELINE_OF, 1001, 1e-300), (0, 1002, -5.0),
                            (BASELINE_OF, 1002, SLOW), (0, 1003, math.inf), (BASELINE_OF, 1003, SLOW)]:
        _plant(study, of, seed, value)
    confirm = _cli(tmp_path, "confirm", "--study", "speed")
    _no_traceback(confirm)
    assert confirm.returncode == 0, confirm.stderr
    assert "trial 0 (tp=400.0): no valid paired run; 4 run(s) out of range (not a valid measurement), skipped" \
        in confirm.stdout, confirm.stdout
    assert "user's config: perf/throughput 100 over 3 run(s); 1 run(s) out of range" in confirm.stdout
    best = _cli(tmp_path, "best", "--study", "speed", "--format", "overrides")
    _no_traceback(best)
    assert best.returncode == 1 and "out of range (not a valid measurement), skipped" in best.stderr, best.stderr
    learning = _cli(tmp_path, "search", "--space", str(_learning_yaml(tmp_path)))
    _no_traceback(learning)
    lines = learning.stderr.strip().splitlines()
    assert learning.returncode == 2 and len(lines) == 1, learning.stderr
    assert "study.speed_from: 'speed'" in lines[0] and "no pick has a valid paired run" in lines[0], lines[0]
    assert not (tmp_path / "studies" / "learning.db").exists()


# ----------------------------------------------------------------------------- item 9: a complete confirmation only
def test_a_half_killed_confirmation_is_not_trusted_by_speed_from_or_validate(home: Path, tmp_path: Path) -> None:
    """A confirm killed after its first seed: one paired run (4.000x, no interval) and the rest still queued."""
    study = _copy(home, tmp_path, "searched.db")
    _plant(study, BASELINE_OF, 1000, SLOW)
    _plant(study, -2, 1000, SLOW)  # the control
    _plant(study, 0, 1000, FAST)
    for of in (0, BASELINE_OF):
        _plant(study, of, 1001, None, state=TrialState.WAITING)
    path = _learning_yaml(tmp_path)
    for cmd in ("search", "validate"):
        proc = _cli(tmp_path, cmd, "--space", str(path))
        _no_traceback(proc)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (cmd, proc.stdout, proc.stderr)
        assert f"{path}: study.speed_from: 'speed'" in lines[0] and "not complete" in lines[0], lines[0]
        assert "1 of 2 paired run(s)" in lines[0] and "2 run(s) still to run" in lines[0], lines[0]
    assert not (tmp_path / "studies" / "learning.db").exists()


def test_validate_checks_speed_from(home: Path, tmp_path: Path) -> None:
    """The named study must exist (and nothing is created looking for it), be a throughput study and have a
    complete confirmation; a complete one validates."""
    _copy(home, tmp_path)
    ok = _cli(tmp_path, "validate", "--space", str(_learning_yaml(tmp_path)))
    assert ok.returncode == 0, ok.stderr
    missing = _cli(tmp_path, "validate", "--space", str(_learning_yaml(tmp_path, "nope")))
    assert missing.returncode == 2 and "study.speed_from: 'nope'" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and not (tmp_path / "studies" / "nope.db").exists()
    shutil.copy(tmp_path / "studies" / "speed.db", tmp_path / "studies" / "other.db")  # a learning study's storage
    learning = load(tmp_path / "studies", "speed")
    raw = dict(learning.user_attrs["hpo:space"])
    raw["study"] = {**raw["study"], "kind": "learning"}
    optuna.copy_study(from_study_name="speed", from_storage=f"sqlite:///{tmp_path / 'studies' / 'speed.db'}",
                      to_storage=f"sqlite:///{tmp_path / 'studies' / 'other.db'}", to_study_name="other")
    load(tmp_path / "studies", "other").set_user_attr("hpo:space", raw)
    other = _cli(tmp_path, "validate", "--space", str(_learning_yaml(tmp_path, "other")))
    assert other.returncode == 2 and "is not a throughput study" in other.stderr, other.stderr
    clash = _learning_yaml(tmp_path)  # a learning study that tunes the key the speed study sets
    raw = yaml.safe_load(clash.read_text())
    raw["params"]["tp"] = {"key": "fake.throughput", "type": "categorical", "choices": [100.0, 200.0]}
    del raw["overrides"]["fake.throughput"]
    clash.write_text(yaml.safe_dump(raw))
    refused = _cli(tmp_path, "validate", "--space", str(clash))
    assert refused.returncode == 2 and "which this study tunes (params.tp)" in refused.stderr, refused.stderr


def test_resume_says_when_the_source_withdrew_its_settings_and_runs_without_them(home: Path, tmp_path: Path) -> None:
    """The learning study runs with the source's 400; the source's confirm then finds the pick's math DIFFERS on a
    new seed: resume says so in one line and its trials run the user's own value (100)."""
    study = _copy(home, tmp_path)
    search = _cli(tmp_path, "search", "--space", str(_learning_yaml(tmp_path)))
    assert search.returncode == 0, search.stderr
    note = next(line for line in search.stdout.splitlines() if line.startswith("speed settings from"))
    assert "throughput study speed (trial 0, same math as your config, 4.000x [4.000, 4.000]" in note, note
    assert "fake.throughput=400.0; replacing fake.throughput=100.0" in note and "~75% less time" in note, note
    assert load(tmp_path / "studies", "learning").user_attrs["speed_from"]["settings"] == {"fake.throughput": "400.0"}

    def argv(trial: optuna.trial.FrozenTrial) -> list[str]:
        return list(json.loads((Path(trial.user_attrs["trial_dir"]) / "command.json").read_text())["argv"])

    assert "fake.throughput=400.0" in argv(load(tmp_path / "studies", "learning").trials[0])
    first = dict(study.trials[0].user_attrs["first_step"])
    _plant(study, BASELINE_OF, 1002, SLOW)
    _plant(study, 0, 1002, FAST, {**first, "actor/pg_loss": 5.0})  # a different first update on a new seed
    resume = _cli(tmp_path, "resume", "--study", "learning", "--n-trials", "2", "--trust-stored-experiment")
    _no_traceback(resume)
    assert resume.returncode == 0, resume.stderr
    said = [line for line in resume.stdout.splitlines() if "study.speed_from" in line]
    assert len(said) == 1 and "no longer recommends" in said[0] and "fake.throughput=400.0" in said[0], said
    assert "DIFFERS" in said[0] and "fake.throughput=100.0" in said[0], said[0]
    trials = load(tmp_path / "studies", "learning").trials
    assert len(trials) == 2 and "fake.throughput=100.0" in argv(trials[1]), argv(trials[1])
    assert "fake.throughput=400.0" not in argv(trials[1])


# ----------------------------------------------------------------------------- item 11: --devices
def test_devices_that_are_not_gpu_ids_are_refused(home: Path, tmp_path: Path) -> None:
    """Before: ``--devices a,b`` ran the worker with CUDA_VISIBLE_DEVICES=a (no GPU at all for CUDA)."""
    _copy(home, tmp_path)
    proc = _cli(tmp_path, "worker", "--study", "speed", "--devices", "a,b", "--trust-stored-experiment")
    _no_traceback(proc)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--devices 'a,b'" in lines[0], proc.stderr
