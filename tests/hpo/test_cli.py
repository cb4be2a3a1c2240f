"""The command line's frame (:mod:`hpo._cli`): the subcommands in the order of ``verl-hpo --help``, and the exit codes
``main`` turns errors into: 2 and one ``error:`` line for bad input (argparse's included, before any study exists), 1
and one line for a storage that cannot be reached (its password masked). What each subcommand does is
``tests/hpo/commands/``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hpo._cli import COMMANDS, build_parser, main


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_resume_of_missing_study_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    studies = tmp_path / "studies"
    assert main(["resume", "--study", "nope", "--studies-dir", str(studies)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
    assert not any(studies.rglob("*.db")) if studies.exists() else True


def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["search"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_an_unknown_subcommand_or_flag_is_one_line_naming_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serach"], ["best", "--study", "s", "--nope"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert one_line(capsys).endswith("(see verl-hpo --help)")


def test_help_lists_every_subcommand_in_the_dispatch_order() -> None:
    text = build_parser().format_help()
    assert "{" + ",".join(COMMANDS) + "}" in text
    assert list(COMMANDS)[:2] == ["search", "resume"] and {"confirm", "validate", "best"} <= set(COMMANDS)
    for command in COMMANDS.values():
        assert command.name in text and command.help.split("(")[0].strip()[:40] in " ".join(text.split())


def test_a_studies_dir_that_is_a_regular_file_is_bad_input_not_a_storage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "studies"
    afile.write_text("not a directory\n")
    assert main(["best", "--study", "s", "--studies-dir", str(afile)]) == 2
    line = one_line(capsys)
    assert str(afile) in line and "not a directory" in line


def test_an_unreachable_storage_is_exit_1_with_its_password_masked(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("psycopg2") is None:
        pytest.skip("psycopg2 not installed")
    url = "postgresql+psycopg2://alice:S3cretPW@127.0.0.1:1/db"  # nothing listens on port 1: refused at once
    assert main(["best", "--study", "s", "--storage", url, "--studies-dir", str(tmp_path)]) == 1
    line = one_line(capsys)
    assert "alice:***@127.0.0.1:1" in line and "S3cretPW" not in line


def test_bad_numbers_are_refused_before_any_study_exists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resume", "--study", "s", "--n-trials", "0", "--studies-dir", str(tmp_path / "st")]) == 2
    assert one_line(capsys) == "error: --n-trials 0: must be positive"
    assert not (tmp_path / "st").exists()
