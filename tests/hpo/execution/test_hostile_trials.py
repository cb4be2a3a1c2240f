"""Nothing a trial writes into its metrics file can break the driver (issue 20, items 1-4).

Each test runs a real driver (``python -m hpo search``) over ``tests/hpo/hostile_trainer.py``, which writes
exactly the bytes a test asks for; the bad lines must be counted and skipped, never fatal, and the study must
resume afterwards.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, load, run_cli

HOSTILE = Path(__file__).parents[1] / "hostile_trainer.py"


def hostile_space(tmp_path: Path, actions: list[dict[str, Any]], **sections: Any) -> Path:
    script = tmp_path / "actions.json"
    script.write_text(json.dumps(actions))
    return fake_space(tmp_path, name="hostile", overrides={"hostile.script": str(script)},
                      trial={"command": [PY, str(HOSTILE), "train"], **sections.pop("trial", {})},
                      study={"n_trials": 1, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3},
                      **sections)


def only_trial(studies: Path) -> Any:
    (t,) = load(studies, "hostile").trials
    return t


# ----------------------------------------------------------------------------- item 1: crashing lines
def test_lines_that_crashed_the_driver_are_skipped_and_the_study_resumes(tmp_path: Path, studies: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    space = hostile_space(tmp_path, [
        {"eval": 0, "value": 0.25},
        {"write": '{"step": 1e999, "data": {"eval/reward_mean": 0.9}}\n'},   # OverflowError in int()
        {"write": json.dumps({"step": 10**30, "data": {"eval/reward_mean": 0.9}}) + "\n"},  # SQLite overflow
        {"write": '{"step": -5, "data": {"eval/reward_mean": 0.9}}\n'},
        {"write": deep + "\n"},                                               # RecursionError
        {"write": '{"step": 3, "data": {"eval/reward_mean": 1e999}}\n'},     # a value of inf: non-finite, no crash
        {"eval": 4, "value": 0.5},
    ], diagnosis={"enabled": False})  # else the inf value is a "nan" collapse, and whether the trial is stopped
    # before step 4 is written depends on when the driver reads the file (a flaky -inf under load)
    res = run_cli(["search", "--space", str(space), "--study", "hostile"], studies)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    t = only_trial(studies)
    assert t.state.name == "COMPLETE" and t.value == 0.5, t.user_attrs
    assert t.user_attrs["metrics_bad_lines"] == 4
    assert t.user_attrs["last_step"] == 4
    assert sorted(t.intermediate_values) == [0, 4]
    res = run_cli(["resume", "--study", "hostile"], studies)  # nothing left to run, nothing crashes
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(load(studies, "hostile").trials) == 1


# ----------------------------------------------------------------------------- item 2: a FIFO
def test_a_fifo_at_the_metrics_path_fails_the_trial_instead_of_hanging_the_driver(tmp_path: Path,
                                                                                  studies: Path) -> None:
    space = hostile_space(tmp_path, [{"mkfifo": True}, {"sleep": 600}], trial={"timeout_s": 500})
    res = run_cli(["search", "--space", str(space), "--study", "hostile"], studies, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    t = only_trial(studies)
    assert t.user_attrs["fail_reason"] == "bad_metrics"
    assert "not a regular file" in t.user_attrs["error"]
    assert t.value == -math.inf
    assert t.user_attrs["wall_time_s"] < 120  # stopped at once, not at the 500 s timeout


# ----------------------------------------------------------------------------- item 3: endless lines
def test_the_driver_stays_small_while_a_trial_writes_a_huge_line(tmp_path: Path, studies: Path) -> None:
    space = hostile_space(tmp_path, [{"eval": 0, "value": 0.1}, {"fill": 200 * 2**20}, {"write": "\n"},
                                     {"eval": 1, "value": 0.75}])
    rss_file = tmp_path / "driver_maxrss_kb"
    probe = ("import runpy, sys\nout = sys.argv.pop()\n"
             "try:\n    runpy.run_module('hpo', run_name='__main__')\n"
             "finally:\n    hwm = [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')]\n"
             "    open(out, 'w').write(hwm[0])\n")
    res = subprocess.run([PY, "-c", probe, "search", "--space", str(space), "--study", "hostile", "--studies-dir",
                          str(studies), str(rss_file)], cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    t = only_trial(studies)
    assert t.value == 0.75 and t.user_attrs["metrics_bad_lines"] == 1
    peak_mb = int(rss_file.read_text()) / 1024  # the driver's own peak RSS: far below the 200 MB line it read
    assert peak_mb < 170, peak_mb


# ----------------------------------------------------------------------------- item 4: lenient values
def test_a_bool_or_string_objective_is_no_value_and_the_highest_step_is_the_last(tmp_path: Path,
                                                                                  studies: Path) -> None:
    space = hostile_space(tmp_path, [
        {"eval": 0, "value": 0.5},
        {"write": '{"step": 1, "data": {"eval/reward_mean": true}}\n'},
        {"write": '{"step": 2, "data": {"eval/reward_mean": "1e9"}}\n'},
        {"eval": 10, "value": 0.938},
        {"eval": 5, "value": 0.7},  # logged late: not the last evaluation
    ])
    res = run_cli(["search", "--space", str(space), "--study", "hostile"], studies)
    assert res.returncode == 0, res.stderr[-2000:]
    t = only_trial(studies)
    assert t.value == pytest.approx(0.938)
    assert sorted(t.intermediate_values) == [0, 10]  # the late step-5 line is kept, not reported after step 10


def test_a_truncated_metrics_file_is_read_again_from_the_start(tmp_path: Path, studies: Path) -> None:
    actions: list[dict[str, Any]] = [{"eval": s, "value": 0.1 * s} for s in range(4)]
    actions += [{"sleep": 1.5}, {"truncate": True}, {"eval": 4, "value": 0.6}, {"eval": 5, "value": 0.8}]
    space = hostile_space(tmp_path, actions)
    res = run_cli(["search", "--space", str(space), "--study", "hostile"], studies)
    assert res.returncode == 0, res.stderr[-2000:]
    t = only_trial(studies)
    assert t.value == pytest.approx(0.8)
    assert 5 in t.intermediate_values


def test_a_null_loss_as_verl_writes_nan_stops_the_trial_as_nan(tmp_path: Path, studies: Path) -> None:
    """verl's file logger writes with orjson, which turns NaN and inf into ``null``: a ``null`` for a logged key
    is non-finite, so the diagnosis sees the NaN and stops the trial (issue 21, item 5)."""
    lines = [{"write": json.dumps({"step": s, "data": {"actor/pg_loss": 0.1, "eval/reward_mean": 0.2}}) + "\n"}
             for s in range(1, 4)]
    lines += [{"write": json.dumps({"step": 4, "data": {"actor/pg_loss": None}}) + "\n"}, {"sleep": 300}]
    space = hostile_space(tmp_path, lines, trial={"timeout_s": 250})
    res = run_cli(["search", "--space", str(space), "--study", "hostile"], studies)
    assert res.returncode == 0, res.stderr[-2000:]
    t = only_trial(studies)
    assert t.user_attrs["stop_reason"] == "collapsed:nan"
    assert t.user_attrs["diagnosis_evidence"]["nan"]["metric"] == "actor/pg_loss"
    assert t.user_attrs["diagnosis_evidence"]["nan"]["step"] == 4
    assert t.user_attrs["wall_time_s"] < 120


# ----------------------------------------------------------------------------- checkpoints (issue 21, item 8)
@pytest.mark.parametrize("keep", [0, 1])
def test_finished_trials_checkpoints_are_deleted_except_the_best_k(tmp_path: Path, studies: Path, keep: int) -> None:
    space = hostile_space(tmp_path, [{"checkpoint": 3 << 20}, {"eval": 0, "value": "x"}],
                          trial={"keep_checkpoints": keep})
    res = run_cli(["search", "--space", str(space), "--study", "hostile", "--n-trials", "4"], studies)
    assert res.returncode == 0, res.stderr[-2000:]
    trials = load(studies, "hostile").trials
    assert len(trials) == 4
    left = {int(p.parent.name) for p in (studies / "hostile" / "trials").glob("*/checkpoints")}
    best = max(trials, key=lambda t: t.value)
    assert left == ({best.number} if keep else set())
    for t in trials:
        assert t.user_attrs["checkpoint_gb"] == pytest.approx(3 / 1024, rel=0.05)
    assert trials[0].user_attrs["checkpoint_kept"] == bool(keep)  # the first is the best so far
    assert not keep or best.user_attrs["checkpoint_kept"]
    assert "trial directories hold" in res.stdout
    assert all((studies / "hostile" / "trials" / str(t.number) / "metrics.jsonl").is_file() for t in trials)
