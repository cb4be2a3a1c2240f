"""Who runs a trial, and whether that driver is known to be alive (:mod:`hpo.execution._identity`): a pid is judged
only where it means the same process (same host, boot and pid namespace), and a reused pid (another start time) is
not the driver. Moved here from ``tests/hpo/study/test_distributed.py``, with the identity's own fields."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hpo.execution._identity import boot_id, comparable, driver_identity, identity_alive, pid_namespace

PY = sys.executable


def test_the_identity_of_this_process() -> None:
    ident = driver_identity()
    assert ident["pid"] == os.getpid() and ident["host"] == socket.gethostname()
    assert ident["started"] == psutil.Process().create_time()
    assert ident["boot_id"] == boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert ident["pidns"] == pid_namespace() == os.stat("/proc/self/ns/pid").st_ino
    assert comparable(ident)


def test_a_pid_is_judged_only_where_it_is_comparable() -> None:
    me = driver_identity()
    assert identity_alive(me) is True
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    assert identity_alive({**me, "pid": gone.pid, "started": time.time()}) is False
    for key, other in (("host", "elsewhere"), ("boot_id", "another-boot"), ("pidns", 1), ("boot_id", None)):
        assert identity_alive({**me, key: other, "pid": gone.pid}) is None, key  # only a heartbeat can tell


def test_a_live_pid_with_another_start_time_is_not_the_driver() -> None:
    me = driver_identity()
    assert identity_alive({**me, "started": me["started"] - 3600}) is False  # the pid was reused since
    assert identity_alive({**me, "started": me["started"] + 0.5}) is True  # the clock's rounding is not a new process
    assert identity_alive({k: v for k, v in me.items() if k != "pid"}) is False
    assert identity_alive({**me, "pid": "not a pid"}) is False
