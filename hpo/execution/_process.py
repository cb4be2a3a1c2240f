"""The process tree of one trial: find its members and their memory, kill all of them (those that left the
process group too), sweep the orphans of a dead driver, and find the kernel's OOM kills of its processes.

Used by ``_runner`` (one trial) and ``_watchdog`` (its sampling thread); knows nothing of metrics or labels.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence

import psutil

from hpo.execution._identity import identity_alive
from hpo.execution._trial_wrapper import proc_stat

KILL_GRACE_S = 3.0  # SIGTERM -> SIGKILL
# Environment tags every trial process (and its descendants) inherits; used to sweep orphans.
ENV_STUDY = "VERL_HPO_STUDY"
ENV_TRIAL = "VERL_HPO_TRIAL"
ENV_DRIVER = "VERL_HPO_DRIVER"


# ----------------------------------------------------------------------------- process tree
def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss_bytes(procs: Sequence[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def kill_tree(popen: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM ``popen``'s process, its process group and every descendant (also those that left the group),
    wait ``grace_s``, then SIGKILL whatever is left. Returns once the direct child is reaped.

    The group is signalled with ``killpg`` only while its leader is not reaped (until then its pid, and so the
    group id, cannot belong to anyone else); members that outlive the leader are signalled through psutil
    handles taken before, which refuse a recycled pid."""
    procs: dict[int, psutil.Process] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if popen.poll() is None:
            procs.update((p.pid, p) for p in _tree_and_group(popen.pid))
            try:
                os.killpg(popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs.values():
            try:
                p.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        if sig == signal.SIGKILL:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if popen.poll() is not None and not any(_alive(p) for p in procs.values()):
                break
            time.sleep(0.05)
        else:
            continue
        break
    popen.wait()
    psutil.wait_procs([p for p in procs.values() if _alive(p)], timeout=grace_s)


def _tree_and_group(pid: int) -> list[psutil.Process]:
    """The descendants of ``pid`` and the members of its process group (not ``pid`` itself)."""
    found = {p.pid: p for p in tree(pid)[1:]}
    for p in psutil.process_iter():
        try:
            if p.pid != pid and p.pid not in found and os.getpgid(p.pid) == pid:
                found[p.pid] = p
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return list(found.values())


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sweep_orphans(study: str) -> int:
    """Kill processes tagged with this study whose driver is dead (left over from a SIGKILLed driver)."""
    killed = 0
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if env.get(ENV_STUDY) != study or ENV_DRIVER not in env:
            continue
        try:
            ident = json.loads(env[ENV_DRIVER])
        except ValueError:
            continue
        if identity_alive(ident) is False:
            try:
                p.kill()
                killed += 1
            except psutil.NoSuchProcess:
                pass
    return killed


# ----------------------------------------------------------------------------- memory
def memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in kB; (0, 0) when it is gone (or a zombie)."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rss, max(rss, hwm)


class ProcessTree:
    """The live descendants of ``root``, found incrementally: each tick lists /proc and reads the stat of new
    pids only (membership of a process never changes: a descendant whose parent dies is reparented to the
    wrapper, a subreaper, so it stays a descendant)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.members: dict[int, int] = {}  # pid -> start time
        self._others: set[int] = set()

    def scan(self) -> dict[int, int]:
        live = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        self.members = {p: t for p, t in self.members.items() if p in live}
        self._others &= live
        new = {}
        for pid in live - self.members.keys() - self._others - {self.root}:
            st = proc_stat(pid)
            if st is not None:
                new[pid] = st
        changed = True
        while changed:  # a new process may be the child of another new one
            changed = False
            for pid, (ppid, started, _) in list(new.items()):
                if ppid == self.root or ppid in self.members:
                    self.members[pid] = started
                    del new[pid]
                    changed = True
        self._others.update(new)
        return dict(self.members)


# ----------------------------------------------------------------------------- the kernel's OOM kills
def global_oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat, Linux >= 4.13)."""
    try:
        with open("/proc/vmstat") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


_KMSG_OOM = re.compile(r"(?:Killed process |oom-kill:.*?[,:]pid=)(\d+)")


def kernel_oom_killed(pids: set[int], since: float) -> bool:
    """Whether the kernel log (``/dev/kmsg``, needs root or CAP_SYSLOG) reports an OOM kill of one of ``pids``
    at or after ``since`` (a ``time.monotonic()``; both count from boot)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    since_us = (since - 1.0) * 1e6  # (the kernel's clock and CLOCK_MONOTONIC may differ slightly)
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BrokenPipeError:  # records overwritten while reading: go on
                continue
            except OSError:  # BlockingIOError: no more records
                return False
            if not record:
                return False
            header, _, text = record.partition(";")  # "priority,sequence,microseconds,flags;message"
            fields = header.split(",")
            m = _KMSG_OOM.search(text)
            if m and int(m.group(1)) in pids and len(fields) > 2 and fields[2].isdigit() and int(fields[2]) >= since_us:
                return True
    finally:
        os.close(fd)
