"""One trial process: launch (argv list, own session, dies with the driver), tail its metrics, watch its
memory and time, kill its whole tree.

The contract with a trial is argv + environment + a JSONL metrics file in verl's ``file`` logger
format, one line per trainer step: ``{"step": N, "data": {"metric/name": value, ...}}``. Nothing here
imports the trainer.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

PR_SET_PDEATHSIG = 1
TICK_S = 0.1  # metrics poll period
MEMORY_TICK_S = 0.5  # process-tree RSS sampling period
KILL_GRACE_S = 3.0  # SIGTERM -> SIGKILL
STDERR_TAIL_LINES = 30
OOM_MARKERS = ("MemoryError", "OutOfMemoryError", "CUDA out of memory", "out of memory")
# Environment tags every trial process (and its descendants) inherits; used to sweep orphans.
ENV_STUDY = "VERL_HPO_STUDY"
ENV_TRIAL = "VERL_HPO_TRIAL"
ENV_DRIVER = "VERL_HPO_DRIVER"

try:
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def driver_identity() -> dict[str, Any]:
    """Who runs trials: host, pid and the pid's start time (so a reused pid is not mistaken for us)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def identity_alive(ident: Mapping[str, Any]) -> bool | None:
    """True/False for a driver on this host; None when it ran elsewhere (only heartbeats can tell)."""
    if ident.get("host") != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(ident["pid"]))
        return abs(proc.create_time() - float(ident["started"])) < 1.0
    except (psutil.NoSuchProcess, KeyError, ValueError, TypeError):
        return False


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL this child when the thread that spawned it exits (driver death included)."""

    def preexec() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the driver died before prctl took effect
            os._exit(137)

    return preexec


# ----------------------------------------------------------------------------- metrics
class MetricsTail:
    """Incremental reader of a JSONL metrics file; only complete lines are parsed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.bad_lines = 0

    def read(self) -> list[tuple[int, dict[str, Any]]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        out: list[tuple[int, dict[str, Any]]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step, metrics = int(rec["step"]), rec["data"]
                if not isinstance(metrics, dict):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                self.bad_lines += 1
                continue
            out.append((step, metrics))
        return out


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
    """SIGTERM the process group and every descendant (also those that left the group), wait
    ``grace_s``, then SIGKILL whatever is left. Returns once the direct child is reaped."""
    procs = tree(popen.pid)[1:]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs:
            try:
                p.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        if sig == signal.SIGKILL:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if popen.poll() is not None and not any(_alive(p) for p in procs):
                break
            time.sleep(0.05)
        else:
            continue
        break
    popen.wait()
    psutil.wait_procs([p for p in procs if _alive(p)], timeout=grace_s)
    try:  # leftovers of a group whose leader exited
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


# ----------------------------------------------------------------------------- one run
@dataclass
class RunResult:
    """What happened to one trial process."""

    exit_code: int | None  # Popen returncode (negative = killed by that signal)
    stop: str | None  # why the driver killed it: pruned, converged, timeout, memory, interrupted (None = ran out)
    peak_memory_gb: float
    wall_time_s: float
    first_metric_s: float | None  # spawn -> first metrics line
    last_step: int | None
    stderr_tail: str
    metrics_bad_lines: int = 0

    @property
    def failure(self) -> str | None:
        """oom / timeout / crash, or None when the process ran to a clean exit or was stopped on purpose."""
        if self.stop == "memory":
            return "oom"
        if self.stop == "timeout":
            return "timeout"
        if self.stop is not None:
            return None
        if self.exit_code == 0:
            return None
        return classify_exit(self.exit_code, self.stderr_tail)


def classify_exit(exit_code: int | None, stderr_tail: str) -> str:
    """A non-zero exit we did not cause: SIGKILL (the kernel's OOM killer) or an OOM traceback -> oom."""
    if exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "oom"
    if any(m in stderr_tail for m in OOM_MARKERS):
        return "oom"
    return "crash"


def read_tail(path: Path, lines: int = STDERR_TAIL_LINES, max_bytes: int = 16384) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class TrialProcess:
    """Runs ``argv`` to completion (or until stopped) in the calling thread, which must stay alive
    while the child runs: PR_SET_PDEATHSIG fires when the spawning *thread* exits."""

    argv: Sequence[str]
    env: Mapping[str, str]
    log_dir: Path
    metrics_path: Path
    cwd: str | None = None
    timeout_s: float | None = None
    memory_limit_gb: float | None = None
    on_metrics: Callable[[int, dict[str, Any]], str | None] | None = None
    on_tick: Callable[[int | None, float], None] | None = None
    stop_event: threading.Event | None = None
    pid: int | None = field(default=None, init=False)
    spawned_at: float | None = field(default=None, init=False)  # time.monotonic() just before the spawn

    def run(self) -> RunResult:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        tail = MetricsTail(self.metrics_path)
        stdout_path, stderr_path = self.log_dir / "stdout.log", self.log_dir / "stderr.log"
        peak, last_step, first_metric, stop = 0, None, None, None
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            start = self.spawned_at = time.monotonic()
            popen = subprocess.Popen(
                list(self.argv), cwd=self.cwd, env=dict(self.env), stdin=subprocess.DEVNULL, stdout=out,
                stderr=err, start_new_session=True, preexec_fn=_die_with_parent(os.getpid()), close_fds=True,
            )
            self.pid = popen.pid
            next_mem = start
            try:
                while True:
                    rc = popen.poll()
                    for step, data in tail.read():
                        if stop is not None:
                            break
                        if first_metric is None:
                            first_metric = time.monotonic() - start
                        last_step = step
                        decision = self.on_metrics(step, data) if self.on_metrics is not None else None
                        if rc is None:  # after a clean exit late lines are only recorded
                            stop = decision
                    if rc is not None or stop is not None:
                        break
                    now = time.monotonic()
                    if now >= next_mem:
                        next_mem = now + MEMORY_TICK_S
                        rss = tree_rss_bytes(tree(popen.pid))
                        peak = max(peak, rss)
                        if self.on_tick is not None:
                            self.on_tick(last_step, rss / 2**30)
                        if self.memory_limit_gb is not None and rss > self.memory_limit_gb * 2**30:
                            stop = "memory"
                            break
                    if self.timeout_s is not None and now - start > self.timeout_s:
                        stop = "timeout"
                        break
                    if self.stop_event is not None and self.stop_event.wait(TICK_S):
                        stop = "interrupted"
                        break
                    elif self.stop_event is None:
                        time.sleep(TICK_S)
            finally:
                if popen.poll() is None or stop is not None:
                    kill_tree(popen)
                else:
                    try:  # the trainer exited; make sure nothing it left in its group lingers
                        os.killpg(popen.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            wall = time.monotonic() - start
        return RunResult(
            exit_code=popen.returncode, stop=stop, peak_memory_gb=peak / 2**30, wall_time_s=wall,
            first_metric_s=first_metric, last_step=last_step, stderr_tail=read_tail(stderr_path),
            metrics_bad_lines=tail.bad_lines,
        )


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
