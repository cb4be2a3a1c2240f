"""A stopped search prints the command that goes on with it, complete: the ``--studies-dir`` (and a non-default
``--storage``) the study was run with, so the hint finds the study from any directory (issue 43 item 9)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpo.commands import follow_up
from tests.hpo.conftest import cli_env, fake_space


def test_the_hint_carries_the_studies_dir_and_storage(tmp_path: Path) -> None:
    studies = tmp_path / "my studies"
    assert follow_up("resume", "mine", f"sqlite:///{studies / 'mine.db'}", studies) == \
        f"verl-hpo resume --study mine --studies-dir '{studies}'"
    line = follow_up("resume", "mine", "postgresql+psycopg2://u:pw@127.0.0.1/test", studies)
    assert line.endswith("--storage 'postgresql+psycopg2://u:***@127.0.0.1/test'") and "pw" not in line


def test_the_printed_resume_hint_finds_the_study(tmp_path: Path) -> None:
    studies = tmp_path / "elsewhere" / "studies"
    space = fake_space(tmp_path, name="mine", overrides={"trainer.total_training_steps": 40, "trainer.test_freq": 2,
                                                         "fake.step_s": 0.1}, study={"n_trials": 2})
    driver = subprocess.Popen([sys.executable, "-m", "hpo", "search", "--space", str(space), "--studies-dir",
                               str(studies)], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(studies.glob("mine/trials/*/metrics.jsonl")):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=120)
    hint = next(line for line in err.splitlines() if "interrupted trials are queued:" in line)
    argv = shlex.split(hint.split("interrupted trials are queued: ", 1)[1])
    assert argv[:2] == ["verl-hpo", "resume"] and "--studies-dir" in argv
    other = tmp_path / "another directory"
    other.mkdir()
    res = subprocess.run([sys.executable, "-m", "hpo", *argv[1:]], cwd=other, env=cli_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "2 ok" in res.stdout or "trials: 2" in res.stdout, res.stdout
