"""The metrics file a trial writes, read by the driver: one JSON line per trainer step in verl's ``file`` logger
format, ``{"step": N, "data": {"metric/name": value, ...}}``. The file is someone else's output: nothing in it (a
huge or endless line, odd numbers, deep nesting, a FIFO at its path, a truncation) can break the driver."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_LINE_BYTES = 16 * 2**20  # a longer metrics line is a bad line (the driver's memory is every trial's)
READ_CHUNK_BYTES = 2**20
FINGERPRINT_BYTES = 64  # the last bytes read, checked at each read: a file rewritten in place is read again
MAX_STEP = 2**31  # a step outside 0..2^31 is a bad line (Optuna stores steps as 32-bit integers)


class MetricsFileError(Exception):
    """The metrics path is not a regular file (a FIFO, a device, a directory): the trial fails with this reason."""


def metric_value(v: Any) -> float | None:
    """A logged value as the driver sees it: int/float as float (``bool`` is no number); ``null`` as NaN (verl's
    file logger writes NaN and inf with orjson, which turns them into ``null``); anything else None (dropped)."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an int beyond float range
        return math.inf if v > 0 else -math.inf


def parse_line(line: bytes) -> tuple[int, dict[str, float]] | None:
    """One metrics line ``{"step": N, "data": {...}}`` as ``(step, {metric: float})``; None for a bad line
    (not JSON, nested too deep, no integral step in 0..2^31, ``data`` not an object). Values that are not
    numbers are dropped (see :func:`metric_value`)."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    step, data = rec.get("step"), rec.get("data")
    if isinstance(step, float) and math.isfinite(step) and step.is_integer():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP or not isinstance(data, dict):
        return None
    out: dict[str, float] = {}
    for k, v in data.items():
        x = metric_value(v)
        if x is not None:
            out[k] = x
    return step, out


class MetricsTail:
    """Incremental reader of a JSONL metrics file that a trial (someone else's code) writes; nothing it holds can
    break the driver.

    Only complete lines are parsed; a bad line (:func:`parse_line`) or one over :data:`MAX_LINE_BYTES` is counted
    in ``bad_lines`` and skipped, and a partial line never grows past that cap. The file is opened without
    blocking and must be a regular file (a FIFO would hang ``open()`` for ever): otherwise :class:`MetricsFileError`.
    A file that shrinks, is replaced (a restarted trainer truncating it) or is rewritten in place past the point
    read (its bytes just before that point changed: :data:`FINGERPRINT_BYTES` of them are kept) is read again from
    the start (``rewinds`` counts it); the reader of the records decides what a repeated step means."""

    def __init__(self, path: Path, max_line_bytes: int = MAX_LINE_BYTES, follow: bool = True) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes
        self.follow = follow  # False: a symbolic link at ``path`` is refused too (an earlier attempt's file, replayed)
        self._offset = 0
        self._ino: tuple[int, int] | None = None
        self._partial = bytearray()
        self._seen = b""  # the last FINGERPRINT_BYTES read, ending at _offset
        self._skipping = False  # inside a line already counted as too long: drop bytes up to its newline
        self.bad_lines = 0
        self.rewinds = 0

    def _open(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if self.follow else os.O_NOFOLLOW))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            if err.errno == errno.ELOOP and not self.follow:
                raise MetricsFileError(f"metrics file {self.path} is a symbolic link, not followed") from None
            raise MetricsFileError(f"metrics file {self.path} cannot be read: {err.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise MetricsFileError(f"metrics file {self.path} is not a regular file (a FIFO, device or directory)")
        ino = (st.st_dev, st.st_ino)
        if ((self._ino is not None and ino != self._ino) or st.st_size < self._offset
                or (self._seen and os.pread(fd, len(self._seen), self._offset - len(self._seen)) != self._seen)):
            self._offset, self._skipping, self.rewinds, self._seen = 0, False, self.rewinds + 1, b""
            self._partial.clear()
        self._ino = ino
        return fd

    def read(self) -> list[tuple[int, dict[str, float]]]:
        fd = self._open()
        if fd is None:
            return []
        out: list[tuple[int, dict[str, float]]] = []
        try:
            while True:
                chunk = os.pread(fd, READ_CHUNK_BYTES, self._offset)
                if not chunk:
                    break
                self._offset += len(chunk)
                self._seen = (self._seen + chunk[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]
                self._feed(chunk, out)
        finally:
            os.close(fd)
        return out

    def _feed(self, chunk: bytes, out: list[tuple[int, dict[str, float]]]) -> None:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not self._skipping:
                if len(self._partial) + len(piece) > self.max_line_bytes:
                    self.bad_lines += 1
                    self._skipping = True
                    self._partial.clear()
                else:
                    self._partial += piece
            if nl < 0:
                return
            if self._skipping:
                self._skipping = False
            elif self._partial.strip():
                rec = parse_line(bytes(self._partial))
                if rec is None:
                    self.bad_lines += 1
                else:
                    out.append(rec)
            self._partial.clear()
            start = nl + 1


