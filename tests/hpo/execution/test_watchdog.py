"""The watchdog of one trial (:mod:`hpo.execution._watchdog`), with real processes standing in for the trial wrapper:
it stops the trial on its timeout and on the stop event (SIGTERM to the wrapper), on the polled memory cap at once
(the wrapper told to SIGKILL, the members killed by the watchdog too), keeps the first reason, and measures the
trial's memory (its members: the wrapper's descendants). No fixed sleeps: each test waits on a process's end."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from hpo.execution._trial_wrapper import KILL_NOW_SIGNAL
from hpo.execution._watchdog import Watchdog, WrapperHandle

PY = sys.executable
WAIT_S = 60.0
SLEEPER = [PY, "-c", "import time; time.sleep(600)"]
# a stand-in wrapper whose child (the trainer) writes 200 MB into its memory, then sleeps
HOG = [PY, "-c", "import subprocess, sys, time\n"
       "subprocess.Popen([sys.executable, '-c', 'import time\\nx = bytearray(b\"\\\\x01\") * (200 << 20)\\n"
       "time.sleep(600)'])\ntime.sleep(600)"]


def _watch(argv: list[str], **kw: object) -> tuple[subprocess.Popen[bytes], Watchdog]:
    proc = subprocess.Popen(argv, start_new_session=True)
    args = {"poll_limit": None, "timeout_s": None, "stop_event": None, "started": time.monotonic(), **kw}
    dog = Watchdog(WrapperHandle(proc), None, **args)  # type: ignore[arg-type]
    dog.start()
    return proc, dog


def _end(proc: subprocess.Popen[bytes], dog: Watchdog) -> int:
    try:
        return proc.wait(timeout=WAIT_S)
    finally:
        dog.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_timeout_stops_the_trial_with_sigterm() -> None:
    proc, dog = _watch(SLEEPER, timeout_s=0.3)
    assert _end(proc, dog) == -signal.SIGTERM and dog.reason == "timeout"


def test_the_stop_event_interrupts_the_trial() -> None:
    stop = threading.Event()
    proc, dog = _watch(SLEEPER, stop_event=stop)
    assert proc.poll() is None
    stop.set()
    assert _end(proc, dog) == -signal.SIGTERM and dog.reason == "interrupted"


@pytest.mark.timeout(120)
def test_the_memory_cap_kills_the_whole_trial_at_once() -> None:
    """The trainer (the wrapper's child) passes 100 MB: the wrapper is told to kill now (its own signal: a bare
    process dies of it) and the watchdog SIGKILLs the members it has seen, without waiting for the wrapper."""
    proc, dog = _watch(HOG, poll_limit=100 << 20)
    assert _end(proc, dog) == -KILL_NOW_SIGNAL and dog.reason == "memory"
    assert dog.peak_bytes > 100 << 20 and len(dog.seen) >= 1
    deadline = time.monotonic() + WAIT_S
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in dog.seen):
        assert time.monotonic() < deadline, "a member outlived the memory kill"
        time.sleep(0.05)


def test_the_first_reason_wins_and_memory_is_sampled_without_a_cap() -> None:
    proc, dog = _watch(HOG)
    try:
        deadline = time.monotonic() + WAIT_S
        while dog.current_bytes < 150 << 20:  # the trainer's 200 MB, as it comes
            assert time.monotonic() < deadline, "the watchdog never saw the trainer's memory"
            time.sleep(0.05)
        assert dog.reason is None and dog.peak_bytes >= dog.current_bytes
        assert dog.stop("pruned") is True and dog.stop("timeout") is False
    finally:
        code = _end(proc, dog)
    assert code == -signal.SIGTERM and dog.reason == "pruned"


def test_the_handle_waits_less_when_the_wrapper_ends_and_signals_it_safely_after() -> None:
    proc = subprocess.Popen([PY, "-c", "pass"])
    handle = WrapperHandle(proc)
    if handle.pidfd is not None:  # (without one, the wait is a plain sleep)
        waiter = threading.Thread(target=handle.wait, args=(3600.0,), daemon=True)
        waiter.start()
        waiter.join(WAIT_S)  # a hang guard: the wait ends when the wrapper does, not after its hour
        assert not waiter.is_alive(), "the wait did not end when the wrapper exited"
    proc.wait()
    handle.send(signal.SIGTERM)  # reaped: the pidfd refuses quietly, no other process is signalled
    handle.close()
    handle.close()
    assert handle.pidfd is None
