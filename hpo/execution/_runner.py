"""One trial process: launch it (argv list, own session, inside a wrapper that dies with the driver), tail
its metrics, enforce its memory cap and timeout, kill its whole tree, label how it ended.

The contract with a trial is argv + environment + a JSONL metrics file in verl's ``file`` logger
format, one line per trainer step: ``{"step": N, "data": {"metric/name": value, ...}}``. Nothing here
imports the trainer. Here: :class:`TrialProcess`, :class:`RunResult` and the exit labels; the process tree
(find, measure, kill, orphans, the kernel's OOM kills) is ``_process``, the watchdog thread ``_watchdog``.

Process tree. The driver starts ``hpo/execution/_trial_wrapper.py`` (a bare interpreter, ~25 ms) in a new session; the
wrapper forks the trainer. The wrapper is a child subreaper (orphaned or ``setsid`` descendants are reparented
to it, not to init) with ``PR_SET_PDEATHSIG``, so when the trainer ends, when the driver asks it to stop, and
when the driver dies (SIGKILL included), it kills every remaining descendant and then exits with the
trainer's own status (a trainer killed by SIGKILL still reads -9). No ``preexec_fn`` runs in the driver, and
the driver never signals a process group or pid it has already reaped.

Memory (``RunResult.memory_mechanism``; ``TrialProcess.memory_mechanism`` or ``$VERL_HPO_MEMORY_MECHANISM`` =
``auto`` (default: a cgroup where possible, else polling), ``cgroup``, ``cgroup-v2``, ``cgroup-v1`` or ``poll``):

* ``cgroup-v2`` / ``cgroup-v1``: where the kernel lets the driver create cgroups (``hpo/execution/_cgroup.py``), every
  trial runs in its own memory cgroup with the cap as a hard limit the kernel enforces at allocation time
  (any spike above it, however short, is OOM-killed), the kernel's own peak (``cgroup_peak_gb``) and a confirmed
  OOM kill (``memory.events`` / ``memory.oom_control`` ``oom_kill``); the cgroup also catches descendants that
  escape the tree, and is removed after the trial (or by the next driver, if this one died).
* ``poll``: elsewhere a watchdog thread samples the tree every ``MEMORY_TICK_S`` = 0.1 s and kills it (SIGKILL,
  no grace) when the sum of its processes' ``VmHWM`` (peak RSS, which a process keeps after freeing the memory)
  exceeds the cap: a spike in a process that lives on is caught however short it was; one in a process that
  exits within ~0.1 s of it may escape the kill, but not the label: the wrapper collects the ``ru_maxrss`` of
  every process it reaps (the trainer's includes its own reaped descendants), and one above the cap makes
  the trial ``memory``/``oom`` when it ends.

In both, the watchdog thread also enforces the timeout and the stop event, so metrics callbacks (storage
writes that can wait a minute on a busy SQLite file) never delay them. ``peak_memory_gb`` is the processes'
peak RSS: the largest sum over the tree of ``VmHWM`` seen by the watchdog, and at least the largest single
process's ``ru_maxrss`` (collected by the wrapper as it reaps them); shared pages count once per process.

Logs. The trainer's stdout and stderr are pipes to a log pump (``_logs``, ``_logpump``: a process beside the wrapper,
outside the trial's tree), which writes ``stdout.log`` and ``stderr.log`` in the trial's directory, each capped at
``$VERL_HPO_LOG_CAP_MIB`` (16 MiB by default; head and tail kept, the cut said in the file: ``RunResult.logs_cut``,
``log_notes``), and counts on the way the lines in which the trainer says it dropped a row of its data
(``dropped_row_patterns``: ``RunResult.dropped_rows``).

Failure labels (``RunResult.failure``): ``oom`` only when the driver's cap fired (``stop == "memory"``), the
kernel's OOM killer is confirmed (the trial's cgroup counter; without a cgroup, a kernel log line naming one of
the trial's pids), or the last traceback's final exception is ``MemoryError`` / ``OutOfMemoryError`` / CUDA out of
memory; ``killed`` for any other death by SIGKILL/SIGTERM/SIGINT/SIGHUP (or exit 137/143/130/129): a user, a
scheduler, another driver; ``crash`` otherwise.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.analysis import _files
from hpo.execution import _cgroup
from hpo.execution._hostload import cpu_times, others_share
from hpo.execution._logs import ENV_MAX_DROPPED, LogPump, LogReport, log_cap
from hpo.execution._metrics import MetricsFileError, MetricsTail
from hpo.execution._process import KILL_GRACE_S, global_oom_kills, kernel_oom_killed, kill_tree
from hpo.execution._trial_run import TrialRun
from hpo.execution._trial_wrapper import KILL_NOW_SIGNAL
from hpo.execution._watchdog import Watchdog, WrapperHandle

TICK_S = 0.1  # metrics poll period
REPORT_TICK_S = 0.5  # on_tick period
STDERR_TAIL_LINES = 30
CLASSIFY_TAIL_BYTES = 65536  # how much of stderr is searched for the last traceback
WRAPPER = Path(__file__).with_name("_trial_wrapper.py")
MECHANISMS = ("auto", "cgroup", "cgroup-v2", "cgroup-v1", "poll")
ENV_MECHANISM = "VERL_HPO_MEMORY_MECHANISM"  # one of MECHANISMS (default auto: a cgroup where possible)


# ----------------------------------------------------------------------------- labels
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)(:|$)")
_OOM_NAMES = {"MemoryError", "OutOfMemoryError"}
_OOM_MESSAGES = ("CUDA out of memory", "CUDA error: out of memory", "HIP out of memory")
_KILLED = {int(signal.SIGKILL), int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP)}


def final_exception(stderr: str) -> str | None:
    """The final exception line of the last Python traceback in ``stderr`` (``module.Name: message``), else
    the last line that looks like one (a tail that cut the traceback's header off, a C++ ``terminate``)."""
    lines = stderr.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        at = lines[i].find(_TRACEBACK)
        if at < 0:
            continue
        prefix = lines[i][:at]  # e.g. "[rank0]: " or an exception group's "  | "
        for line in lines[i + 1:]:
            body = line[len(prefix):] if line.startswith(prefix) else line
            if body and not body[0].isspace():
                return body.strip()
        return None  # the traceback was cut off before its exception line
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION_LINE.match(text) or text.startswith("terminate called after throwing"):
            return text
    return None


def is_oom_exception(line: str) -> bool:
    """``MemoryError``, ``torch.OutOfMemoryError`` (also ``torch.cuda.`` and C++ ``c10::``), CUDA/HIP OOM text."""
    name = re.split(r"[:\s]", line, maxsplit=1)[0]
    if name.rsplit(".", 1)[-1] in _OOM_NAMES or "OutOfMemoryError" in line.split(":", 1)[0]:
        return True
    if line.startswith("terminate called") and "OutOfMemoryError" in line:
        return True
    return any(m in line for m in _OOM_MESSAGES)


def classify_exit(exit_code: int | None, stderr_tail: str, kernel_oom: bool = False) -> str:
    """Label a non-zero exit the driver did not cause: ``oom`` when the kernel's OOM killer is confirmed
    (``kernel_oom``) or the final exception of the last traceback in ``stderr_tail`` is an out-of-memory error;
    ``killed`` for a death by SIGKILL/SIGTERM/SIGINT/SIGHUP (someone killed it); else ``crash``. An "out of
    memory" text anywhere else in the output, or a SIGKILL alone, is not an OOM."""
    if kernel_oom:
        return "oom"
    exc = final_exception(stderr_tail)
    if exc is not None and is_oom_exception(exc):
        return "oom"
    if exit_code is not None and (-exit_code in _KILLED or exit_code - 128 in _KILLED):
        return "killed"
    return "crash"


def read_tail(path: Path, lines: int = STDERR_TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last lines of a log in the trial's directory; "" unless it is a regular file itself (the trial may have
    put a FIFO, a link to ``/dev/zero`` or to a file that is not its own in its place)."""
    try:
        text = _files.read_tail(path, max_bytes, follow=False).decode("utf-8", "replace")
    except (OSError, _files.FileRefused):
        return ""
    return "\n".join(text.splitlines()[-lines:])


# ----------------------------------------------------------------------------- one run
@dataclass
class RunResult:
    """What happened to one trial process."""

    exit_code: int | None  # Popen returncode (negative = killed by that signal)
    # why the driver stopped it: pruned, converged, timeout, interrupted, memory (the cap: killed at once, or a
    # process that was over it is found at the end); None = ran out
    stop: str | None
    peak_memory_gb: float  # peak RSS of the trial's processes (see the module docstring)
    wall_time_s: float
    first_metric_s: float | None  # spawn -> first metrics line
    last_step: int | None
    stderr_tail: str
    metrics_bad_lines: int = 0  # metrics lines skipped as bad (see MetricsTail)
    metrics_error: str | None = None  # why the metrics file could not be read (stop == "bad_metrics")
    memory_mechanism: str = "poll"  # how the cap was enforced and the tree found: cgroup-v2, cgroup-v1, poll
    kernel_oom: bool = False  # the kernel's OOM killer killed one of the trial's processes (confirmed)
    final_exception: str | None = None  # final exception line of the last traceback in stderr
    cgroup_peak_gb: float | None = None  # the cgroup's own peak (includes page cache it was charged)
    leftovers_killed: int = 0  # descendants still alive when the trainer exited (killed by the wrapper)
    node_lost: bool = False  # a Ray job whose node or supervisor died under it (retried, not the trial's fault)
    # the logs (hpo.execution._logs): a log over its cap -> bytes cut from its middle; lines for the user (a cut log,
    # a write error); the rows the trainer said it dropped (Backend.dropped_row_patterns) and the first one's error
    logs_cut: dict[str, int] = field(default_factory=dict)
    # the trial's processes' CPU seconds, and the share of the host's CPU time other processes used meanwhile
    # (hpo.execution._hostload; None where not measured: a Ray job, a wrapper killed before its last words)
    trial_cpu_s: float | None = None
    host_busy: float | None = None
    log_notes: tuple[str, ...] = ()
    dropped_rows: int = 0
    dropped_rows_error: str | None = None

    def log_lines(self) -> list[str]:
        """Lines for the user about the trial's logs: each one cut at its cap, a write error, the rows dropped."""
        lines = list(self.log_notes)
        if self.dropped_rows:
            lines.append(f"the trainer dropped {self.dropped_rows} row(s) of its data and went on without them; "
                         f"the first: {self.dropped_rows_error}")
        return lines

    def dropped_error(self, limit: int) -> str | None:
        """Why the trial fails when its trainer dropped more than ``limit`` rows (None: it did not)."""
        if self.dropped_rows <= limit:
            return None
        return (f"the trainer dropped {self.dropped_rows} rows of its data (more than {limit}, "
                f"${ENV_MAX_DROPPED}): {self.dropped_rows_error}")

    def with_logs(self, report: LogReport) -> RunResult:
        """This result with what the logs' reader saw."""
        return dataclasses.replace(self, logs_cut=dict(report.cut), log_notes=tuple(report.notes),
                                   dropped_rows=report.dropped_rows, dropped_rows_error=report.dropped_rows_error)

    @property
    def failure(self) -> str | None:
        """oom / timeout / bad_metrics / killed / crash, or None when the process ran to a clean exit or was stopped
        on purpose."""
        if self.stop == "memory":
            return "oom"
        if self.stop == "timeout":
            return "timeout"
        if self.stop == "bad_metrics":
            return "bad_metrics"
        if self.stop is not None:
            return None
        if self.exit_code == 0:
            return None
        text = self.final_exception if self.final_exception is not None else self.stderr_tail
        return classify_exit(self.exit_code, text, kernel_oom=self.kernel_oom)


def _check_executable(argv0: str, env: Mapping[str, str], cwd: str | None) -> None:
    """Raise FileNotFoundError as Popen would for a command that does not exist (the wrapper execs it)."""
    if os.sep in argv0:
        found = os.access(os.path.join(cwd or ".", argv0), os.X_OK)
    else:
        found = shutil.which(argv0, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)


@dataclass
class TrialProcess:
    """Runs ``trial`` (its argv) to completion (or until stopped) in the calling thread, which must stay alive
    while the child runs: PR_SET_PDEATHSIG fires when the spawning *thread* exits."""

    trial: TrialRun
    memory_mechanism: str | None = None  # one of MECHANISMS; None: $VERL_HPO_MEMORY_MECHANISM, else auto
    # a /tmp of the trial's own (the wrapper's --private-tmp), for a trainer that binds fixed paths under /tmp
    private_tmp: Path | None = None
    pid: int | None = field(default=None, init=False)  # the wrapper's pid (the trainer is its child)
    spawned_at: float | None = field(default=None, init=False)  # time.monotonic() just before the spawn

    def _cgroup(self, limit: int | None) -> _cgroup.TrialCgroup | None:
        want = self.memory_mechanism or os.environ.get(ENV_MECHANISM) or "auto"
        if want not in MECHANISMS:
            raise ValueError(f"memory mechanism {want!r}: expected one of {', '.join(MECHANISMS)}")
        if want == "poll":
            return None
        mechanism = _cgroup.mechanism("auto" if want == "cgroup" else want)
        if mechanism is None:
            if want != "auto":
                raise RuntimeError(f"memory mechanism {want}: the kernel does not let this process create one")
            return None
        try:
            return mechanism.create(limit)
        except OSError:
            if want != "auto":
                raise
            return None

    def run(self) -> RunResult:
        trial = self.trial
        trial.log_dir.mkdir(parents=True, exist_ok=True)
        _check_executable(trial.argv[0], trial.env, trial.cwd)
        cap = log_cap() if trial.log_cap == -1 else trial.log_cap  # (a bad $VERL_HPO_LOG_CAP_MIB: before anything)
        tail = MetricsTail(trial.metrics_path)
        stderr_path = trial.log_dir / "stderr.log"
        status_path = trial.log_dir / ".wrapper-status.json"
        limit = None if trial.memory_limit_gb is None else int(trial.memory_limit_gb * 2**30)
        cg = self._cgroup(limit)
        wrapper_argv = self._wrapper_argv(status_path, None if cg is None else cg.path)
        oom_kills_before = global_oom_kills()
        try:
            pump = LogPump(trial.log_dir, cap, trial.dropped_row_patterns)  # the trainer's stdout and stderr: pipes
            try:
                load_before = cpu_times()  # the host's CPU time: other processes' share while the trial runs
                start = self.spawned_at = time.monotonic()
                popen = subprocess.Popen(
                    [*wrapper_argv, "--", *trial.argv], cwd=trial.cwd, env=dict(trial.env), stdin=subprocess.DEVNULL,
                    stdout=pump.stdout, stderr=pump.stderr, start_new_session=True, close_fds=True,
                )
                pump.spawned()
                self.pid = popen.pid
                wrapper = WrapperHandle(popen)
                dog = Watchdog(wrapper, cg, limit if cg is None else None, trial.timeout_s, trial.stop_event, start)
                dog.start()
                try:
                    last_step, first_metric, metrics_error = self._follow(popen, wrapper, dog, tail, start)
                finally:
                    if popen.poll() is None:
                        dog.stop("interrupted")  # an exception (e.g. in a callback) or KeyboardInterrupt
                    _reap(popen, wrapper)
                    dog.close()
                    wrapper.close()
                wall = time.monotonic() - start
            finally:
                logs = pump.finish()  # the whole trial is gone: the pump's end of file (its report)
            stop, exit_code = dog.reason, popen.returncode
            kernel_oom = False
            cgroup_peak = None
            if cg is not None:
                cg.kill()
                kernel_oom = cg.oom_killed()
                cgroup_peak = cg.peak_bytes()
            elif exit_code != 0 and (global_oom_kills() or 0) > (oom_kills_before or 0):
                kernel_oom = kernel_oom_killed(dog.seen | {popen.pid}, start)
        finally:
            if cg is not None:
                cg.remove()
        if kernel_oom and stop is None and cg is not None and cg.limit_bytes is not None:
            stop = "memory"  # the kernel enforced the driver's cap (even if the trainer survived a child's kill)
        maxrss, leftovers, cpu_s = _wrapper_status(status_path)
        busy = None if cpu_s is None else others_share(load_before, cpu_times(), cpu_s)
        peak = max(dog.peak_bytes, maxrss)
        if stop is None and cg is None and limit is not None and maxrss > limit:
            stop = "memory"  # one process went over the cap and exited between two samples: still over the cap
        return RunResult(
            exit_code=exit_code, stop=stop, peak_memory_gb=peak / 2**30, wall_time_s=wall,
            first_metric_s=first_metric, last_step=last_step, stderr_tail=read_tail(stderr_path),
            metrics_bad_lines=tail.bad_lines, metrics_error=metrics_error,
            memory_mechanism="poll" if cg is None else cg.mechanism.name,
            kernel_oom=kernel_oom, final_exception=final_exception(read_tail(stderr_path, 10**6, CLASSIFY_TAIL_BYTES)),
            cgroup_peak_gb=None if cgroup_peak is None else cgroup_peak / 2**30, leftovers_killed=leftovers,
            trial_cpu_s=cpu_s, host_busy=busy,
        ).with_logs(logs)

    def _wrapper_argv(self, status_path: Path, cgroup: Path | None) -> list[str]:
        """The trial wrapper's own arguments (the trainer's argv follows ``--``)."""
        argv = [sys.executable, "-I", "-S", str(WRAPPER), "--parent", str(os.getpid()),
                "--grace", str(KILL_GRACE_S), "--status", str(status_path)]
        if cgroup is not None:
            argv += ["--cgroup", str(cgroup)]
        if self.private_tmp is not None:
            argv += ["--private-tmp", str(self.private_tmp)]
        return argv

    def _follow(self, popen: subprocess.Popen[bytes], wrapper: WrapperHandle, dog: Watchdog, tail: MetricsTail,
                start: float) -> tuple[int | None, float | None, str | None]:
        """Read the metrics file until the trial exits or the watchdog stops it, calling ``on_metrics`` on each line
        and ``on_tick`` every :data:`REPORT_TICK_S`: ``(last_step, first_metric_s, metrics_error)``."""
        last_step, first_metric = None, None
        metrics_error: str | None = None
        next_tick = start
        while True:
            rc = popen.poll()
            try:
                records = tail.read()
            except MetricsFileError as err:
                metrics_error = str(err)
                dog.stop("bad_metrics")
                records = []
            for step, data in records:
                if dog.reason is not None:
                    break
                if first_metric is None:
                    first_metric = time.monotonic() - start
                last_step = step if last_step is None else max(last_step, step)  # the highest
                decision = self.trial.on_metrics(step, data) if self.trial.on_metrics is not None else None
                if rc is None and decision is not None:  # after a clean exit lines are only recorded
                    dog.stop(decision)
            if rc is not None or dog.reason is not None:
                return last_step, first_metric, metrics_error
            now = time.monotonic()
            if self.trial.on_tick is not None and now >= next_tick:
                next_tick = now + REPORT_TICK_S
                self.trial.on_tick(last_step, dog.current_bytes / 2**30)
            wrapper.wait(TICK_S)


def _wrapper_status(status_path: Path) -> tuple[int, int, float | None]:
    """The wrapper's last words (``maxrss`` in bytes, descendants it killed, the trial's CPU seconds), read and
    removed; zeros (and no CPU time) when it left none (killed) or they do not parse."""
    try:
        status = json.loads(_files.read_trial_file(status_path, 4096))  # the trial's dir
        maxrss, leftovers = int(status["maxrss_kb"]) * 1024, int(status["leftovers"])
        cpu = status.get("cpu_s")
        status_path.unlink()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError):
        return 0, 0, None
    if not (0 <= maxrss < 2**60 and 0 <= leftovers < 2**31):  # numbers a trial may have written there
        return 0, 0, None
    ok = isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and 0 <= cpu < 1e9
    return maxrss, leftovers, float(cpu) if ok else None


def _reap(popen: subprocess.Popen[bytes], wrapper: WrapperHandle) -> None:
    """Wait for the wrapper, which exits only after the whole trial is dead; if it hangs (a trainer stuck in
    uninterruptible sleep), SIGKILL what can be killed and return."""
    try:
        popen.wait(timeout=KILL_GRACE_S + 10)
    except subprocess.TimeoutExpired:
        wrapper.send(KILL_NOW_SIGNAL)
        kill_tree(popen, grace_s=1.0)


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
