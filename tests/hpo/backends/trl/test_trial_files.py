"""What a TRL study reads that is not the driver's own, from a directory of the user's (issue 53, items 1, 4, 11):

* a real study whose driver died while its trial ran: the trial's newest ``trainer_state.json`` is then a FIFO, the
  one before a link to ``/dev/zero``. ``resume`` neither hangs nor dies: the retry continues from the checkpoint
  before those, with one line naming them (``command.json`` and the other files of a trial's directory:
  tests/hpo/backends/test_replay.py);
* the experiment's ``config:`` as a FIFO, ``/dev/zero``, a link to it or a huge file: one line naming it, exit 2;
* an experiment file that is a symbolic link reads its relative ``config:`` beside the real file, as verl does;
* a worker given the experiment file (``--space``) reads its relative ``config:`` beside that file, as ``search``
  does, from any working directory;
* ``resume`` and ``worker`` find ``--space`` as ``search`` does: a name in ``$VERL_HPO_SPACES_DIR`` (else
  ``./search_spaces``, then the shipped ones) as well as a path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from hpo.backends import load_space
from hpo.record import ATTR_SOURCE
from hpo.study._optuna import open_study
from tests.hpo.conftest import ROOT, cli_env

CONFIG = ROOT / "search_spaces" / "trl_configs" / "grpo_arith.yaml"
EXPERIMENT = {
    "config": "grpo.yaml",
    "overrides": {"max_steps": 6, "eval_steps": 2, "save_steps": 2, "save_total_limit": None, "seed": 1},
    "params": {"learning_rate": {"key": "learning_rate", "type": "float", "low": 1.0e-4, "high": 2.0e-4}},
    "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
    "early_stopping": {"enabled": False},
    "study": {"n_trials": 1, "sampler": {"type": "random", "seed": 0}, "pruner": {"type": "none"}},
    "trial": {"backend": "trl", "n_jobs": 1, "gpus_per_trial": 0, "timeout_s": 200},
}


def _experiment(folder: Path, config: str = "grpo.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grpo.yaml").write_text(CONFIG.read_text())
    (folder / "exp.yaml").write_text(yaml.safe_dump({**EXPERIMENT, "config": config}, sort_keys=False))
    return folder / "exp.yaml"


def _hpo(cwd: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpo", *args], cwd=cwd, env=cli_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def _wait_for(what: Callable[[], bool], timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


@pytest.fixture(scope="module")
def died(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A study of one real TRL trial (6 steps, a checkpoint every 2) whose driver was stopped while it ran and killed
    once it had saved checkpoint-6: the trial RUNNING with checkpoint-2, -4 and -6, a retry due."""
    cwd = tmp_path_factory.mktemp("user")
    _experiment(cwd)  # a relative config: resume --space exp.yaml reads it beside exp.yaml, as search did
    trials = cwd / "studies" / "exp" / "trials"
    with (cwd / "search.log").open("wb") as log:
        driver = subprocess.Popen([sys.executable, "-m", "hpo", "search", "--space", "exp.yaml", "--studies-dir",
                                   str(cwd / "studies")], cwd=cwd, env=cli_env(), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _wait_for(lambda: (trials / "0" / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists()
                  or driver.poll() is not None, 240, "no checkpoint-2")
        os.kill(driver.pid, signal.SIGSTOP)  # the trial trains on; its driver records nothing more
        assert driver.poll() is None, (cwd / "search.log").read_text()[-3000:]
        _wait_for(lambda: (trials / "0" / "checkpoints" / "checkpoint-6" / "trainer_state.json").exists(), 240,
                  "the trial did not save checkpoint-6")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    return cwd


def test_resume_passes_over_checkpoints_a_trial_replaced(died: Path) -> None:
    checkpoints = died / "studies" / "exp" / "trials" / "0" / "checkpoints"
    fifo = checkpoints / "checkpoint-6" / "trainer_state.json"
    fifo.unlink()
    os.mkfifo(fifo)  # before: every resume and worker hung in open(), deaf to SIGTERM
    zero = checkpoints / "checkpoint-4" / "trainer_state.json"
    zero.unlink()
    zero.symlink_to("/dev/zero")  # before: read until MemoryError, a traceback
    res = _hpo(died, "resume", "--study", "exp", "--space", "exp.yaml", "--studies-dir", str(died / "studies"),
               timeout=200)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in out, out[-4000:]  # no hang (the timeout), no MemoryError
    study = optuna.load_study(study_name="exp", storage=f"sqlite:///{died / 'studies' / 'exp.db'}")
    retry = next(t for t in study.trials if t.user_attrs.get("retry_of") == 0)
    assert retry.state.name == "COMPLETE"
    assert retry.user_attrs["resumed_from_step"] == 2  # checkpoint-6 and -4 lost, checkpoint-2 good
    lines = [line for line in out.splitlines() if "not used:" in line]
    assert len(lines) == 1, out[-4000:]
    assert lines[0].startswith(f"trial {retry.number}: {fifo.parent} not used: {fifo}: is a FIFO, not a regular file")
    assert lines[0].endswith(f"(and 1 more); the retry continues from {checkpoints / 'checkpoint-2'}"), lines[0]


def _fifo(d: Path) -> str:
    os.mkfifo(d / "c.yaml")
    return str(d / "c.yaml")


def _link_to_zero(d: Path) -> str:
    (d / "c.yaml").symlink_to("/dev/zero")
    return str(d / "c.yaml")


def _huge(d: Path) -> str:
    with (d / "c.yaml").open("wb") as f:
        f.truncate(8 << 30)  # sparse: nothing of it may be read
    return str(d / "c.yaml")


CONFIGS: dict[str, tuple[Callable[[Path], str], str]] = {
    "a FIFO": (_fifo, "is a FIFO, not a regular file"),
    "/dev/zero": (lambda d: "/dev/zero", "is a character device, not a regular file"),
    "a link to /dev/zero": (_link_to_zero, "is a character device, not a regular file"),
    "a huge file": (_huge, "bytes; at most 1048576 are read"),
}


@pytest.mark.parametrize(("kind", "command"), [(k, "validate") for k in CONFIGS] + [("a FIFO", "search")])
def test_a_config_file_that_is_not_one_is_refused_in_one_line(tmp_path: Path, kind: str, command: str) -> None:
    """Before: a FIFO hung validate and search; /dev/zero (or a link to it) read until MemoryError."""
    make, said = CONFIGS[kind]
    config = make(tmp_path)
    _experiment(tmp_path / "exp", config=config)
    studies = ["--studies-dir", str(tmp_path / "studies")] if command == "search" else []
    res = _hpo(tmp_path, command, "--space", str(tmp_path / "exp" / "exp.yaml"), *studies, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"config: {config}: " in res.stderr and said in res.stderr, res.stderr
    assert not (tmp_path / "studies").exists()


def test_a_linked_experiment_reads_its_config_beside_the_real_file(tmp_path: Path) -> None:
    """``exp.yaml`` in links/ is a link to real/exp.yaml; each directory has a grpo.yaml with its own marker key:
    the one beside the real file is read (verl's rule for every relative path of an experiment file)."""
    real = _experiment(tmp_path / "real")
    (real.parent / "grpo.yaml").write_text(CONFIG.read_text() + "real_marker: 1\n")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "grpo.yaml").write_text(CONFIG.read_text() + "link_marker: 1\n")
    (tmp_path / "links" / "exp.yaml").symlink_to(real)
    res = _hpo(tmp_path / "links", "validate", "--space", "exp.yaml")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"config: {real.parent / 'grpo.yaml'}: unknown GRPOConfig field" in res.stderr, res.stderr
    assert "'real_marker'" in res.stderr



@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # open_study: set_metric_names
def test_a_worker_reads_a_relative_config_beside_its_space_file(tmp_path: Path, tiny_model_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The study as ``search --space exp/exp.yaml`` stores it from user/ (``config: grpo.yaml`` as written, the file's
    path as given). A worker given the file by its absolute path from another directory runs its trial on the
    grpo.yaml beside it (before: the one under its own directory, so a worker was refused as a different experiment
    there, or with none there its prepare step failed); one given it from beside the file is not refused either
    (before: the stored config, resolved, was compared with the local one as written)."""
    user, elsewhere, studies = tmp_path / "user", tmp_path / "elsewhere", tmp_path / "studies"
    space_file = _experiment(user / "exp")
    space_file.write_text(yaml.safe_dump({**EXPERIMENT, "overrides": {**EXPERIMENT["overrides"], "max_steps": 2}}))
    elsewhere.mkdir()
    (elsewhere / "grpo.yaml").write_text("not: a GRPO config\n")  # the wrong one, where the worker runs
    monkeypatch.chdir(user)
    open_study(load_space("exp/exp.yaml"), "exp", f"sqlite:///{studies / 'exp.db'}")  # what search stores
    res = _hpo(elsewhere, "worker", "--study", "exp", "--space", str(space_file), "--studies-dir", str(studies),
               timeout=200)
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout + res.stderr)[-3000:]
    argv = json.loads((studies / "exp" / "trials" / "0" / "command.json").read_text())["argv"]
    assert argv[argv.index("--config") + 1] == str(user / "exp" / "grpo.yaml"), argv
    study = optuna.load_study(study_name="exp", storage=f"sqlite:///{studies / 'exp.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    for cwd, given in ((user, "exp/exp.yaml"), (user / "exp", "exp.yaml")):  # the study at its target: it stops
        again = _hpo(cwd, "worker", "--study", "exp", "--space", given, "--studies-dir", str(studies))
        assert again.returncode == 0, (given, again.stderr)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # open_study: set_metric_names
@pytest.mark.parametrize("command", ["resume", "worker"])
def test_a_space_named_as_search_names_it_is_found_as_search_finds_it(tmp_path: Path, command: str) -> None:
    """The study as ``search --space exp`` stores it with ``$VERL_HPO_SPACES_DIR`` at user/exp (``config: grpo.yaml``
    beside the file). ``resume`` / ``worker --space exp`` with the same variable, from another directory holding a
    decoy grpo.yaml, find user/exp/exp.yaml, read its config beside it and run the stored study (before: '--space
    exp: no such experiment file', exit 2: the name was taken for a path under the working directory). The study is
    at its target, so no trial runs: finding and comparing the file is what is tested. A name that is in no place is
    the line ``search`` gives, exit 2."""
    user, elsewhere, studies = tmp_path / "user", tmp_path / "elsewhere", tmp_path / "studies"
    space_file = _experiment(user / "exp")
    elsewhere.mkdir()
    (elsewhere / "grpo.yaml").write_text("not: a GRPO config\n")  # where the command runs: not the study's config
    spaces = {"VERL_HPO_SPACES_DIR": str(space_file.parent)}
    study = open_study(load_space("exp", spaces_dir=space_file.parent), "exp", f"sqlite:///{studies / 'exp.db'}")
    assert study.user_attrs[ATTR_SOURCE] == str(space_file)  # what search stores
    study.add_trial(optuna.trial.create_trial(  # the study at its target: an accepted command stops
        params={"learning_rate": 1.5e-4},
        distributions={"learning_rate": optuna.distributions.FloatDistribution(1.0e-4, 2.0e-4)}, value=0.5))
    res = _hpo(elsewhere, command, "--study", "exp", "--space", "exp", "--studies-dir", str(studies), timeout=200,
               **spaces)
    assert res.returncode == 0 and "already has 1 finished trials" in res.stdout, (res.stdout + res.stderr)[-3000:]
    assert "Traceback" not in res.stderr, res.stderr
    nowhere = _hpo(elsewhere, command, "--study", "exp", "--space", "nope", "--studies-dir", str(studies), **spaces)
    said = _hpo(elsewhere, "search", "--space", "nope", "--studies-dir", str(studies), **spaces)
    assert (nowhere.returncode, nowhere.stdout) == (2, ""), nowhere.stderr
    assert nowhere.stderr.strip().splitlines() == said.stderr.strip().splitlines(), (nowhere.stderr, said.stderr)
    assert said.stderr.startswith("error: --space nope: no experiment file nope.yaml in "), said.stderr


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # open_study: set_metric_names
def test_a_study_searched_from_beside_its_file_resumes_from_anywhere_without_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``search --space exp.yaml`` typed beside the file stores the file's absolute path: ``resume`` with no
    ``--space``, from another directory holding a decoy grpo.yaml, finds the file the study was made from, reads its
    relative ``config`` beside it and runs the stored study (before: the relative name was stored, and the command
    refused the TRL trainer's code with 'no local experiment file to compare with', or compared a same-named file of
    the working directory)."""
    user, elsewhere, studies = tmp_path / "user", tmp_path / "elsewhere", tmp_path / "studies"
    space_file = _experiment(user)
    elsewhere.mkdir()
    (elsewhere / "grpo.yaml").write_text("not: a GRPO config\n")
    monkeypatch.chdir(user)
    study = open_study(load_space("exp.yaml"), "exp", f"sqlite:///{studies / 'exp.db'}")  # as search stores it
    assert study.user_attrs[ATTR_SOURCE] == str(space_file)
    study.add_trial(optuna.trial.create_trial(  # the study at its target: an accepted command stops
        params={"learning_rate": 1.5e-4},
        distributions={"learning_rate": optuna.distributions.FloatDistribution(1.0e-4, 2.0e-4)}, value=0.5))
    res = _hpo(elsewhere, "resume", "--study", "exp", "--studies-dir", str(studies), timeout=200)
    assert res.returncode == 0 and "already has 1 finished trials" in res.stdout, (res.stdout + res.stderr)[-3000:]
