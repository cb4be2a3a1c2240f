"""A rehearsal stopped by a signal leaves no scratch (issue 53 item 12): each corner's verl run has its private
``TMPDIR`` (``/tmp/vhpo-<uid>-<hash>-<attempt>`` when the trial directory's path is too long for Ray's sockets:
Ray's session files, hundreds of MB), and a SIGTERMed rehearsal left it, since nothing sweeps a rehearsal's as the
study sweeps its killed trials'. Now SIGTERM/SIGINT/SIGHUP stop the corners' runs, their scratch is removed, the exit
is 128 + the signal; what a SIGKILLed one left is swept by the next rehearsal of the experiment (only its own
corners' scratch, found by their trial directories' hash; never another's, never through a link)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpo.backends import load_space
from hpo.backends.verl._launch import scratch_dir
from hpo.backends.verl._rehearse import MARKER, rehearsal_home
from tests.hpo.backends.verl.conftest import CPU_SPACE, needs_verl
from tests.hpo.conftest import cli_env

SHIPPED = CPU_SPACE

# The rehearsal itself, with its verl steps before the corners (composing, the small model: verl's interpreter, a
# minute) replaced, so that its corners' runs start at once: a `main_ppo` that writes its pid and sleeps.
CHILD = """
import sys
from pathlib import Path
from hpo.backends import load_space
from hpo.backends.verl import _rehearse as R
R._prepare = lambda space, home: None
R._Rehearsal.compose = lambda self, corners, gpus: [({}, {})]
R._Rehearsal.shrink = lambda self, *args: {}
R._shrunk_overrides = lambda *args, **kw: []
R._Rehearsal.check_cpu_corners = lambda self, runner, corners: None
sys.exit(R.rehearse(load_space(sys.argv[1]), Path(sys.argv[2]), python=sys.argv[3], quick=True, parallel=1))
"""


def _wait_for(what: str, done: Callable[[], object], proc: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert proc.poll() is None, f"the rehearsal ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").is_file() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_rehearsal_removes_its_scratch(tmp_path: Path, sig: signal.Signals) -> None:
    studies = tmp_path / "a-studies-directory-with-a-long-name"
    trainer = tmp_path / "main_ppo"
    pid_file = tmp_path / "trainer.pid"
    trainer.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 120\n")
    trainer.chmod(0o755)
    scratch = scratch_dir(studies.resolve() / "rehearsals" / "verl_grpo_cpu" / "trials" / "0-default", 0)
    assert str(scratch).startswith("/tmp/vhpo-")  # outside the rehearsal's home: nothing else removes it
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(SHIPPED), str(studies), str(trainer)], cwd=tmp_path,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the corner's scratch and its trainer", lambda: scratch.is_dir() and pid_file.is_file()
                  and pid_file.read_text().strip(), proc)
        trainer_pid = int(pid_file.read_text())
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    assert proc.returncode == 128 + sig, err
    assert not scratch.exists(), err
    assert not _alive(trainer_pid)
    assert f"stopped by {sig.name}: not rehearsed (its runs stopped, their scratch removed)" in err
    assert "Traceback" not in err and out == ""


def test_the_next_rehearsal_sweeps_only_what_a_killed_one_of_its_own_left(tmp_path: Path) -> None:
    """A SIGKILLed rehearsal (or a second signal) leaves its corners' scratch: the next rehearsal of the experiment
    removes it when it replaces the home; the scratch of a trial directory elsewhere (a study's, reached through a
    link planted in the home) and another experiment's stay."""
    space = load_space(str(SHIPPED))
    studies = tmp_path / "a-studies-directory-with-a-long-name"
    home = studies / "rehearsals" / "verl_grpo_cpu"
    trials = home / "trials"
    for name in ("0-default", "1-low"):
        (trials / name).mkdir(parents=True)
    (home / MARKER).write_text("made by verl-hpo rehearse\n")
    study_trial = studies / "mine" / "trials" / "3"
    study_trial.mkdir(parents=True)
    (trials / "2-high").symlink_to(study_trial)
    other = studies / "rehearsals" / "another" / "trials" / "0-default"
    other.mkdir(parents=True)
    ours = [scratch_dir(trials.resolve() / "0-default", 0), scratch_dir(trials.resolve() / "0-default", 1),
            scratch_dir(trials.resolve() / "1-low", 0)]
    theirs = [scratch_dir(study_trial, 0), scratch_dir(other, 0)]
    try:
        for s in ours + theirs:
            (s / "ray" / "session_latest").mkdir(parents=True)
        assert all(str(s).startswith("/tmp/vhpo-") for s in ours + theirs)
        assert rehearsal_home(studies, space) == home
        assert [s.exists() for s in ours] == [False, False, False]
        assert [s.is_dir() for s in theirs] == [True, True]
        assert study_trial.is_dir() and (home / MARKER).is_file() and not trials.exists()
    finally:
        for s in ours + theirs:
            shutil.rmtree(s, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.cpu_heavy
@needs_verl
def test_a_sigtermed_real_rehearsal_leaves_no_scratch(tmp_path: Path) -> None:
    """The same with real verl (the shipped CPU experiment, --quick): SIGTERM once its corner's run has its scratch
    (~60 s in, on 2 cores), then exit 143 in seconds with the scratch gone."""
    studies = tmp_path / "a-studies-directory-with-a-long-name"
    scratch = scratch_dir(studies.resolve() / "rehearsals" / "verl_grpo_cpu" / "trials" / "0-default", 0)
    proc = subprocess.Popen([sys.executable, "-m", "hpo", "rehearse", "--space", "verl_grpo_cpu", "--quick",
                             "--studies-dir", str(studies)], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the corner's scratch", lambda: (scratch / "ray").is_dir(), proc, seconds=900)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    assert proc.returncode == 143, err[-3000:]
    assert not scratch.exists() and "stopped by SIGTERM" in err and "Traceback" not in err, err[-3000:]
