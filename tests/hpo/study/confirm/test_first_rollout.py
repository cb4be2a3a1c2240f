"""A throughput study's first rollout recorded once per seed and replayed into the seed's other runs (issue 54 item
1): the same-math check is then strict, and a 10% change of the update that the study declares neutral is caught;
without the replay (a trainer that does not honour it, samples differing run to run) the loose check lets it pass.
Through the real CLI from a directory of the user's own, with tests/hpo/fake_trainer.py, whose step-1 gradient norm
moves by +-30% with its "rollout" unless it replays a recorded one (as verl's in-process module does), and real
SQLite storage. Real verl's replay: tests/hpo/backends/verl/test_real.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from hpo.study._confirm._first_rollout import ATTR, first_rollout, record_dir, report_dir
from tests.hpo.conftest import FAKE_TRAINER, PY, cli_env, load


def _study(cwd: Path, grad_scale: float, ignore: bool) -> subprocess.CompletedProcess[str]:
    """Search (one pick, 4x faster, its update scaled by ``grad_scale`` under a key declared neutral), then confirm
    on 2 seeds; the confirm's output."""
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 2, "trainer.test_freq": -1, "trainer.val_before_train": False,
                      "fake.step_s": 0.0, "fake.rollout_noise": 0.3,
                      "fake.ignore_first_rollout": "true" if ignore else "false"},
        "params": {"tp": {"key": "fake.throughput", "type": "categorical", "choices": [400.0]},
                   "scale": {"key": "fake.grad_scale", "type": "categorical", "choices": [grad_scale]}},
        "objective": {"metric": "perf/throughput", "direction": "maximize", "aggregate": "mean"},
        "study": {"kind": "throughput", "n_trials": 1, "sampler": {"type": "random", "seed": 0},
                  "baseline": {"fake.throughput": 100.0, "fake.grad_scale": 1.0},
                  "throughput": {"warmup_steps": 1, "repeats": 2, "max_repeats": 2, "top_k": 1,
                                 "neutral_keys": ["fake.*"]}},
        "trial": {"command": [PY, str(FAKE_TRAINER), "train"]},
    }
    (cwd / "speed.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for args in (["search", "--space", "speed.yaml"], ["confirm", "--study", "speed"]):
        proc = subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(cwd / "studies")], cwd=cwd,
                              env=cli_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_a_replayed_first_rollout_makes_the_check_strict(tmp_path: Path) -> None:
    """A pick that scales the update by 1.1 under a key the study declares neutral: caught on both seeds (a pick
    of the same update agreeing: tests/hpo/reporting/test_speed.py)."""
    out = _study(tmp_path, 1.1, ignore=False).stdout
    runs = [t for t in load(tmp_path / "studies", "speed").get_trials() if ATTR in t.user_attrs]
    modes = sorted(t.user_attrs[ATTR]["mode"] for t in runs)
    assert modes == ["recorded", "recorded", "replayed", "replayed", "replayed"], modes  # 2 seeds, control on one
    recorders = {t.number for t in runs if t.user_attrs[ATTR]["mode"] == "recorded"}
    assert {t.user_attrs[ATTR]["source"] for t in runs if t.user_attrs[ATTR]["mode"] == "replayed"} <= recorders
    assert "the second replaying the first's recorded first rollout" in out, out
    assert "(strict on 2 of 2 seed(s): one recorded first rollout replayed)" in out, out
    assert "same math: DIFFERS (seed 1000: actor/grad_norm" in out and "seed 1001: actor/grad_norm" in out, out
    assert "recommended: keep your config (no pick computes the same update" in out, out


def test_without_the_replay_the_loose_check_misses_a_10_percent_change(tmp_path: Path) -> None:
    """The reason for the replay: a trainer whose first step moves +-30% run to run gets the loose check (it
    catches a change of scale), and a pick that changes the update by 10% passes it."""
    out = _study(tmp_path, 1.1, ignore=True).stdout
    runs = [t for t in load(tmp_path / "studies", "speed").get_trials() if ATTR in t.user_attrs]
    assert runs and {t.user_attrs[ATTR]["mode"] for t in runs} == {"sampled"}
    assert "so the same-math check is loose" in out and "strict on" not in out, out


def test_a_run_s_report_is_read_as_untrusted(tmp_path: Path) -> None:
    """What a trial leaves in its report directory can be anything: only small regular JSON files of sane counts
    are summed (a FIFO, a link to /dev/zero, a huge file, a negative or boolean count are skipped), and a run that
    asked for a replay but answered a request from its engine is 'sampled'."""
    trial = tmp_path / "7"
    reports = report_dir(trial)
    reports.mkdir(parents=True)
    (reports / "1.json").write_text(json.dumps({"replayed": 6, "missed": 0}))
    (reports / "2.json").write_text(json.dumps({"replayed": 2, "recorded": True, "missed": -4}))
    (reports / "3.json").write_text(json.dumps({"replayed": 10**12}))
    (reports / "4.json").write_text(" " * 5000 + "{}")
    (reports / "5.json").symlink_to("/dev/zero")
    os.mkfifo(reports / "6.json")
    (reports / "7.json").write_text("not json")
    got = first_rollout(trial, source=3, asked=True)
    assert got == {"mode": "replayed", "source": 3, "recorded": 0, "replayed": 8, "missed": 0}, got
    (reports / "8.json").write_text(json.dumps({"missed": 1}))
    assert first_rollout(trial, source=3, asked=True)["mode"] == "sampled"
    assert first_rollout(trial, source=None, asked=False) is None
    assert first_rollout(tmp_path / "none", source=None, asked=True)["mode"] == "sampled"  # nothing reported
    assert record_dir(trial) == trial / "first-rollout" / "record"
