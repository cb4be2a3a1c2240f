"""Trial cgroups: the hard cap, removal after the trial, and removal of those a dead driver left behind.
Skipped where the kernel does not let this process create memory cgroups."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from hpo.execution import TrialProcess, TrialRun, _cgroup, kernel_oom_killed
from hpo.execution._trial_wrapper import start_time
from tests.hpo.conftest import PY

MECHANISM = _cgroup.mechanism()
needs_cgroup = pytest.mark.skipif(MECHANISM is None, reason="no usable memory cgroup here")


def ours(pid: int) -> list[Path]:
    assert MECHANISM is not None
    return list(MECHANISM.parent.glob(f"{_cgroup.PREFIX}{pid}.*"))


@needs_cgroup
def test_hard_cap_catches_a_1ms_spike_of_a_short_lived_grandchild(tmp_path: Path) -> None:
    """What polling cannot see: a grandchild that allocates 300 MB and exits at once. The kernel stops it."""
    assert MECHANISM is not None
    code = ("import subprocess, sys; r = subprocess.run([sys.executable, '-c', "
            "'b = bytearray(300 * 2**20); b[::4096] = b\"x\" * len(b[::4096])']); sys.exit(r.returncode)")
    metrics = tmp_path / "m.jsonl"
    result = TrialProcess(TrialRun([PY, "-c", code], dict(os.environ), tmp_path, metrics, memory_limit_gb=0.1)).run()
    assert result.memory_mechanism == MECHANISM.name
    assert result.kernel_oom and result.stop == "memory" and result.failure == "oom"
    # the trainer exits 247 (its child's -9) or, first, is SIGKILLed by the driver: v1 has no memory.oom.group
    assert result.exit_code in (256 - 9, -9)
    assert ours(os.getpid()) == []


@needs_cgroup
def test_trial_cgroups_are_removed(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    for _ in range(2):
        result = TrialProcess(TrialRun([PY, "-c", "pass"], dict(os.environ), tmp_path, metrics)).run()
        assert result.exit_code == 0 and result.memory_mechanism == MECHANISM.name  # type: ignore[union-attr]
    assert ours(os.getpid()) == []


@needs_cgroup
def test_stale_cgroups_of_a_dead_driver_are_removed() -> None:
    """A cgroup named after a driver that no longer runs is emptied (its processes killed) and removed; one
    of a live driver is left alone."""
    assert MECHANISM is not None
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead_started = start_time(dead.pid)
    dead.wait()
    stale = MECHANISM.parent / f"{_cgroup.PREFIX}{dead.pid}.{dead_started}.0"
    live = MECHANISM.parent / f"{_cgroup.PREFIX}{os.getpid()}.{start_time(os.getpid())}.999999"
    stale.mkdir()
    live.mkdir()
    sleeper = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        (stale / "cgroup.procs").write_text(str(sleeper.pid))
        assert _cgroup.remove_stale(MECHANISM) >= 1
        assert not stale.exists() and live.exists()
        assert sleeper.wait(timeout=5) == -9
    finally:
        sleeper.kill()
        live.rmdir()
        if stale.exists():
            _cgroup.TrialCgroup(MECHANISM, stale, None).remove()


@needs_cgroup
def test_peak_and_oom_counter_of_a_cgroup() -> None:
    assert MECHANISM is not None
    cg = MECHANISM.create(50 * 2**20)
    try:
        code = "import sys; sys.stdin.read(1); b = bytearray(30 * 2**20); b[::4096] = b'x' * len(b[::4096])"
        proc = subprocess.Popen([PY, "-c", code], stdin=subprocess.PIPE)
        (cg.path / "cgroup.procs").write_text(str(proc.pid))
        proc.communicate(b"x")
        assert proc.returncode == 0
        assert not cg.oom_killed()
        peak = cg.peak_bytes()
        assert peak is not None and 30 * 2**20 < peak <= 50 * 2**20
        proc = subprocess.Popen([PY, "-c", code.replace("30 *", "80 *")], stdin=subprocess.PIPE)
        (cg.path / "cgroup.procs").write_text(str(proc.pid))
        t = time.monotonic()
        proc.communicate(b"x")
        assert proc.returncode == -9 and cg.oom_killed()  # killed by the kernel, where it would have exited 0
        if os.access("/dev/kmsg", os.R_OK):  # the confirmation used where a trial has no cgroup of its own
            assert kernel_oom_killed({proc.pid}, since=t)
            assert not kernel_oom_killed({proc.pid}, since=time.monotonic() + 5)
    finally:
        assert cg.remove()
    assert not cg.path.exists()


# what these VMs show: v1 hierarchies + a cgroup2 mount without controllers, the process in a nested v1 cgroup
HYBRID_CGROUP = "4:memory:/process_api/188a\n1:cpu:/\n0::/\n"
HYBRID_MOUNTINFO = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# a container with its own cgroup namespace view: the mount shows only the container's subtree
CONTAINER_CGROUP = "0::/docker/abc/sub\n"
CONTAINER_MOUNTINFO = "600 590 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw,nsdelegate\n"


def test_own_cgroup_dir_from_proc_files() -> None:
    assert _cgroup.own_cgroup_dir(1, HYBRID_CGROUP, HYBRID_MOUNTINFO) == Path("/sys/fs/cgroup/memory/process_api/188a")
    assert _cgroup.own_cgroup_dir(2, HYBRID_CGROUP, HYBRID_MOUNTINFO) == Path("/sys/fs/cgroup/unified")
    assert _cgroup.own_cgroup_dir(2, CONTAINER_CGROUP, CONTAINER_MOUNTINFO) == Path("/sys/fs/cgroup/sub")
    assert _cgroup.own_cgroup_dir(1, CONTAINER_CGROUP, CONTAINER_MOUNTINFO) is None  # no v1 memory hierarchy
    assert _cgroup.own_cgroup_dir(2, "0::/elsewhere\n", CONTAINER_MOUNTINFO) is None  # not below the mount


def test_mechanism_matches_what_the_kernel_offers() -> None:
    """v2 only with a memory controller in the driver's unified cgroup; the probe leaves nothing behind."""
    v2 = _cgroup.mechanism("cgroup-v2")
    if v2 is not None:
        assert "memory" in (v2.parent / "cgroup.subtree_control").read_text().split()
    if MECHANISM is not None:
        assert MECHANISM.name in ("cgroup-v1", "cgroup-v2") and ours(os.getpid()) == []
