"""What a trial is launched with beyond its backend's part (``hpo/study/_trial_files.py``): its own fresh directory
(never one the driver did not make), the driver's environment with every secret in it (never on argv), the files
recording the launch with secrets masked, and the experiment's one-off prepare step (exit 2: the experiment's fault,
one line; another failure: the driver's, naming its log)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from hpo.backends import TrialConfig, load_space
from hpo.execution import ENV_STUDY, ENV_TRIAL
from hpo.experiment import SpaceError
from hpo.study import DriverError
from hpo.study._checkpoints import TRIAL_MARKER
from hpo.study._trial_files import fresh_trial_dir, launch_extra, prepare, trial_env, write_trial_files
from tests.hpo.conftest import fake_space
from tests.hpo.study.test_trial import Recorded

ME = {"host": "here", "pid": 1}


def test_a_trial_directory_is_fresh_and_only_the_driver_s_own_is_replaced(tmp_path: Path) -> None:
    trials = tmp_path / "trials"
    first = fresh_trial_dir(trials, "s", 3, ME)
    assert json.loads((first / TRIAL_MARKER).read_text()) == {"study": "s", "trial": 3, "driver": ME}
    (first / "metrics.jsonl").write_text("{}\n")  # an earlier attempt's leftover: replaced
    again = fresh_trial_dir(trials, "s", 3, ME)
    assert again == first and sorted(p.name for p in again.iterdir()) == [TRIAL_MARKER]
    mine = trials / "4"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    with pytest.raises(DriverError, match=f"{mine} exists and was not created by verl-hpo; move it away to run "
                                          "trial 4"):
        fresh_trial_dir(trials, "s", 4, ME)
    (trials / "5").symlink_to(mine)  # a link, even to a directory holding a marker, is not the driver's
    (mine / TRIAL_MARKER).write_text("{}")
    with pytest.raises(DriverError):
        fresh_trial_dir(trials, "s", 5, ME)
    assert (mine / "notes.txt").read_text() == "the user's"


def test_secrets_reach_the_trial_in_its_environment_and_its_files_mask_them(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, "fake.api_token": "t0k",
                                                           "fake.step_s": 0.01},
                                      trial={"env": {"MY_PASSWORD": "pw", "MY_FLAG": "1"}})), check=False)
    extra = launch_extra({"trainer.seed": 1001, "fake.hub_token": "h1"})  # a run's own secret: a reference on argv
    assert extra == {"trainer.seed": 1001, "fake.hub_token": "${oc.env:VERL_HPO_SECRET_FAKE_HUB_TOKEN}"}
    env = trial_env(space, "s", 7, ME, ["0", "2"], {"trainer.seed": 1001, "fake.hub_token": "h1"})
    assert env["VERL_HPO_SECRET_FAKE_API_TOKEN"] == "t0k" and env["VERL_HPO_SECRET_FAKE_HUB_TOKEN"] == "h1"
    assert env["MY_PASSWORD"] == "pw" and env["MY_FLAG"] == "1"
    assert (env["CUDA_VISIBLE_DEVICES"], env[ENV_STUDY], env[ENV_TRIAL]) == ("0,2", "s", "7")
    trial_dir = fresh_trial_dir(tmp_path / "trials", "s", 7, ME)
    argv = ["python", "train.py", "fake.api_token=${oc.env:VERL_HPO_SECRET_FAKE_API_TOKEN}"]
    write_trial_files(space, "/work", trial_dir, argv, env, TrialConfig([], 4, "fake.x: 0.5\n"), {"x": 0.5})
    command = json.loads((trial_dir / "command.json").read_text())
    assert command["argv"] == argv and command["cwd"] == "/work"
    assert command["env"] == {"CUDA_VISIBLE_DEVICES": "0,2", "MY_PASSWORD": "***", "MY_FLAG": "1"}
    assert json.loads((trial_dir / "params.json").read_text()) == {"x": 0.5}
    assert (trial_dir / "config.yaml").read_text() == "fake.x: 0.5\n"
    assert not any(secret in p.read_text() for p in trial_dir.iterdir() for secret in ("t0k", "h1", "pw"))


def _prepare_with(tmp_path: Path, script: str) -> tuple[Recorded, Path]:
    step = tmp_path / "prepare.py"
    step.write_text(script)
    space = load_space(str(fake_space(tmp_path, trial={"prepare_command": [sys.executable, str(step)]})),
                       check=False)
    progress = Recorded()
    prepare(space, tmp_path / "study", str(tmp_path), progress, threading.Event())
    return progress, tmp_path / "study" / "prepare"


def test_the_prepare_step_runs_with_the_experiment_s_config_logged_in_the_study_s_directory(tmp_path: Path) -> None:
    progress, logs = _prepare_with(tmp_path, "import pathlib; pathlib.Path('made').write_text('x'); print('built')")
    assert (tmp_path / "made").read_text() == "x" and "built" in (logs / "stdout.log").read_text()
    (call, line), = progress.calls
    assert call == "note" and line.startswith(f"preparing model and data: {tmp_path / 'prepare.py'} --config "
                                              "tiny_arith trainer.total_training_steps=10"), line


def test_a_prepare_step_that_fails_is_one_line_its_exit_saying_whose_fault(tmp_path: Path) -> None:
    bad = "import sys; print('error: data.path: no such file', file=sys.stderr); sys.exit({})"
    with pytest.raises(SpaceError) as err:
        _prepare_with(tmp_path, bad.format(2))
    assert str(err.value) == "prepare failed: error: data.path: no such file"
    with pytest.raises(DriverError) as broke:
        _prepare_with(tmp_path, bad.format(1))
    assert str(broke.value) == (f"prepare failed (exit 1): error: data.path: no such file; see "
                                f"{tmp_path / 'study' / 'prepare'}/stderr.log")
