"""The trial's log pump: the trainer's stdout and stderr go through pipes to this small process, which writes them to
``stdout.log`` / ``stderr.log`` capped at a stated size and counts, on the way, the lines that say the trainer dropped
a row of its data (every byte is seen before the cap cuts any).

Run (by ``hpo.execution._logs``, never by hand) as::

    python -I -S hpo/execution/_logpump.py --parent DRIVER_PID --cap BYTES [--pattern REGEX]... -- NAME=PIPE:FILE...

``PIPE`` and ``FILE`` are inherited file descriptors: a pipe's read end and the log file it fills. Stdlib only (it
imports nothing of ``hpo``), so the same classes serve the driver in-process for a Ray job's log
(:mod:`hpo.execution.ray_jobs._job`). The pump is a sibling of the trial wrapper, not a descendant: outside the trial's
process tree, session and memory cgroup, nothing that kills the trial kills it. It reads until every writer is gone
(end of file on both pipes: the wrapper kills the whole trial before it exits), or until the driver sends SIGTERM
(something outside the tree kept a pipe open), or for at most :data:`ORPHAN_DRAIN_S` once the driver is gone. It never
stops reading before that, whatever happens to the files (a full disk: what follows is dropped, and said), so the
trainer never blocks on a full pipe nor dies of a closed one. Its report is one JSON object on its stdout.

**The cap** (:class:`CappedLog`, ``cap`` bytes per log: ``$VERL_HPO_LOG_CAP_MIB``, default 16 MiB, 0 for none). A log
is written as it comes until it reaches the cap; then its first quarter (the head: start-up, the config, the first
error) stays, a line ``[verl-hpo: N bytes (M lines) cut here: ...]`` follows it, and after that the last half of the
cap at least (the tail: the trainer's last words, what failure labels read). Each cut keeps the file at most ``cap``
bytes; cuts fall on line boundaries where one is near. Every byte is written to the file at once (no buffer of the
pump's): what the pump has read survives its own SIGKILL; a SIGKILL in the middle of a cut leaves a file that still
ends with the last bytes received (the cut copies the newest bytes over older ones).

**Dropped rows** (:class:`RowCounter`): the trainer's own patterns (:attr:`hpo.backends.Backend.dropped_row_patterns`,
Python regular expressions searched in each line of both streams). A matching line counts one row; a named group
``n`` (e.g. Ray's ``[repeated 3x across cluster]``) counts that many; a named group ``key`` counts each value once
(several lines about one prompt). The first match is kept with the exception line of the traceback that follows it.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sys
import time

TYPE_CHECKING = False  # not `from typing import ...`: the pump starts as a bare interpreter
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

ENV_LOG_CAP = "VERL_HPO_LOG_CAP_MIB"  # each of a trial's stdout.log and stderr.log: at most this many MiB; 0: no cap
DEFAULT_LOG_CAP_MIB = 16
MIN_LOG_CAP_MIB = 1
CHUNK = 1 << 16  # bytes read from a pipe at a time
ALIGN = 1 << 16  # a cut moves to a line boundary within this many bytes
MAX_CARRY = 1 << 16  # a line longer than this is matched in pieces
AFTER_LINES = 400  # the first match's traceback is looked for in this many lines after it (a Ray task's: ~50)
TRACEBACK_WITHIN = 20  # ... and must start within this many
MAX_KEYS = 1 << 20  # distinct ``key`` values remembered (beyond: every line counts)
ORPHAN_DRAIN_S = 10.0  # the driver is gone: read on at most this long (the wrapper is killing the trial)
TICK_S = 0.25
_TRACEBACK = "Traceback (most recent call last):"
_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")


def log_cap(environ: Mapping[str, str] | None = None) -> int | None:
    """Bytes per log from ``$VERL_HPO_LOG_CAP_MIB`` (default 16 MiB); None: no cap (``0``). ValueError (one line,
    naming the variable and its value) for anything else than a number >= 1 or 0."""
    raw = (os.environ if environ is None else environ).get(ENV_LOG_CAP, "").strip()
    if not raw:
        return DEFAULT_LOG_CAP_MIB << 20
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if mib == 0:
        return None
    if not (MIN_LOG_CAP_MIB <= mib < 2**40):
        raise ValueError(f"{ENV_LOG_CAP}={raw!r}: expected a number of MiB >= {MIN_LOG_CAP_MIB} (the cap of each of "
                         f"a trial's stdout.log and stderr.log; default {DEFAULT_LOG_CAP_MIB}), or 0 for no cap")
    return int(mib * (1 << 20))


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    parts = []
    while size > 0:
        got = os.pread(fd, min(size, 1 << 22), offset)
        if not got:
            break
        parts.append(got)
        size, offset = size - len(got), offset + len(got)
    return b"".join(parts)


def _newlines(fd: int, start: int, end: int) -> int:
    n = 0
    while start < end:
        got = os.pread(fd, min(end - start, 1 << 22), start)
        if not got:
            break
        n += got.count(b"\n")
        start += len(got)
    return n


class CappedLog:
    """A log file (``fd``, written from its current end) of at most ``cap`` bytes (None: no cap): head, a line saying
    what was cut, tail (see the module docstring). ``write`` never raises: a write error (a full disk) is kept in
    ``error`` and what follows is dropped."""

    def __init__(self, fd: int, cap: int | None) -> None:
        self.fd, self.cap = fd, cap
        self.size = os.fstat(fd).st_size  # bytes in the file (a Ray job's log may be appended to)
        self.received = self.size  # bytes given to the log, the file's earlier ones included
        self.newlines = _newlines(fd, 0, self.size) if self.size and cap is not None else 0
        self.head_end: int | None = None  # set at the first cut: the head is [0, head_end), the cut line follows
        self.head_newlines = 0
        self.head_nl = True  # the head ends a line
        self.cut_bytes = 0
        self.cut_lines = 0
        self.error: str | None = None

    def write(self, data: bytes) -> None:
        self.received += len(data)
        if self.cap is not None:
            self.newlines += data.count(b"\n")
        if self.error is not None or not data:
            return
        try:
            _pwrite_all(self.fd, data, self.size)
            self.size += len(data)
            if self.cap is not None and self.size > self.cap:
                self._cut(self.cap)
        except OSError as e:
            self.error = f"{e.strerror or e}; the rest of this log was dropped"

    def marker(self) -> bytes:
        assert self.cap is not None
        return ((b"" if self.head_nl else b"\n") + (
            f"[verl-hpo: {self.cut_bytes} bytes ({self.cut_lines} lines) cut here: this log went over its cap of "
            f"{self.cap / (1 << 20):g} MiB (${ENV_LOG_CAP}); its head and its tail are kept]\n").encode())

    def _cut(self, cap: int) -> None:
        if self.head_end is None:
            want = cap // 4
            window = min(ALIGN, want // 4)
            before = os.pread(self.fd, window, want - window)
            nl = before.rfind(b"\n")
            self.head_end = want - window + nl + 1 if nl >= 0 else want
            self.head_nl = self.head_end == 0 or os.pread(self.fd, 1, self.head_end - 1) == b"\n"
            self.head_newlines = _newlines(self.fd, 0, self.head_end)
        keep = cap // 2
        kept = _pread_all(self.fd, keep, self.size - keep)
        nl = kept.find(b"\n", 0, min(ALIGN, keep // 4))
        if nl >= 0:
            kept = kept[nl + 1:]
        self.cut_bytes = self.received - self.head_end - len(kept)
        self.cut_lines = self.newlines - self.head_newlines - kept.count(b"\n")
        out = self.marker() + kept  # the newest bytes end where they were: a kill mid-copy leaves them last
        _pwrite_all(self.fd, out, self.head_end)
        self.size = self.head_end + len(out)
        os.ftruncate(self.fd, self.size)

    def report(self) -> dict[str, object]:
        return {"bytes": self.received, "cut_bytes": self.cut_bytes, "cut_lines": self.cut_lines,
                "error": self.error}


class _Lines:
    """One stream's bytes cut into complete lines for :class:`RowCounter` (the last, partial line is carried)."""

    def __init__(self, counter: RowCounter, sid: int) -> None:
        self.counter, self.sid = counter, sid
        self.carry = b""

    def feed(self, data: bytes) -> None:
        buf = self.carry + data
        end = buf.rfind(b"\n") + 1
        self.carry = buf[end:][-MAX_CARRY:]
        if end:
            self.counter.scan(buf[:end], self.sid)

    def finish(self) -> None:
        if self.carry:
            self.counter.scan(self.carry + b"\n", self.sid)
            self.carry = b""


class RowCounter:
    """The rows a trainer says it dropped, counted over every line of its streams (see the module docstring)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = [re.compile(p.encode("utf-8")) for p in patterns]
        self.count = 0
        self.keys: set[bytes] = set()
        self.first: str | None = None  # the first matching line, from its match on
        self._after: list[bytes] | None = None  # the lines after it (its traceback)
        self._after_sid = -1
        self.error: str | None = None

    def lines(self, sid: int) -> _Lines:
        """A line splitter for stream ``sid`` feeding this counter."""
        return _Lines(self, sid)

    def scan(self, block: bytes, sid: int) -> None:
        """Count the matching lines of ``block`` (complete lines of stream ``sid``)."""
        following = self._after is not None and self._after_sid == sid and len(self._after) < AFTER_LINES
        if following:
            assert self._after is not None
            self._after.extend(block.split(b"\n", AFTER_LINES)[:AFTER_LINES - len(self._after)])
        if not self.patterns:
            return
        counted: set[int] = set()
        for pat in self.patterns:
            for m in pat.finditer(block):
                start = block.rfind(b"\n", 0, m.start()) + 1
                if start in counted:  # one line, one row (whichever patterns match it)
                    continue
                counted.add(start)
                groups = m.groupdict()
                key = groups.get("key")
                if key is not None:
                    if key in self.keys:
                        continue
                    if len(self.keys) < MAX_KEYS:
                        self.keys.add(key)
                n = groups.get("n")
                self.count += int(n) if n is not None and n.isdigit() and len(n) < 10 else 1
                if self.first is None:
                    end = block.find(b"\n", m.end())
                    self.first = _text(block[m.start():end])
                    self._after = block[end + 1:].split(b"\n", AFTER_LINES)[:AFTER_LINES]
                    self._after_sid = sid

    def exception(self) -> str | None:
        """The exception line of the traceback that follows the first match (within :data:`TRACEBACK_WITHIN` lines;
        lines of the traceback are those with its own prefix, e.g. Ray's ``(Worker pid=N)``), else None: its last
        unindented line before the next unindented one, so a remote task's error (Ray's ``RayTaskError(ValueError):
        ...`` followed by the task's own frames) gives the task's exception, ``ValueError: ...``."""
        lines = [_text(line) for line in self._after or []]
        for i, line in enumerate(lines[:TRACEBACK_WITHIN]):
            at = line.find(_TRACEBACK)
            if at < 0:
                continue
            prefix = line[:at]
            found: str | None = None
            for later in lines[i + 1:]:
                if not later.startswith(prefix):
                    continue  # another process's line, interleaved
                body = later[len(prefix):]
                if not body or body[0].isspace():  # a frame of the traceback (of a nested one after ``found``)
                    if found is not None and body.strip():
                        found = None if body.lstrip().startswith("File ") else found
                    continue
                if found is not None:
                    return found  # an unindented line after an unindented one: the traceback has ended
                found = body.strip()
            return found
        return None

    def report(self) -> dict[str, object]:
        return {"count": self.count, "first": self.first, "exception": self.exception(), "error": self.error}


def _text(raw: bytes) -> str:
    return _ANSI.sub(b"", raw).decode("utf-8", "replace").rstrip()[:2000]


# ----------------------------------------------------------------------------- the pump process
class _Stream:
    def __init__(self, name: str, pipe: int, log: CappedLog, lines: _Lines) -> None:
        self.name, self.pipe, self.log, self.lines = name, pipe, log, lines

    def feed(self, data: bytes) -> None:
        self.log.write(data)
        try:
            self.lines.feed(data)
        except Exception as e:  # noqa: BLE001 - counting must never stop the reading
            self.lines.counter.error = f"{type(e).__name__}: {e}"
            self.lines.counter.patterns = []


def _parse(argv: Sequence[str]) -> tuple[int, int | None, list[str], list[tuple[str, int, int]]]:
    if "--" not in argv:
        raise SystemExit("usage: _logpump.py --parent PID --cap BYTES [--pattern RE]... -- NAME=PIPE:FILE...")
    split = list(argv).index("--")
    opts, specs = list(argv[:split]), list(argv[split + 1:])
    parent, cap, patterns = 0, None, []
    for i in range(0, len(opts) - 1, 2):
        if opts[i] == "--parent":
            parent = int(opts[i + 1])
        elif opts[i] == "--cap":
            cap = int(opts[i + 1]) or None
        elif opts[i] == "--pattern":
            patterns.append(opts[i + 1])
    streams = []
    for spec in specs:
        name, _, fds = spec.partition("=")
        pipe, _, file = fds.partition(":")
        streams.append((name, int(pipe), int(file)))
    return parent, cap, patterns, streams


def main(argv: Sequence[str]) -> None:
    parent, cap, patterns, specs = _parse(argv)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the driver's to handle; the pump reads on
    counter = RowCounter(patterns)
    streams = {pipe: _Stream(name, pipe, CappedLog(file, cap), counter.lines(i))
               for i, (name, pipe, file) in enumerate(specs)}
    done: list[_Stream] = []
    poller = select.poll()
    for pipe in streams:
        poller.register(pipe, select.POLLIN)
    orphaned: float | None = None
    while streams and not stop:
        for pipe, _ in poller.poll(TICK_S * 1000):
            stream = streams[pipe]
            try:
                data = os.read(pipe, CHUNK)
            except OSError:
                data = b""
            if data:
                stream.feed(data)
            else:
                poller.unregister(pipe)
                done.append(streams.pop(pipe))
        if os.getppid() != parent:  # the driver is gone: its wrapper is killing the trial; read what comes
            orphaned = orphaned or time.monotonic()
            if time.monotonic() - orphaned > ORPHAN_DRAIN_S:
                break
    for stream in list(streams.values()):  # told to stop (or orphaned): what is in the pipe now, then no more
        os.set_blocking(stream.pipe, False)
        try:
            while data := os.read(stream.pipe, CHUNK):
                stream.feed(data)
        except OSError:
            pass
        done.append(stream)
    for stream in done:
        try:
            stream.lines.finish()
        except Exception as e:  # noqa: BLE001 - the report still goes out
            counter.error = f"{type(e).__name__}: {e}"
        os.close(stream.pipe)
    report = {"logs": {s.name: s.log.report() for s in done}, "rows": counter.report()}
    try:
        os.write(1, json.dumps(report).encode() + b"\n")
    except OSError:
        pass


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:  # pragma: no cover - the driver is gone
        os._exit(0)
