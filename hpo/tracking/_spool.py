"""The spool: what a driver tells its tracking process, one JSON line per event, in
``<studies-dir>/<study>/tracking/spool-<host>-<pid>-<start>.jsonl`` (append-only, never rewritten).

Events: ``{"ev": "start", "trial": N}`` (a trial's process is about to start), ``{"ev": "finish", "trial": N}`` (it
was told), ``{"ev": "end"}`` (the driver is done). Everything else the tracker needs it reads from the study's
storage (parameters, outcome attrs) and the trial's metrics file (the curves), so a line holds no secret and the
driver writes a few bytes per trial. Beside a spool: ``.state.json`` (the tracker's cursors, :mod:`._sync`),
``.log`` (the tracker's messages) and ``.lock`` (held while a tracker works on the spool)."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SPOOL_GLOB = "spool-*.jsonl"


def tracking_dir(studies_dir: Path, study_name: str) -> Path:
    return studies_dir / study_name / "tracking"


def host_part(host: str) -> str:
    """A host name as a spool's name holds it."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host)[:64]


def spool_path(directory: Path, identity: dict[str, Any]) -> Path:
    host = host_part(str(identity.get("host", "host")))
    return directory / f"spool-{host}-{identity.get('pid', os.getpid())}-{int(float(identity.get('started', 0)))}.jsonl"


def spool_driver(spool: Path) -> tuple[str, int, int] | None:
    """The host part, pid and start second that :func:`spool_path` put in ``spool``'s name; None for another name."""
    head, _, start = spool.name.removeprefix("spool-").removesuffix(".jsonl").rpartition("-")
    host, _, pid = head.rpartition("-")
    if not host or not pid.isdigit() or not start.isdigit():
        return None
    return host, int(pid), int(start)


def sidecar(spool: Path, suffix: str) -> Path:
    return spool.with_name(spool.name.removesuffix(".jsonl") + suffix)


class SpoolWriter:
    """Appends events (thread-safe; each line is one ``write`` of a complete line, flushed at once)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held for the driver's lifetime

    def event(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "t": round(time.time(), 3), **fields}) + "\n"
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line)
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class SpoolReader:
    """Reads complete lines past the last one read (a torn last line waits for its newline)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("ev"), str):
                out.append(rec)
        return out


@contextmanager
def spool_lock(spool: Path, wait: bool) -> Iterator[bool]:
    """Hold ``<spool>.lock`` (one tracker per spool); yields False when another holds it and ``wait`` is False."""
    fd = os.open(sidecar(spool, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def is_locked(spool: Path) -> bool:
    with spool_lock(spool, wait=False) as got:
        return not got
