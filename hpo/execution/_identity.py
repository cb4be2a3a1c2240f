"""Who runs a trial, and whether that driver is known to be alive.

A driver records its identity on every trial it starts (user attr ``worker``). Another driver may judge a
pid only when the pid means the same process to both: the same host name, the same boot (``boot_id``: a
reboot reuses pids) and the same pid namespace (containers with host networking share the host name but
not the pids: pid 1 in one is not pid 1 in another). When any of these differ, liveness is unknown and only
a stale heartbeat (:mod:`hpo.study._recovery`) may declare the driver dead.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping
from typing import Any

import psutil


@functools.cache
def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def driver_identity() -> dict[str, Any]:
    """Host, boot, pid namespace, pid and the pid's start time (so a reused pid is not mistaken for us)."""
    return {"host": socket.gethostname(), "boot_id": boot_id(), "pidns": pid_namespace(), "pid": os.getpid(),
            "started": psutil.Process().create_time()}


def comparable(ident: Mapping[str, Any]) -> bool:
    """Whether ``ident``'s pid can be looked up here (same host, boot and pid namespace, all known)."""
    mine = driver_identity()
    return all(ident.get(k) is not None and ident.get(k) == mine[k] for k in ("host", "boot_id", "pidns"))


def identity_alive(ident: Mapping[str, Any]) -> bool | None:
    """True/False for a driver whose pid is comparable with ours; None when it is not (heartbeats decide)."""
    if not comparable(ident):
        return None
    try:
        proc = psutil.Process(int(ident["pid"]))
        return abs(proc.create_time() - float(ident["started"])) < 1.0
    except (psutil.NoSuchProcess, KeyError, ValueError, TypeError):
        return False
