"""A memory cgroup per trial, where the kernel lets the driver create one.

Detection (once per driver process, :func:`mechanism`):

* **cgroup v2** (``cgroup2`` mount whose ``cgroup.controllers`` offers ``memory`` to children of the driver's
  own cgroup): ``memory.max`` (+ ``memory.swap.max`` = 0) is the hard cap, ``memory.oom.group`` = 1 makes the
  kernel kill the whole trial on OOM, ``memory.peak`` is the real peak, ``memory.events`` ``oom_kill`` confirms
  an OOM kill and ``cgroup.kill`` kills every process in it.
* **cgroup v1** (a writable ``memory`` hierarchy, as on these VMs): ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``) is the hard cap, ``memory.max_usage_in_bytes`` the peak, ``memory.oom_control``
  ``oom_kill`` confirms an OOM kill (``memory.failcnt`` where that counter is missing); processes are killed
  one by one from ``cgroup.procs``.
* neither (no permission, no memory controller, v2 without delegation): ``None``; the runner then polls.

A trial's cgroup is created as a child of the driver's own cgroup and named
``verl-hpo.<driver pid>.<driver start time>.<n>``, so cgroups of a dead driver are recognised and removed
(:func:`remove_stale`) and no other cgroup is ever touched. The trainer joins it between ``fork`` and ``exec``
(``hpo/execution/_trial_wrapper.py``), so all its descendants are in it from their first byte. The kernel charges the
page cache a trial reads to it too (reclaimed before an OOM kill, so it does not fail a trial, but the cgroup
peak includes it: the runner reports it as ``cgroup_peak_gb`` next to the processes' RSS peak).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpo.execution._trial_wrapper import cgroup_kill, cgroup_procs, signal_cgroup, start_time

PREFIX = "verl-hpo."
_NAME = re.compile(r"^verl-hpo\.(\d+)\.(\d+)\.(\d+)(?:\.ns(\d+))?$")  # pid, start, seq, pid namespace
_seq = itertools.count()
_lock = threading.Lock()
_detected: dict[str, CgroupMechanism | None] = {}


@dataclass(frozen=True)
class CgroupMechanism:
    """Where trial cgroups of this driver go: ``parent`` is the driver's own cgroup directory."""

    version: int  # 1 or 2
    parent: Path

    @property
    def name(self) -> str:
        return f"cgroup-v{self.version}"

    def create(self, limit_bytes: int | None) -> TrialCgroup:
        """A new, empty cgroup for one trial with ``limit_bytes`` as its hard memory cap (None: no cap)."""
        me = os.getpid()
        with _lock:
            path = self.parent / f"{PREFIX}{me}.{start_time(me)}.{next(_seq)}.ns{_pidns()}"
        path.mkdir()
        cg = TrialCgroup(self, path, limit_bytes)
        try:
            cg.configure()
        except OSError:
            cg.remove()
            raise
        return cg


class TrialCgroup:
    """One trial's cgroup (see the module docstring for the files used)."""

    def __init__(self, mechanism: CgroupMechanism, path: Path, limit_bytes: int | None) -> None:
        self.mechanism, self.path, self.limit_bytes = mechanism, path, limit_bytes

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def _keyed(self, name: str, key: str) -> int | None:
        """A value of a flat-keyed file such as ``memory.events`` or ``memory.oom_control``."""
        for line in (self._read(name) or "").splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit():
                return int(v)
        return None

    def configure(self) -> None:
        limit = self.limit_bytes
        if self.mechanism.version == 2:
            self._write("memory.max", "max" if limit is None else str(limit))
            if limit is not None and (self.path / "memory.swap.max").exists():
                self._write("memory.swap.max", "0")
            if (self.path / "memory.oom.group").exists():
                self._write("memory.oom.group", "1")
        else:
            self._write("memory.limit_in_bytes", "-1" if limit is None else str(limit))
            if (self.path / "memory.memsw.limit_in_bytes").exists():  # no swapping around the cap
                self._write("memory.memsw.limit_in_bytes", "-1" if limit is None else str(limit))

    def procs(self) -> list[int]:
        return cgroup_procs(str(self.path))

    def usage_bytes(self) -> int | None:
        raw = self._read("memory.current" if self.mechanism.version == 2 else "memory.usage_in_bytes")
        return int(raw) if raw and raw.strip().isdigit() else None

    def peak_bytes(self) -> int | None:
        """The kernel's peak of the cgroup (memory.peak needs Linux 5.19 on v2)."""
        raw = self._read("memory.peak" if self.mechanism.version == 2 else "memory.max_usage_in_bytes")
        return int(raw) if raw and raw.strip().isdigit() else None

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this cgroup."""
        if self.mechanism.version == 2:
            return (self._keyed("memory.events", "oom_kill") or 0) > 0
        kills = self._keyed("memory.oom_control", "oom_kill")  # Linux >= 4.13
        if kills is not None:
            return kills > 0
        raw = self._read("memory.failcnt")  # older kernels: the limit was hit at least once
        return bool(raw and raw.strip().isdigit() and int(raw) > 0)

    def kill(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup (v2: ``cgroup.kill``); True once it is empty."""
        deadline = time.monotonic() + wait_s
        while True:
            cgroup_kill(str(self.path))
            signal_cgroup(str(self.path), signal.SIGKILL)
            if not self.procs():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def remove(self) -> bool:
        """Kill what is left in it and remove the directory (retrying while the last tasks exit)."""
        if not self.path.exists():
            return True
        self.kill()
        for _ in range(100):
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.02)
        return False


# ----------------------------------------------------------------------------- detection
def own_cgroup_dir(version: int, proc_cgroup: str, mountinfo: str) -> Path | None:
    """The directory of this process's memory cgroup (v1) or unified cgroup (v2), from the text of
    /proc/self/cgroup and /proc/self/mountinfo; None when that hierarchy is not mounted here.

    The path in /proc/self/cgroup is relative to the hierarchy's root; a mount may show only a subtree of it
    (its "root" field, e.g. inside a container), so the directory is the mount point plus the path below it."""
    own = None
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (version == 2 and hid == "0" and not controllers) or (version == 1 and "memory" in controllers.split(",")):
            own = path
    if own is None:
        return None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if (version == 2 and fstype != "cgroup2") or (version == 1 and (fstype != "cgroup" or "memory" not in options)):
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        if root == "/" or own == root or own.startswith(root.rstrip("/") + "/"):
            below = own[len(root.rstrip("/")):].strip("/")
            return Path(point) / below if below else Path(point)
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _probe(mechanism: CgroupMechanism) -> bool:
    """Create, configure and remove a throwaway trial cgroup."""
    try:
        cg = mechanism.create(64 * 2**20)
    except OSError:
        return False
    ok = (cg.path / ("memory.max" if mechanism.version == 2 else "memory.limit_in_bytes")).exists()
    return cg.remove() and ok


def _v2() -> CgroupMechanism | None:
    parent = own_cgroup_dir(2, _read("/proc/self/cgroup"), _read("/proc/self/mountinfo"))
    if parent is None:
        return None
    try:
        if "memory" not in (parent / "cgroup.controllers").read_text().split():
            return None
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            # works in the root cgroup or a delegated, process-free one; a non-root cgroup that holds
            # processes (the driver itself) refuses it with EBUSY ("no internal processes")
            (parent / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return None
    return CgroupMechanism(2, parent)


def _v1() -> CgroupMechanism | None:
    parent = own_cgroup_dir(1, _read("/proc/self/cgroup"), _read("/proc/self/mountinfo"))
    return None if parent is None else CgroupMechanism(1, parent)


def mechanism(which: str = "auto") -> CgroupMechanism | None:
    """The usable cgroup mechanism of this driver process: ``auto`` (v2, else v1), ``cgroup-v2`` or
    ``cgroup-v1``; None when it is not usable. Checked once per process (a throwaway cgroup is created),
    and then cgroups left by dead drivers under the same parent are removed."""
    with _lock:
        if which in _detected:
            return _detected[which]
    found: CgroupMechanism | None = None
    for version, find in ((2, _v2), (1, _v1)):
        if which not in ("auto", f"cgroup-v{version}"):
            continue
        candidate = find()
        if candidate is not None and os.access(candidate.parent, os.W_OK) and _probe(candidate):
            found = candidate
            break
    if found is not None:
        remove_stale(found)
    with _lock:
        _detected[which] = found
    return found


def remove_stale(mechanism: CgroupMechanism) -> int:
    """Remove the trial cgroups (killing what runs in them) of drivers that no longer run; return how many."""
    removed = 0
    try:
        entries = list(mechanism.parent.iterdir())
    except OSError:
        return 0
    for path in entries:
        m = _NAME.match(path.name)
        if m is None or not path.is_dir():
            continue
        pid, started = int(m.group(1)), int(m.group(2))
        if m.group(4) is not None and int(m.group(4)) != _pidns():
            # a driver in another pid namespace (a container sharing this cgroup): its pid means nothing here,
            # so its trials are never killed; an empty leftover directory is removed (rmdir fails otherwise)
            try:
                path.rmdir()
                removed += 1
            except OSError:
                pass
            continue
        if start_time(pid) == started:  # that driver still runs (maybe this one)
            continue
        removed += TrialCgroup(mechanism, path, None).remove()
    return removed


def _pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0
