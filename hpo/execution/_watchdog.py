"""The watchdog thread of one trial: every ``MEMORY_TICK_S`` it samples the trial's memory (its cgroup's
processes, else its process tree), enforces the polled memory cap, the timeout and the stop event, and asks the
trial wrapper to stop the trial. It runs in its own thread, so metrics callbacks (storage writes that can wait a
minute on a busy SQLite file) never delay it. See ``_runner``'s module docstring for the memory mechanisms.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

from hpo.execution import _cgroup
from hpo.execution._process import ProcessTree, memory_kb
from hpo.execution._trial_wrapper import KILL_NOW_SIGNAL, signal_process

MEMORY_TICK_S = 0.1  # watchdog period: memory sampling (and the cap, without a cgroup), timeout, stop event


class WrapperHandle:
    """Signals to the wrapper process through a pidfd (safe after the main thread reaped it), else Popen."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        try:
            self.pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def send(self, sig: int) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                self.popen.send_signal(sig)
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        """Sleep ``timeout`` seconds, or less when the wrapper exits meanwhile (a pidfd turns readable)."""
        if self.pidfd is None:
            time.sleep(timeout)
        else:
            select.select([self.pidfd], [], [], timeout)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Watchdog(threading.Thread):
    """Every ``MEMORY_TICK_S``: sample the trial's memory, enforce the polled cap (``poll_limit``), the timeout
    and the stop event. Runs in its own thread, so nothing the metrics callbacks do can delay it."""

    def __init__(self, wrapper: WrapperHandle, cgroup: _cgroup.TrialCgroup | None, poll_limit: int | None,
                 timeout_s: float | None, stop_event: threading.Event | None, started: float) -> None:
        super().__init__(name=f"trial-watchdog-{wrapper.popen.pid}", daemon=True)
        self.wrapper, self.cgroup, self.poll_limit = wrapper, cgroup, poll_limit
        self.timeout_s, self.stop_event, self.started = timeout_s, stop_event, started
        self.tree = ProcessTree(wrapper.popen.pid)
        self.reason: str | None = None
        self.current_bytes = 0
        self.peak_bytes = 0
        self.seen: set[int] = set()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._members: dict[int, int] = {}

    def stop(self, reason: str, hard: bool = False) -> bool:
        """Ask the wrapper to stop the trial (SIGTERM, grace, SIGKILL), or with ``hard`` to SIGKILL it now.
        The first reason wins; returns whether this call set it."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
        if hard:
            self.wrapper.send(KILL_NOW_SIGNAL)  # the wrapper SIGKILLs the whole tree
            for pid, started in self._members.items():  # and so do we, without waiting for it
                signal_process(pid, started, signal.SIGKILL)
        else:
            self.wrapper.send(signal.SIGTERM)
        return True

    def sample(self) -> None:
        if self.cgroup is not None:
            members = {pid: -1 for pid in self.cgroup.procs()}
        else:
            members = self.tree.scan()
        rss = hwm = 0
        for pid in members:
            r, h = memory_kb(pid)
            rss, hwm = rss + r, hwm + h
        self._members = {p: t for p, t in members.items() if t >= 0}
        self.seen.update(members)
        self.current_bytes = rss * 1024
        self.peak_bytes = max(self.peak_bytes, hwm * 1024)
        if self.poll_limit is not None and hwm * 1024 > self.poll_limit:
            self.stop("memory", hard=True)
        elif self.cgroup is not None and self.cgroup.limit_bytes is not None and self.cgroup.oom_killed():
            self.stop("memory", hard=True)  # the kernel killed a process at the cap: the rest goes too (v1 has
            # no memory.oom.group), as the polled cap would have killed the whole trial

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            if self.timeout_s is not None and time.monotonic() - self.started > self.timeout_s:
                self.stop("timeout")
            if self.stop_event is not None and self.stop_event.is_set():
                self.stop("interrupted")
            self._done.wait(MEMORY_TICK_S)

    def close(self) -> None:
        self._done.set()
        self.join()
