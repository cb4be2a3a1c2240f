"""One trial as a Ray job: submit it (or adopt the running job of an earlier attempt), follow its log for metrics,
stop it (and wait until Ray says it stopped), and label how it ended, with the same :class:`RunResult`, callbacks,
stop values and failure labels as a local :class:`~hpo.execution._runner.TrialProcess`.

Metrics travel in the job's log (:mod:`hpo.execution.ray_jobs._entry` echoes each new line of the trainer's metrics
file with a prefix), so no filesystem is shared between the driver and the nodes; lines are parsed by the local
tail's own :func:`~hpo.execution._metrics.parse_line` under the same rules (line cap, bad lines counted, skipped).
The log is followed over the dashboard's websocket (``tail_job_logs``, from the start: an adopted job's whole
curve is read again) and, once the job is over, completed with ``get_job_logs``. Lines that are not metrics go to
``<trial dir>/stderr.log`` (what failure labels and ``stderr_tail`` read), capped and counted as a local trial's logs
(:class:`~hpo.execution._logs.CappedText`: ``$VERL_HPO_LOG_CAP_MIB``, the trainer's dropped rows).

How a job ended (``RunResult``): the trainer's exit status from the entrypoint's last line (a death by signal N as
-N, as locally); ``stop`` is the driver's reason when it stopped the job (pruned, converged, timeout,
interrupted, ...) or ``memory`` when the entrypoint enforced ``trial.memory_limit_gb`` on the node. A job that
failed without its entrypoint's last line lost its node or its supervisor (a worker node killed, Ray's memory
monitor): ``exit_code`` -9 (``killed``) and ``node_lost``, which the study retries. A job stopped by someone else
(``ray job stop``) reads -15 (``killed``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.execution._logs import CappedText, log_cap
from hpo.execution._metrics import MAX_LINE_BYTES, parse_line
from hpo.execution._process import ENV_DRIVER
from hpo.execution._runner import CLASSIFY_TAIL_BYTES, REPORT_TICK_S, RunResult, final_exception, read_tail
from hpo.execution._trial_run import TrialRun
from hpo.execution.ray_jobs import _entry, _isolate
from hpo.execution.ray_jobs._cluster import (
    NO_AGENT,
    TERMINAL,
    JobResources,
    RayClusterError,
    agent_down,
    dashboard_url,
    job_client,
    stop_and_wait,
)

ENTRY_PACKAGE = "verl_hpo_ray_entry"  # the entrypoint's module name on the node (shipped as py_modules)
TICK_S = 0.2  # log lines are handled this often
STATUS_TICK_S = 1.0  # the job's status is asked this often
LOG_SETTLE_S = 30.0  # once the job is over, wait at most this long for its log to be complete
DASHBOARD_GONE_S = 300.0  # a dashboard that does not answer this long fails the attempt (the job is stopped)
SILENT_S = 3.0  # a dashboard that does not answer this long is said to have stopped answering (one line)
AGENT_RETRY_S = 60.0  # a submission refused for want of a job agent is tried again this long (one line)
_LOST = ("JOB_SUPERVISOR_ACTOR_DIED", "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE")
_package_dir: Path | None = None
_package_lock = threading.Lock()


def entry_package() -> Path:
    """A directory holding the entrypoint as package :data:`ENTRY_PACKAGE` (what ``py_modules`` uploads; Ray
    caches it by content)."""
    global _package_dir
    with _package_lock:
        if _package_dir is None or not (_package_dir / "__main__.py").is_file():
            root = Path(tempfile.mkdtemp(prefix="verl-hpo-ray-entry-")) / ENTRY_PACKAGE
            atexit.register(shutil.rmtree, root.parent, True)  # Ray keeps its uploaded copy
            root.mkdir()
            (root / "__init__.py").write_text("")
            (root / "__main__.py").write_text(Path(_entry.__file__).read_text())
            (root / "isolate.py").write_text(Path(_isolate.__file__).read_text())  # the jobs' worker setup hook
            _package_dir = root
        return _package_dir


def job_env(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trial's own environment entries (those the driver added to its own): what the job's ``env_vars`` carry.
    The rest of the driver's environment (its PATH, HOME, ...) is not the node's; ``CUDA_VISIBLE_DEVICES`` is Ray's;
    and the driver's identity tag stays out: a job outlives its driver, so the orphan sweep of a driver on the same
    host (:func:`hpo.execution.sweep_orphans`) must not kill it (dead drivers' jobs are swept by the study)."""
    base = os.environ if base is None else base
    return {k: v for k, v in env.items() if base.get(k) != v and k not in ("CUDA_VISIBLE_DEVICES", ENV_DRIVER)}


JOB_METRICS = "job-metrics.jsonl"  # in the trial's directory on the driver's host: the metrics lines the job's log
# carried (what the trainer wrote on its node), for readers of a trial's curve there (hpo.tracking)


class JobLog:
    """The driver's reading of a job's log text, chunk by chunk: metrics records (the entrypoint's prefixed lines,
    parsed by :func:`parse_line` under the local tail's rules), bad lines counted, the entrypoint's end record, and
    every other line written to ``out`` (the trial's ``stderr.log``). Each good metrics line is also appended to
    ``mirror`` (:data:`JOB_METRICS`) as the trainer wrote it."""

    def __init__(self, out: Any, mirror: Any = None) -> None:
        self.out = out
        self.mirror = mirror
        self.partial = ""
        self.bad_lines = 0
        self.end: dict[str, Any] | None = None

    def feed(self, text: str) -> list[tuple[int, dict[str, float]]]:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE_BYTES:  # a line that never ends: dropped, counted if it was metrics
            self.bad_lines += self.partial.startswith(_entry.PREFIX)
            self.partial = ""
        records = []
        for line in lines:
            if line.startswith(_entry.PREFIX):
                payload = line[len(_entry.PREFIX):].encode("utf-8", "surrogateescape")
                rec = None if len(payload) > MAX_LINE_BYTES else parse_line(payload)
                if rec is None:
                    self.bad_lines += 1
                else:
                    records.append(rec)
                    if self.mirror is not None:
                        self.mirror.write(line[len(_entry.PREFIX):] + "\n")
            elif line.startswith(_entry.BAD):
                self.bad_lines += 1
            elif line.startswith(_entry.END):
                try:
                    end = json.loads(line[len(_entry.END):])
                except ValueError:
                    end = None
                self.end = end if isinstance(end, dict) else None
            else:
                self.out.write(line + "\n")
        self.out.flush()
        if self.mirror is not None:
            self.mirror.flush()
        return records

    def close(self) -> None:
        if self.partial:
            self.out.write(self.partial + "\n")
            self.partial = ""
        self.out.flush()


class _LogFollower(threading.Thread):
    """Follows a job's log in a thread: the websocket tail, reconnected (skipping what was read) if it drops while
    the job runs, completed from ``get_job_logs`` once the job is over."""

    def __init__(self, client: Any, submission_id: str) -> None:
        super().__init__(name=f"verl-hpo-log-{submission_id}", daemon=True)
        self.client, self.sid = client, submission_id
        self._lock = threading.Lock()
        self._text: list[str] = []
        self.consumed = 0  # characters of the log received
        self.done = threading.Event()
        self.closing = threading.Event()

    def _take(self, chunk: str) -> None:
        with self._lock:
            self._text.append(chunk)
            self.consumed += len(chunk)

    def drain(self) -> str:
        with self._lock:
            out, self._text = "".join(self._text), []
        return out

    async def _tail(self) -> None:
        seen = 0
        async for chunk in self.client.tail_job_logs(self.sid):
            skip = max(0, min(len(chunk), self.consumed - seen))
            seen += len(chunk)
            if chunk[skip:]:
                self._take(chunk[skip:])
            if self.closing.is_set():
                return

    def run(self) -> None:
        try:
            while not self.closing.is_set():
                try:
                    asyncio.run(self._tail())
                except Exception:  # noqa: BLE001, S110 - dropped connection: the status decides what next
                    pass
                try:
                    status = str(self.client.get_job_status(self.sid).value)
                except Exception:  # noqa: BLE001 - the dashboard is away: try again
                    status = ""
                if status in TERMINAL:
                    try:
                        full = self.client.get_job_logs(self.sid)
                        if len(full) > self.consumed:
                            self._take(full[self.consumed:])
                    except Exception:  # noqa: BLE001, S110 - what the tail got is what there is
                        pass
                    return
                self.closing.wait(1.0)
        finally:
            self.done.set()


@dataclass
class _Watch:
    """What :meth:`RayJob.run` knows of its job while it follows it."""

    start: float  # time.monotonic() at the submission
    status: str = "PENDING"  # the job's last status read
    info: Any = None  # the job's last JobDetails read
    reason: str | None = None  # why the driver stops the job (pruned, converged, timeout, interrupted, ...)
    last_step: int | None = None  # the highest step of a metrics line
    first_metric: float | None = None  # submission -> first metrics line
    ended_at: float | None = None  # when a terminal status was first read
    unreachable: float | None = None  # since when the job's status could not be read
    said: bool = False  # the user was told it does not answer


@dataclass
class RayJob:
    """Runs ``trial`` (its argv) as a Ray job to completion (or until stopped) in the calling thread; the job outlives
    the driver. The same :class:`~hpo.execution.TrialRun` and result as a local
    :class:`~hpo.execution._runner.TrialProcess`, plus the cluster's settings."""

    trial: TrialRun
    address: str
    submission_id: str
    resources: JobResources = field(default_factory=JobResources)
    hold: bool = True  # the entrypoint holds the trial's resources (one node, the trainer uses them itself)
    metadata: Mapping[str, str] = field(default_factory=dict)
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    adopt: bool = False  # follow the running job ``submission_id`` instead of submitting one
    stop_timeout_s: float = 60.0
    note: Callable[[str], None] | None = None  # a line for the user (default: stderr)
    pid: int | None = field(default=None, init=False)  # no local process
    spawned_at: float | None = field(default=None, init=False)  # time.monotonic() just before the submission
    final_status: str | None = field(default=None, init=False)  # the job's status when run() returned

    def entrypoint(self) -> str:
        python = self.trial.argv[0] if Path(self.trial.argv[0]).name.startswith("python") else "python3"
        args = [python, "-m", ENTRY_PACKAGE, "--metrics", str(self.trial.metrics_path), "--max-line-bytes",
                str(MAX_LINE_BYTES)]
        if self.trial.memory_limit_gb is not None:
            args += ["--memory-limit-bytes", str(int(self.trial.memory_limit_gb * 2**30))]
        return shlex.join([*args, "--", *self.trial.argv])

    def submit(self, client: Any) -> None:
        runtime_env = dict(self.runtime_env)
        runtime_env["py_modules"] = [*runtime_env.get("py_modules", []), str(entry_package())]
        runtime_env["env_vars"] = {**dict(runtime_env.get("env_vars", {})), **job_env(self.trial.env)}
        _isolate.isolation(self.trial.env, runtime_env, self.submission_id, ENTRY_PACKAGE)  # its own fixed namespaces
        kwargs: dict[str, Any] = {}
        if self.hold:
            per = dict(self.resources.per_node)
            kwargs["entrypoint_num_gpus"] = per.pop("GPU", 0) or None
            kwargs["entrypoint_num_cpus"] = per.pop("CPU", 0) or None
            kwargs["entrypoint_resources"] = per or None
        if self.trial.memory_limit_gb is not None:
            kwargs["entrypoint_memory"] = int(self.trial.memory_limit_gb * 2**30)
        deadline: float | None = None
        while True:  # the dashboard answers HTTP 500 "No available agent" (after ~10 s) while its agent is away
            try:
                client.submit_job(entrypoint=self.entrypoint(), submission_id=self.submission_id,
                                  runtime_env=runtime_env, metadata=dict(self.metadata), **kwargs)
                return
            except RuntimeError as err:
                if NO_AGENT not in str(err):
                    raise
            if deadline is None:
                deadline = time.monotonic() + AGENT_RETRY_S
                self._say(f"ray job {self.submission_id}: the cluster's job agent does not answer ('{NO_AGENT}'); "
                          f"trying again for {AGENT_RETRY_S:.0f} s")
            if time.monotonic() > deadline or (self.trial.stop_event is not None and self.trial.stop_event.wait(2.0)):
                raise RayClusterError(agent_down(self.address))

    def _say(self, line: str) -> None:
        if self.note is not None:
            self.note(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def run(self) -> RunResult:
        trial = self.trial
        trial.log_dir.mkdir(parents=True, exist_ok=True)
        cap = log_cap() if trial.log_cap == -1 else trial.log_cap  # (a bad $VERL_HPO_LOG_CAP_MIB: before the job)
        client = job_client(self.address)
        start = self.spawned_at = time.monotonic()
        if not self.adopt:
            self.submit(client)
        follower = _LogFollower(client, self.submission_id)
        follower.start()
        stderr_path = trial.log_dir / "stderr.log"
        w = _Watch(start)
        err = CappedText(stderr_path, cap, trial.dropped_row_patterns)  # appended to, as an adopted job's before
        try:
            with (trial.log_dir / JOB_METRICS).open("a", encoding="utf-8", errors="surrogateescape") as mirror:
                log = JobLog(err, mirror)
                self._follow(client, follower, log, w)
                log.close()
        except BaseException:
            if w.status not in TERMINAL:  # an exception in a callback, KeyboardInterrupt: the job must not run on
                try:
                    stop_and_wait(client, self.submission_id, self.stop_timeout_s)
                except Exception:  # noqa: BLE001, S110 - the original error matters more
                    pass
            raise
        finally:
            follower.closing.set()
            logs = err.close()
        self.final_status = w.status
        return self._result(w.info, w.status, w.reason, log.end, time.monotonic() - start, w.first_metric,
                            w.last_step, log.bad_lines).with_logs(logs)

    def _follow(self, client: Any, follower: _LogFollower, log: JobLog, w: _Watch) -> None:
        """Follow the job until it is over and its log read to the end: its status every :data:`STATUS_TICK_S`, its
        metrics lines to ``on_metrics``, a stop (pruned, interrupted, timeout) carried out and waited for."""
        next_status, next_tick = w.start, w.start
        last_pass = False
        while True:
            now = time.monotonic()
            if now >= next_status:
                self._ask_status(client, w, now)
                next_status = now + STATUS_TICK_S
                if w.status in TERMINAL and w.ended_at is None:
                    w.ended_at = now
            for step, data in log.feed(follower.drain()):
                if w.first_metric is None:
                    w.first_metric = time.monotonic() - w.start
                w.last_step = step if w.last_step is None else max(w.last_step, step)  # the highest
                decision = self.trial.on_metrics(step, data) if self.trial.on_metrics is not None else None
                if decision is not None and w.reason is None and w.status not in TERMINAL:
                    w.reason = decision  # after the job ended, lines are only recorded
            if w.reason is None and w.status not in TERMINAL:
                if self.trial.stop_event is not None and self.trial.stop_event.is_set():
                    w.reason = "interrupted"
                elif self.trial.timeout_s is not None and now - w.start > self.trial.timeout_s:
                    w.reason = "timeout"
            if w.reason is not None and w.status not in TERMINAL:
                w.status = stop_and_wait(client, self.submission_id, self.stop_timeout_s)
                next_status = time.monotonic()
                continue
            if w.ended_at is not None and (follower.done.is_set() or now - w.ended_at > LOG_SETTLE_S):
                if last_pass:  # the log was drained once more after the follower finished
                    return
                last_pass = True
                continue
            if self.trial.on_tick is not None and now >= next_tick:
                next_tick = now + REPORT_TICK_S
                self.trial.on_tick(w.last_step, 0.0)
            time.sleep(TICK_S)

    def _ask_status(self, client: Any, w: _Watch, now: float) -> None:
        """The job's status into ``w``; a cluster that does not answer is said once (after :data:`SILENT_S`), and
        fails the attempt after :data:`DASHBOARD_GONE_S` (RayClusterError)."""
        try:
            w.info = client.get_job_info(self.submission_id)
            w.status = str(w.info.status.value)
            if w.said:
                self._say(f"ray job {self.submission_id}: the Ray cluster answers again after "
                          f"{now - (w.unreachable or now):.0f} s")
            w.unreachable, w.said = None, False
        except Exception as err:  # the dashboard restarts, the network hiccups: the job runs on
            w.unreachable = w.unreachable or now
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            if now - w.unreachable > DASHBOARD_GONE_S:
                raise RayClusterError(
                    f"the Ray cluster at {dashboard_url(self.address)} has not answered for "
                    f"{DASHBOARD_GONE_S:.0f} s ({why}); ray job {self.submission_id} is stopped by "
                    "the next driver's sweep if it still runs") from None
            if not w.said and now - w.unreachable >= SILENT_S:
                w.said = True
                self._say(f"ray job {self.submission_id}: the Ray cluster at "
                          f"{dashboard_url(self.address)} stopped answering ({why}); waiting up to "
                          f"{DASHBOARD_GONE_S:.0f} s for it (the job runs on if its node does)")

    def _result(self, info: Any, status: str, reason: str | None, end: dict[str, Any] | None, wall: float,
                first_metric: float | None, last_step: int | None, bad: int) -> RunResult:
        exit_code: int | None
        lost = False
        if isinstance(end, dict) and isinstance(end.get("exit"), int):
            exit_code = int(end["exit"])
            if end.get("memory") and reason is None:
                reason = "memory"
        elif status == "SUCCEEDED":
            exit_code = 0
        elif status == "STOPPED":
            exit_code = -15  # stopped by us (reason set) or by someone else: killed
        else:
            error_type = getattr(info, "error_type", None)
            lost = str(getattr(error_type, "value", error_type)) in _LOST
            driver_exit = getattr(info, "driver_exit_code", None)
            exit_code = -9 if lost or driver_exit is None else int(driver_exit)
            if not lost:  # the runtime env or the entrypoint could not start: Ray's message says why
                message = str(getattr(info, "message", "") or "")
                with (self.trial.log_dir / "stderr.log").open("a") as fh:
                    fh.write(f"ray job {self.submission_id} {status}: {message}\n")
        stderr_path = self.trial.log_dir / "stderr.log"
        peak_kb = int(end.get("peak_kb", 0)) if isinstance(end, dict) else 0
        return RunResult(exit_code=exit_code, stop=reason, peak_memory_gb=peak_kb / 2**20, wall_time_s=wall,
                         first_metric_s=first_metric, last_step=last_step, stderr_tail=read_tail(stderr_path),
                         metrics_bad_lines=bad, memory_mechanism="ray-job",
                         final_exception=final_exception(read_tail(stderr_path, 10**6, CLASSIFY_TAIL_BYTES)),
                         node_lost=lost)
