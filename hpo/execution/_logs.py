"""The driver's side of a trial's logs: the log pump (:mod:`hpo.execution._logpump`) started beside the trial wrapper,
the write ends of its pipes for the wrapper's stdout and stderr, and its report once the trial is over: which log went
over its cap (and how much was cut), write errors, and the rows the trainer said it dropped.

Why a process of its own and not a thread: the driver runs several trials in threads of one interpreter, and a chatty
trainer (hundreds of MB) would hold its lock; the wrapper stays the bare interpreter it is (signals handled
synchronously, nothing else to do). Why not in the trial's tree: what kills the trial (its memory cap, the wrapper's
sweep, a user's ``kill -9`` of its session) must not kill the reader of its last words.

Knobs (the driver's environment): ``$VERL_HPO_LOG_CAP_MIB`` (:func:`~hpo.execution._logpump.log_cap`: each log's cap,
default 16 MiB, 0 for none) and ``$VERL_HPO_MAX_DROPPED_ROWS`` (:func:`max_dropped_rows`: a trial whose trainer dropped
more rows than this fails, default 10).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.execution._logpump import ENV_LOG_CAP, CappedLog, RowCounter, log_cap

__all__ = ["ENV_LOG_CAP", "ENV_MAX_DROPPED", "CappedText", "LogPump", "LogReport", "knob_problem", "log_cap",
           "max_dropped_rows"]

PUMP = Path(__file__).with_name("_logpump.py")
PUMP_WAIT_S = 10.0  # once the wrapper is gone, the pump's end of file comes at once; SIGTERM after this long
PIPE_BYTES = 1 << 20  # each pipe's buffer (where the kernel allows): a burst of output does not wait on the pump
ENV_MAX_DROPPED = "VERL_HPO_MAX_DROPPED_ROWS"
DEFAULT_MAX_DROPPED = 10
LOGS = ("stdout.log", "stderr.log")


def max_dropped_rows(environ: Mapping[str, str] | None = None) -> int:
    """How many rows a trial's trainer may drop before the trial fails (``$VERL_HPO_MAX_DROPPED_ROWS``, default
    :data:`DEFAULT_MAX_DROPPED`; a count: the driver cannot know how many rows a trainer saw). ValueError (one line)
    for anything but a whole number >= 0."""
    raw = (os.environ if environ is None else environ).get(ENV_MAX_DROPPED, "").strip()
    if not raw:
        return DEFAULT_MAX_DROPPED
    if not raw.isdigit() or len(raw) > 12:
        raise ValueError(f"{ENV_MAX_DROPPED}={raw!r}: expected a whole number >= 0 (a trial whose trainer dropped more "
                         f"rows of its data than this fails; default {DEFAULT_MAX_DROPPED})")
    return int(raw)


def knob_problem() -> str | None:
    """The line refusing a bad ``$VERL_HPO_LOG_CAP_MIB`` or ``$VERL_HPO_MAX_DROPPED_ROWS`` of this process (None:
    both fine), for a command to say before it makes anything."""
    try:
        log_cap()
        max_dropped_rows()
    except ValueError as err:
        return str(err)
    return None


def check_patterns(patterns: Sequence[str]) -> None:
    """ValueError (one line) for a dropped-row pattern that is not a regular expression."""
    for i, p in enumerate(patterns):
        try:
            re.compile(p.encode("utf-8"))
        except (re.error, UnicodeError) as e:
            raise ValueError(f"dropped_row_patterns[{i}] {p!r}: not a regular expression ({e})") from None


@dataclass
class LogReport:
    """What the pump (or a Ray job's :class:`CappedText`) saw of a trial's output."""

    cut: dict[str, int] = field(default_factory=dict)  # a log that went over its cap -> bytes cut from its middle
    notes: list[str] = field(default_factory=list)  # a line for the user per cut log, write error, pump failure
    dropped_rows: int = 0
    dropped_rows_error: str | None = None  # the first dropped row's exception line (else its own line)

    def add_log(self, name: str, path: Path, rep: dict[str, Any], cap: int | None) -> None:
        cut = rep.get("cut_bytes")
        if isinstance(cut, int) and cut > 0 and cap is not None:
            self.cut[name] = cut
            self.notes.append(f"{name} went over its cap of {cap / 2**20:g} MiB (${ENV_LOG_CAP}): "
                              f"{cut / 1e6:.1f} MB ({rep.get('cut_lines')} lines) of its middle cut, head and tail "
                              f"kept in {path}")
        if rep.get("error"):
            self.notes.append(f"{name}: {rep['error']} ({path})")

    def add_rows(self, rep: dict[str, Any]) -> None:
        count = rep.get("count")
        self.dropped_rows = count if isinstance(count, int) and count > 0 else 0
        first, exc = rep.get("first"), rep.get("exception")
        if self.dropped_rows and isinstance(first, str):
            self.dropped_rows_error = f"{exc} (after: {first})" if isinstance(exc, str) and exc else first
        if rep.get("error"):
            self.notes.append(f"counting dropped rows stopped: {rep['error']}")


class LogPump:
    """The pump of one trial: started before the wrapper (:attr:`stdout`, :attr:`stderr` are the write ends to give
    it), :meth:`spawned` once the wrapper has them, :meth:`finish` once the wrapper is gone."""

    def __init__(self, log_dir: Path, cap: int | None, patterns: Sequence[str] = ()) -> None:
        check_patterns(patterns)
        self.log_dir, self.cap = log_dir, cap
        ours: list[int] = []  # fds the driver closes once the pump has them
        self.writes: list[int] = []
        specs: list[str] = []
        try:
            for name in LOGS:
                file = os.open(log_dir / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                ours.append(file)
                r, w = os.pipe()
                ours.append(r)
                self.writes.append(w)
                with contextlib.suppress(OSError, AttributeError):
                    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                specs.append(f"{name}={r}:{file}")
            argv = [sys.executable, "-I", "-S", str(PUMP), "--parent", str(os.getpid()), "--cap", str(cap or 0)]
            for p in patterns:
                argv += ["--pattern", p]
            self.proc = subprocess.Popen(
                [*argv, "--", *specs], pass_fds=ours, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except BaseException:
            self._close(self.writes)
            raise
        finally:
            self._close(ours)
        self.stdout, self.stderr = self.writes

    @staticmethod
    def _close(fds: list[int]) -> None:
        while fds:
            with contextlib.suppress(OSError):
                os.close(fds.pop())

    def spawned(self) -> None:
        """The wrapper holds the write ends now: the driver's copies go (the pump's end of file is the trial's)."""
        self._close(self.writes)

    def finish(self) -> LogReport:
        """Wait for the pump's report (SIGTERM after :data:`PUMP_WAIT_S`: something outside the trial holds a pipe)."""
        self._close(self.writes)
        report = LogReport()
        try:
            out, err = self.proc.communicate(timeout=PUMP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                out, err = self.proc.communicate(timeout=PUMP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
        try:
            data = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
            for name in LOGS:
                report.add_log(name, self.log_dir / name, data["logs"][name], self.cap)
            report.add_rows(data["rows"])
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            why = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit {self.proc.returncode}"])[-1]
            report.notes.append(f"the log pump left no report ({why[:300]}): its logs may be incomplete, "
                                "dropped rows were not counted")
        return report


class CappedText:
    """A text log for the driver's own writes (a Ray job's log lines): :class:`CappedLog` and :class:`RowCounter`
    in-process, with :meth:`write` and :meth:`flush` of a text file (what is written is in the file after a
    ``flush``, or once :data:`BUFFER` bytes wait)."""

    BUFFER = 1 << 16

    def __init__(self, path: Path, cap: int | None, patterns: Sequence[str] = ()) -> None:
        check_patterns(patterns)
        self.path, self.cap = path, cap
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.log = CappedLog(self.fd, cap)
        self.counter = RowCounter(patterns)
        self.lines = self.counter.lines(0)
        self.pending = bytearray()

    def write(self, text: str) -> None:
        self.pending += text.encode("utf-8", "replace")
        if len(self.pending) >= self.BUFFER:
            self.flush()

    def flush(self) -> None:
        data, self.pending = bytes(self.pending), bytearray()
        self.log.write(data)
        self.lines.feed(data)

    def close(self) -> LogReport:
        """Close the file; what was cut and counted."""
        self.flush()
        self.lines.finish()
        os.close(self.fd)
        report = LogReport()
        report.add_log(self.path.name, self.path, self.log.report(), self.cap)
        report.add_rows(self.counter.report())
        return report
