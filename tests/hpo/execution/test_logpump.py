"""The log pump's parts (:mod:`hpo.execution._logpump`), on real files: a log capped at a stated size keeps its head, a
line saying what was cut and its tail, every byte written at once and a write error never raised; the rows a trainer
says it dropped counted over every line (``n`` and ``key`` groups), the first kept with its traceback's exception;
the cap's setting read in one line. The pump as a process is ``test_logs.py``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hpo.execution import _logpump
from hpo.execution._logpump import ENV_LOG_CAP, CappedLog, RowCounter, log_cap

MIB = 1 << 20
CUT = re.compile(rb"^\[verl-hpo: (\d+) bytes \((\d+) lines\) cut here: this log went over its cap of (\S+) MiB "
                 rb"\(\$VERL_HPO_LOG_CAP_MIB\); its head and its tail are kept\]\n", re.M)


def _line(i: int) -> bytes:
    return b"line %08d " % i + b"." * 85 + b"\n"  # 100 bytes


def _log(path: Path, cap: int | None) -> tuple[int, CappedLog]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    return fd, CappedLog(fd, cap)


def test_a_log_over_its_cap_keeps_its_head_the_cut_and_its_tail(tmp_path: Path) -> None:
    cap, n = 64 * 1024, 5000  # 500 kB through a 64 KiB log, in chunks of 7 lines
    fd, log = _log(tmp_path / "stderr.log", cap)
    data = b"".join(_line(i) for i in range(n))
    for i in range(0, len(data), 700):
        log.write(data[i:i + 700])
        assert os.fstat(fd).st_size <= cap  # at every moment
        if log.head_end is not None:  # cut at least once: the tail after the cut line is half the cap at least
            assert os.fstat(fd).st_size - os.pread(fd, cap, 0).index(b"cut here") >= cap // 2
    os.close(fd)
    text = (tmp_path / "stderr.log").read_bytes()
    cuts = CUT.findall(text)
    assert len(cuts) == 1 and float(cuts[0][2]) * MIB == cap
    numbers = [int(x) for x in re.findall(rb"^line (\d{8}) ", text, re.M)]
    split = next(i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1)
    assert numbers[:split] == list(range(split)) and numbers[split:] == list(range(numbers[split], n))
    assert cap // 4 - cap // 16 < split * 100 <= cap // 4  # the head: a quarter, cut at a line's end before it
    assert (n - numbers[split]) * 100 >= cap // 2 - 100  # the tail: at least half
    cut_bytes, cut_lines = int(cuts[0][0]), int(cuts[0][1])
    assert cut_lines == numbers[split] - split and cut_bytes == cut_lines * 100  # cut on line boundaries
    assert log.report() == {"bytes": n * 100, "cut_bytes": cut_bytes, "cut_lines": cut_lines, "error": None}


def test_a_log_far_over_its_cap_copies_each_byte_a_few_times_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap's cost is linear in what the trainer prints: a cut copies half the cap and leaves a quarter of it
    free, so the bytes written to the file stay within a few times those received (~2.5 today), whatever the cap.
    Cutting again on every write over the cap would copy the tail for every chunk (cap/2 per 64 KiB)."""
    written = [0]

    def counted(fd: int, data: bytes, offset: int) -> None:
        written[0] += len(data)
        pwrite_all(fd, data, offset)

    pwrite_all = _logpump._pwrite_all
    monkeypatch.setattr(_logpump, "_pwrite_all", counted)
    fd, log = _log(tmp_path / "stderr.log", 4 * MIB)
    chunk = b"".join(_line(i) for i in range(_logpump.CHUNK // 100))  # what the pump reads from a pipe at a time
    for _ in range(40 * MIB // len(chunk)):
        log.write(chunk)
    os.close(fd)
    assert log.received >= 39 * MIB and log.cut_bytes > 30 * MIB
    assert written[0] <= 4 * log.received, written[0] / log.received  # ~2.5 today


def test_a_log_under_its_cap_or_without_one_is_left_whole(tmp_path: Path) -> None:
    data = b"".join(_line(i) for i in range(50))
    for cap in (MIB, None):
        path = tmp_path / f"log-{cap}"
        fd, log = _log(path, cap)
        log.write(data[:1234])
        log.write(b"")
        log.write(data[1234:])
        os.close(fd)
        assert path.read_bytes() == data and log.report()["cut_bytes"] == 0


def test_a_log_appended_to_counts_what_it_held(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"earlier\n" * 10)
    fd, log = _log(path, MIB)
    log.write(b"later\n")
    os.close(fd)
    assert path.read_bytes() == b"earlier\n" * 10 + b"later\n" and log.report()["bytes"] == 86


def test_a_write_error_is_kept_and_the_rest_dropped_never_raised(tmp_path: Path) -> None:
    path = tmp_path / "ro.log"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # what a full disk looks like to the pump: every write fails
    log = CappedLog(fd, MIB)
    log.write(b"first\n")
    log.write(b"second\n")
    os.close(fd)
    report = log.report()
    assert report["bytes"] == 13 and isinstance(report["error"], str)
    assert report["error"].endswith("; the rest of this log was dropped") and path.read_bytes() == b""


VERL = (r"Error in _run_prompt for uid=(?P<key>\S+)", r"\[repeated (?P<n>\d+)x across cluster\]")


def test_dropped_rows_are_counted_per_line_per_key_and_by_ray_s_repeat_count() -> None:
    counter = RowCounter(VERL)
    lines = counter.lines(0)
    for chunk in (b"INFO start\nERROR Error in _run_prompt for uid=a1\nERROR Error in _run_", b"prompt for uid=a1\n",
                  b"ERROR Error in _run_prompt for uid=b2 [repeated 3x across cluster]\n", b"no newline at the end"):
        lines.feed(chunk)
    lines.finish()
    # a1 twice: one row (the same prompt); b2: one line, counted once whichever patterns match it (by key: 1)
    assert counter.count == 2 and counter.first == "Error in _run_prompt for uid=a1"
    repeated = RowCounter([VERL[1]])
    repeated.scan(b"x [repeated 3x across cluster]\ny [repeated 4x across cluster]\n", 0)
    assert repeated.count == 7
    assert RowCounter([]).report() == {"count": 0, "first": None, "exception": None, "error": None}


def test_the_first_dropped_row_keeps_its_traceback_s_exception_among_other_processes_lines() -> None:
    counter = RowCounter([VERL[0]])
    counter.scan(b"(W pid=7) ERROR:t:Error in _run_prompt for uid=u1\n"
                 b"(W pid=7) Traceback (most recent call last):\n"
                 b"(Other pid=9) unrelated line\n"
                 b"(W pid=7)   File \"reward.py\", line 3, in score\n"
                 b"(W pid=7)     return int(gt)\n"
                 b"(W pid=7) ValueError: invalid literal for int() with base 10: 'NA'\n"
                 b"(W pid=7) INFO:t:next step\n", 2)
    report = counter.report()
    assert report["count"] == 1 and report["exception"] == "ValueError: invalid literal for int() with base 10: 'NA'"
    ray = RowCounter([VERL[0]])
    ray.scan(b"ERROR Error in _run_prompt for uid=u1\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
             b"ray.exceptions.RayTaskError(ValueError): ray::Worker.score()\n  File \"reward.py\", line 9, in score\n"
             b"ValueError: no scorer for row 0\nINFO done\n", 0)
    assert ray.exception() == "ValueError: no scorer for row 0"  # the task's own exception, as the user wrote it
    none = RowCounter([VERL[0]])
    none.scan(b"ERROR Error in _run_prompt for uid=u1\nINFO no traceback follows\n", 0)
    assert none.exception() is None


@pytest.mark.parametrize(("value", "cap"), [("", 16 * MIB), ("  ", 16 * MIB), ("0", None), ("1", MIB),
                                            ("2.5", int(2.5 * MIB))])
def test_the_cap_s_setting(value: str, cap: int | None) -> None:
    assert log_cap({ENV_LOG_CAP: value}) == cap


@pytest.mark.parametrize("value", ["lots", "0.5", "-3", "nan", "1e20"])
def test_a_bad_cap_is_one_line_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError) as err:
        log_cap({ENV_LOG_CAP: value})
    assert str(err.value).startswith(f"VERL_HPO_LOG_CAP_MIB={value!r}: expected a number of MiB >= 1")
