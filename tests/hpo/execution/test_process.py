"""A trial's process tree (:mod:`hpo.execution._process`), with real processes: its members and their memory, a kill
that reaches the process group and the descendants that left it, the sweep of a dead driver's orphans (and only
theirs), the incremental scan the watchdog uses, and the kernel's OOM records. Every wait is on a state, never a
fixed time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from hpo.execution._identity import driver_identity
from hpo.execution._process import (
    ENV_DRIVER,
    ENV_STUDY,
    ProcessTree,
    global_oom_kills,
    kernel_oom_killed,
    kill_tree,
    memory_kb,
    sweep_orphans,
    tree,
    tree_rss_bytes,
)

PY = sys.executable
WAIT_S = 60.0
pytestmark = pytest.mark.timeout(180)  # a kill that never returns fails, not hangs

# a parent that starts a child in its process group and one in a session of its own (which leaves the group), writes
# their pids, then waits (a child that dies is reaped at once, as the trial wrapper reaps); ``ignore`` makes every one
# of them ignore SIGTERM
FAMILY = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, sys, time\\nif sys.argv[1] == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" \\
       "time.sleep(600)"
kids = [subprocess.Popen([sys.executable, "-c", code, sys.argv[2]]),
        subprocess.Popen([sys.executable, "-c", code, sys.argv[2]], start_new_session=True)]
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(" ".join(str(k.pid) for k in kids))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def wait_until(pred: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _family(tmp_path: Path, mode: str = "plain") -> tuple[subprocess.Popen[bytes], list[int]]:
    pids = tmp_path / "pids"
    proc = subprocess.Popen([PY, "-c", FAMILY, str(pids), mode], start_new_session=True)
    wait_until(pids.exists, "the family's pids")
    return proc, [int(p) for p in pids.read_text().split()]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_tree_and_its_memory(tmp_path: Path) -> None:
    proc, kids = _family(tmp_path)
    try:
        members = tree(proc.pid)
        assert [p.pid for p in members][0] == proc.pid and set(kids) <= {p.pid for p in members}
        assert tree_rss_bytes(members) >= sum(psutil.Process(p).memory_info().rss for p in kids)
    finally:
        kill_tree(proc, grace_s=5)
    assert tree(proc.pid) == [] and tree_rss_bytes(members) == 0  # gone: nothing, no error


@pytest.mark.parametrize("mode", ["plain", "ignore"])
def test_kill_tree_reaches_the_group_and_the_child_that_left_it(tmp_path: Path, mode: str) -> None:
    """SIGTERM first; what ignores it gets SIGKILL after the grace period. The kill returns with the child reaped."""
    proc, kids = _family(tmp_path, mode)
    assert os.getpgid(kids[1]) != proc.pid  # the second child left the group
    kill_tree(proc, grace_s=0.5)  # (one that never returns: the module's timeout)
    assert proc.returncode == (-signal.SIGKILL if mode == "ignore" else -signal.SIGTERM)
    wait_until(lambda: all(_gone(k) for k in kids), "the children to die")  # killed: on their own, in 600 s


def test_sweep_orphans_kills_a_dead_driver_s_processes_of_that_study_only(tmp_path: Path) -> None:
    study = f"sweep-{uuid.uuid4().hex[:8]}"
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    dead = {**driver_identity(), "pid": gone.pid}  # a driver whose pid is no longer its process
    sleep = [PY, "-c", "import time; time.sleep(600)"]
    procs = {name: subprocess.Popen(sleep, env={**os.environ, ENV_STUDY: s, ENV_DRIVER: json.dumps(ident)})
             for name, s, ident in (("orphan", study, dead), ("live", study, driver_identity()),
                                    ("other", study + "-x", dead))}
    procs["untagged"] = subprocess.Popen(sleep, env={**os.environ, ENV_STUDY: study})
    try:
        wait_until(lambda: all(ENV_STUDY in psutil.Process(p.pid).environ() for p in procs.values()),
                   "the processes' environments")
        assert sweep_orphans(study) == 1
        assert procs["orphan"].wait(timeout=WAIT_S) == -signal.SIGKILL
        assert all(procs[n].poll() is None for n in ("live", "other", "untagged"))
        assert sweep_orphans(study) == 0
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_memory_of_a_process_and_of_one_that_is_gone() -> None:
    rss, hwm = memory_kb(os.getpid())
    assert 0 < rss <= hwm
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    assert memory_kb(gone.pid) == (0, 0)


def test_the_scan_finds_descendants_as_they_come_and_drops_them_as_they_go(tmp_path: Path) -> None:
    proc, kids = _family(tmp_path)
    try:
        scan = ProcessTree(proc.pid)
        wait_until(lambda: set(kids) <= set(scan.scan()), "the scan to find both children")
        assert proc.pid not in scan.members  # the root itself is not a member
        os.kill(kids[0], signal.SIGKILL)
        wait_until(lambda: kids[0] not in scan.scan(), "the killed child to leave the members")
        assert kids[1] in scan.members
    finally:
        kill_tree(proc, grace_s=5)


def test_the_kernel_s_oom_records() -> None:
    kills = global_oom_kills()
    assert kills is None or kills >= 0
    if Path("/proc/vmstat").exists() and "oom_kill " in Path("/proc/vmstat").read_text():
        assert isinstance(kills, int)
    assert kernel_oom_killed({os.getpid()}, time.monotonic()) is False  # never OOM-killed: we are running
