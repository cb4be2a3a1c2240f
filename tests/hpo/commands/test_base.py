"""What every subcommand shares (``hpo/commands/_base.py``): the one ``error:`` line (a hostile value cut short), the
numeric flags checked before any study exists, the studies directory (``--studies-dir``, else
``$VERL_HPO_STUDIES_DIR``, else ``./studies``), and the command that goes on with a stopped search, complete: the
``--studies-dir`` (and a non-default ``--storage``) the study was run with, so the hint finds the study from any
directory (issue 43 item 9)."""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpo.commands import check_numbers, default_studies_dir, fail, follow_up
from hpo.commands._base import MAX_ERROR_CHARS
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


def test_an_error_is_one_line_and_a_hostile_value_is_cut_short(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail("--study 'x': bad") == 2 and fail("the storage went away", 1) == 1
    assert capsys.readouterr().err == "error: --study 'x': bad\nerror: the storage went away\n"
    fail("v" * 10_000)
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: {'v' * MAX_ERROR_CHARS}... (10000 characters)"


@pytest.mark.parametrize(("flags", "line"), [
    ({"n_trials": 0}, "error: --n-trials 0: must be positive"),
    ({"top": -1, "seeds": 3}, "error: --top -1: must be positive"),
    ({"seeds": 0}, "error: --seeds 0: must be positive"),
    ({"budget": 0.5}, "error: --budget 0.5: must be a finite number of full-run equivalents, at least 1 (one trial's "
                      "full length)"),
    ({"budget": float("inf")}, "error: --budget inf: must be a finite number of full-run equivalents, at least 1 "
                               "(one trial's full length)"),
])
def test_the_numeric_flags_of_any_subcommand_are_checked_first(flags: dict[str, float], line: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert check_numbers(argparse.Namespace(**flags)) == 2
    assert capsys.readouterr().err.strip() == line
    assert check_numbers(argparse.Namespace(n_trials=3, budget=1.0)) is None and check_numbers(argparse.Namespace()) \
        is None


def test_the_studies_directory_is_the_flag_s_else_the_variable_s(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERL_HPO_STUDIES_DIR", raising=False)
    assert default_studies_dir() == Path("studies") and default_studies_dir(tmp_path) == tmp_path
    monkeypatch.setenv("VERL_HPO_STUDIES_DIR", str(tmp_path / "mine"))
    assert default_studies_dir() == tmp_path / "mine" and default_studies_dir(Path("x")) == Path("x")
    # the default needs no flag in the hint: the same variable finds it again
    assert follow_up("resume", "s", f"sqlite:///{tmp_path / 'mine' / 's.db'}", tmp_path / "mine") == \
        "verl-hpo resume --study s"
