"""The metrics file a trial writes, as the driver reads it (:mod:`hpo.execution._metrics`): only complete lines, only
numbers as values (``null`` as NaN, as verl's orjson logger writes it), a bad line counted and skipped, a line without
end capped, a shrunk or replaced file read again from the start, and a path that is not a regular file refused instead
of blocking. Moved here from ``test_hostile_trials.py`` (whose end-to-end tests run a real driver over such files)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from hpo.execution import MetricsFileError, MetricsTail, metric_value, parse_line


def test_metrics_tail_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "m.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(MetricsFileError, match="not a regular file"):
        MetricsTail(fifo).read()
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(MetricsFileError):
        MetricsTail(tmp_path / "dir.jsonl").read()
    link = tmp_path / "link.jsonl"
    link.symlink_to(fifo)
    with pytest.raises(MetricsFileError):
        MetricsTail(link).read()


def test_a_line_without_end_is_capped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path, max_line_bytes=2**20)
    path.write_text(json.dumps({"step": 0, "data": {"a": 1}}) + "\n")
    assert tail.read() == [(0, {"a": 1.0})]
    with path.open("ab") as fh:
        for _ in range(8):  # 8 MiB without a newline, read as it grows: the buffer never passes the cap
            fh.write(b"x" * 2**20)
            fh.flush()
            assert tail.read() == []
            assert len(tail._partial) <= 2**20
    with path.open("a") as fh:
        fh.write("still the long line\n" + json.dumps({"step": 1, "data": {"a": 2}}) + "\n")
    assert tail.read() == [(1, {"a": 2.0})]
    assert tail.bad_lines == 1


def test_only_numbers_are_values_and_null_is_not_finite() -> None:
    line = json.dumps({"step": 3, "data": {"a": True, "b": "1e9", "c": None, "d": 2, "e": [1], "f": 0.5}})
    step, data = parse_line(line.encode())  # type: ignore[misc]
    assert step == 3 and set(data) == {"c", "d", "f"}
    assert math.isnan(data["c"]) and data["d"] == 2.0 and data["f"] == 0.5
    for bad in ('{"step": true, "data": {}}', '{"step": "3", "data": {}}', '{"step": 2.5, "data": {}}',
                '{"step": 3, "data": []}', "[1, 2]", '{"step": 2147483649, "data": {}}', "nan"):
        assert parse_line(bad.encode()) is None, bad
    assert parse_line(b'{"step": 4.0, "data": {"x": 1e400}}') == (4, {"x": math.inf})


def test_metrics_tail_rewinds_on_a_shrunk_or_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    path.write_text("".join(json.dumps({"step": s, "data": {"v": s}}) + "\n" for s in range(5)))
    assert [s for s, _ in tail.read()] == [0, 1, 2, 3, 4]
    path.write_text(json.dumps({"step": 7, "data": {"v": 7}}) + "\n")  # shorter: truncated and rewritten
    assert [s for s, _ in tail.read()] == [7]
    other = tmp_path / "new.jsonl"
    other.write_text("".join(json.dumps({"step": s, "data": {"v": s}}) + "\n" for s in range(8, 20)))
    other.replace(path)  # a new file (longer than the offset) at the same path
    assert [s for s, _ in tail.read()] == list(range(8, 20))
    assert tail.rewinds == 2


def test_metrics_tail_rewinds_on_a_file_rewritten_in_place_past_its_offset(tmp_path: Path) -> None:
    """Truncated and rewritten longer between two reads (same inode, larger size): read from the start again, not
    from the middle of a line of the new content."""
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    path.write_text("".join(json.dumps({"step": s, "data": {"v": s}}) + "\n" for s in range(3)))
    assert [s for s, _ in tail.read()] == [0, 1, 2]
    ino = path.stat().st_ino
    with path.open("r+") as fh:  # in place: the same file
        fh.truncate(0)
        fh.write("".join(json.dumps({"step": s, "data": {"value": s * 10}}) + "\n" for s in range(10, 16)))
    assert path.stat().st_ino == ino
    assert tail.read() == [(s, {"value": s * 10.0}) for s in range(10, 16)]
    assert tail.rewinds == 1 and tail.bad_lines == 0
    with path.open("a") as fh:  # appended as usual: no rewind
        fh.write(json.dumps({"step": 16, "data": {"value": 160}}) + "\n")
    assert tail.read() == [(16, {"value": 160.0})] and tail.rewinds == 1


def test_a_logged_value_is_a_number_nan_or_dropped() -> None:
    assert metric_value(3) == 3.0 and isinstance(metric_value(3), float)
    assert math.isnan(metric_value(None))  # type: ignore[arg-type]
    assert metric_value(10**400) == math.inf and metric_value(-(10**400)) == -math.inf
    assert [metric_value(v) for v in (True, "1", [1], {"a": 1})] == [None, None, None, None]


def test_a_partial_line_is_read_once_complete(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # no file yet
    path.write_text(json.dumps({"step": 0, "data": {"a": 1}}) + "\n" + '{"step": 1, "da')
    assert tail.read() == [(0, {"a": 1.0})]
    with path.open("a") as fh:
        fh.write('ta": {"a": 2}}\n\n   \n')  # blank lines are no bad lines
    assert tail.read() == [(1, {"a": 2.0})] and tail.bad_lines == 0 and tail.rewinds == 0


def test_a_link_is_refused_when_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "earlier.jsonl"
    real.write_text(json.dumps({"step": 0, "data": {"a": 1}}) + "\n")
    link = tmp_path / "m.jsonl"
    link.symlink_to(real)
    assert MetricsTail(link).read() == [(0, {"a": 1.0})]
    with pytest.raises(MetricsFileError, match=f"^metrics file {link} is a symbolic link, not followed$"):
        MetricsTail(link, follow=False).read()
    os.unlink(link)
    assert MetricsTail(link, follow=False).read() == []
