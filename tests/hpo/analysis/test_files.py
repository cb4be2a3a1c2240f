"""The one way the driver reads a file that a user or a trial names: regular files only, never more than a limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpo.analysis._files import FileRefused, check_regular, open_regular, read_bounded, read_tail


@pytest.fixture
def odd(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a symlink to /dev/zero and a directory: none may be read (nor block, nor read for ever)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    (tmp_path / "dir.yaml").mkdir()
    return {"a FIFO": fifo, "a character device": zero, "a directory": tmp_path / "dir.yaml"}


@pytest.mark.timeout(30)
def test_only_regular_files_are_read(odd: dict[str, Path]) -> None:
    for kind, path in odd.items():
        for read in (lambda p: read_bounded(p, f"--x {p}"), lambda p: check_regular(p, f"--x {p}"),
                     lambda p: read_tail(p, 100)):
            with pytest.raises(FileRefused) as err:
                read(path)
            assert kind in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "real.yaml").write_text("a: 1\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")
    assert read_bounded(tmp_path / "link.yaml", "x") == b"a: 1\n"
    os.close(open_regular(tmp_path / "link.yaml", "x"))


def test_the_limit_is_exact_and_reads_stop_past_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_bounded(path, "f", limit=100) == b"x" * 100
    with pytest.raises(FileRefused, match=r"^f: 100 bytes; at most 99 are read$"):
        read_bounded(path, "f", limit=99)
    with pytest.raises(FileRefused, match="at most 99"):
        check_regular(path, "f", limit=99)
    assert read_tail(path, 7) == b"x" * 7


def test_a_missing_file_is_the_os_error() -> None:
    with pytest.raises(FileNotFoundError):
        read_bounded("/nonexistent/x.yaml", "x")


@pytest.mark.timeout(30)
def test_a_trial_file_is_read_only_when_it_is_itself_a_regular_file(tmp_path: Path, odd: dict[str, Path]) -> None:
    """A file under a trial's directory: no link followed (not even to a regular file), no FIFO, no device."""
    from hpo.analysis import read_trial_file

    outside = tmp_path / "secret.txt"
    outside.write_text("not the trial's\n")
    linked = tmp_path / "command.json"
    linked.symlink_to(outside)
    with pytest.raises(FileRefused, match=rf"^{linked}: is a symbolic link, not followed$"):
        read_trial_file(linked)
    for kind, path in odd.items():  # the link to /dev/zero is refused as a link, before anything is opened
        with pytest.raises(FileRefused, match="a symbolic link" if path.is_symlink() else kind):
            read_trial_file(path)
    with pytest.raises(FileRefused, match="at most 10 are read"):
        read_trial_file(outside, limit=10)
    assert read_trial_file(outside) == b"not the trial's\n"
    with pytest.raises(FileNotFoundError):
        read_trial_file(tmp_path / "missing.json")
