"""A rehearsal stopped by a signal (issue 53 item 12): SIGTERM, SIGINT or SIGHUP stops its corners' runs as killed
trials are stopped, and each run's private scratch (``TMPDIR``: ``/tmp/vhpo-<uid>-<hash>-<attempt>`` when the trial
directory's path is too long for Ray's sockets) is removed as the run ends (:func:`stop_on_signals`). What a rehearsal
killed outright (SIGKILL, a second signal) left is removed by the next rehearsal of the experiment when it replaces
its home (:func:`sweep_scratch`): only the scratch of that home's own trial directories."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpo.backends.verl._launch import scratch_dir


def sweep_scratch(home: Path) -> int:
    """Remove the private scratch directories (``/tmp/vhpo-<uid>-<hash>-<attempt>``: an attempt's ``TMPDIR``, outside
    its trial directory when that path is too long for Ray's sockets) that the corners of the rehearsal in ``home``
    left when it was killed (SIGKILL, a second signal): only those of its own trial directories (the name is their
    hash), only this user's directories, never through a link. The number removed."""
    trials = home / "trials"
    try:
        entries = [] if trials.is_symlink() or not trials.is_dir() else sorted(trials.iterdir())
        root = trials.resolve()
    except OSError:
        return 0
    swept = 0
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue
        for attempt in range(2):  # the default corner's first attempt and its resume
            scratch = scratch_dir(root / entry.name, attempt)
            try:
                st = scratch.lstat()
            except OSError:
                continue
            if scratch.is_relative_to(root) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue  # inside the trial directory (goes with the home), a link, another user's
            shutil.rmtree(scratch, ignore_errors=True)
            swept += 1
    return swept


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(BaseException):
    """SIGTERM, SIGINT or SIGHUP stopped the rehearsal: raised in the main thread (a BaseException, so that no
    ``except Exception`` of a step takes it); the corners' threads see ``halt`` and stop their runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def stop_on_signals(halt: threading.Event, say: Callable[[str], None]) -> Iterator[None]:
    """While the rehearsal runs, a stop signal sets ``halt`` (each running corner is stopped as a killed trial is, and
    its scratch removed) and raises :class:`Stopped`; a second one exits at once (what it leaves is swept by the
    next rehearsal of the experiment, :func:`sweep_scratch`). Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if halt.is_set():
            say(f"{name} again: exiting now")
            os._exit(128 + signum)
        halt.set()
        say(f"{name}: stopping the rehearsal's runs and removing their scratch (again to exit now) ...")
        raise Stopped(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
