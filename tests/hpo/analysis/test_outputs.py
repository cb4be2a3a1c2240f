"""Where the driver writes (:mod:`hpo.analysis._outputs`): a path is written only when nothing or a regular file is
there (a rename would replace a FIFO, a link, a device), the directory a file goes in must be one or be makeable,
each refusal one line naming the flag and the path; and the names the tool keeps under the studies directory are no
study's."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpo.analysis._outputs import (
    BASELINES_DIR,
    OutputRefused,
    check_dir_creatable,
    check_output_path,
    file_kind,
    make_output_dir,
    reserved_study_name,
)


@pytest.mark.parametrize("name", ["rehearsals", "Rehearsals", BASELINES_DIR, "mlflow-artifacts"])
def test_the_tool_s_own_directories_are_no_study_s(name: str) -> None:
    assert reserved_study_name(name) == f"{name!r} is verl-hpo's own directory in the studies directory"


@pytest.mark.parametrize(("name", "suffix"), [("x.db", ".db"), ("X.DB-wal", ".db-wal"), ("s.db.lock", ".db.lock"),
                                              ("a.db-journal", ".db-journal"), ("b.db-shm", ".db-shm")])
def test_a_study_s_database_names_are_no_study_s(name: str, suffix: str) -> None:
    why = reserved_study_name(name)
    assert why is not None and why.startswith(f"a name ending in {suffix!r} is verl-hpo's own name for a study's "
                                              "database file")


@pytest.mark.parametrize("name", ["study", "db", "rehearsals2", "x.db.bak", "my.dbx"])
def test_other_names_are_free(name: str) -> None:
    assert reserved_study_name(name) is None


def test_each_kind_of_file_is_named() -> None:
    assert [file_kind(m) for m in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK, stat.S_IFIFO, stat.S_IFCHR,
                                   stat.S_IFBLK, stat.S_IFSOCK, 0)] == [
        "a regular file", "a directory", "a symbolic link", "a FIFO (named pipe)", "a character device",
        "a block device", "a socket", "not a regular file"]


def test_a_new_path_or_a_regular_file_is_written(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    assert check_output_path(page, "--out") == page
    page.write_text("old")
    assert check_output_path(page, "--out") == page
    deep = tmp_path / "a" / "b" / "page.html"
    assert check_output_path(deep, "--out") == deep and not (tmp_path / "a").exists()  # makeable, nothing made


def test_what_a_rename_would_wrongly_replace_is_refused(tmp_path: Path) -> None:
    fifo, target, link = tmp_path / "fifo", tmp_path / "real.html", tmp_path / "link.html"
    os.mkfifo(fifo)
    target.write_text("x")
    link.symlink_to(target)
    with pytest.raises(OutputRefused) as err:
        check_output_path(fifo, "--out")
    assert str(err.value) == (f"--out {fifo}: is a FIFO (named pipe), not a regular file; name a new file or a "
                              "regular one (it is replaced)")
    with pytest.raises(OutputRefused, match=rf"^--out {link}: is a symbolic link \(to {target}\), not a regular"):
        check_output_path(link, "--out")  # refused whatever it points to
    with pytest.raises(OutputRefused, match=r"not a regular file; give the page's file name \(e.g. report.html\)$"):
        check_output_path(tmp_path, "--out")
    with pytest.raises(OutputRefused, match=r"is a character device"):
        check_output_path(Path("/dev/null"), "--out")
    assert fifo.exists() and stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()


def test_a_directory_that_cannot_be_made_is_one_line_about_that_directory(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputRefused) as err:
        check_output_path(afile / "sub" / "page.html", "--out")
    assert str(err.value) == f"--out {afile / 'sub' / 'page.html'}: {afile} is a regular file, not a directory"
    with pytest.raises(OutputRefused, match=rf"^--studies-dir {afile}: {afile} is a regular file, not a directory$"):
        check_dir_creatable(afile, "--studies-dir", writable=False)
    check_dir_creatable(tmp_path / "new" / "deeper", "--studies-dir")
    assert not (tmp_path / "new").exists()


def test_make_output_dir_makes_every_level_or_says_why_not(tmp_path: Path) -> None:
    made = tmp_path / "x" / "y"
    make_output_dir(made, "--out")
    make_output_dir(made, "--out")  # already there: nothing to do
    assert made.is_dir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputRefused, match=rf"^--out {fifo / 'd'}: {fifo} is a FIFO \(named pipe\), not a directory$"):
        make_output_dir(fifo / "d", "--out")
