"""The rows of ``benchmarks/gpu_check.py`` and how each verl row is judged: :class:`Check` (one row), :class:`Plan`
(what one mode runs), and the facts of the verl stages (:class:`TrialFacts`, :class:`Interrupted`, :class:`Pair`,
:class:`MemoryFacts`) with the pure functions that turn them into rows (:func:`study_row`, :func:`resume_row`,
:func:`pair_row`, :func:`memory_row`). Nothing here starts a process: the tests judge made-up outcomes with it.
"""

from __future__ import annotations

import dataclasses
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXIT_SIGTERM = 128 + int(signal.SIGTERM)  # the driver's exit code when SIGTERM stopped it (hpo.commands.EXIT_SIGNAL)
# verl memory estimate: the expected estimate (what the pre-flight refuses by) must be near the measured peak; the
# worst case (every sequence at max_prompt_length + max_response_length, a warning only) must not be below it
EXPECTED_RATIO = (0.9, 1.5)
WORST_MIN_RATIO = 0.9


@dataclass(frozen=True)
class Plan:
    """What one mode runs: the config and its overrides, the device, steps."""

    config: str
    overrides: tuple[str, ...]
    device: str
    steps: int
    vllm: tuple[str, ...] = ()


@dataclass
class Check:
    name: str
    status: str = "ok"
    detail: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


def last_line_of(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def failed_check(name: str, err: Exception) -> Check:
    return Check(name, "FAIL", f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err) else ''}")


def guarded_check(name: str, fn: Callable[[], Check]) -> Check:
    """``fn()``, or a FAIL row ``name`` naming the exception: one failing check must not hide the others."""
    try:
        return fn()
    except Exception as err:
        return failed_check(name, err)


# ----------------------------------------------------------------------------- verl rows
@dataclass(frozen=True)
class TrialFacts:
    """One trial of a study as the checks judge it (:func:`trial_facts`)."""

    number: int
    state: str  # Optuna's: COMPLETE, FAIL, WAITING, ...
    value: float | None
    fail_reason: str  # the driver's (oom, crash, timeout, killed, ...; a COMPLETE trial with the worst value has one)
    lines: int  # metric lines this attempt logged
    objective: tuple[float, ...]  # the objective metric's logged values
    start: float  # epoch s: its command.json, written right before the trainer is spawned
    end: float  # start + the driver's wall_time_s of the trainer
    devices: str  # CUDA_VISIBLE_DEVICES the trial got
    params: dict[str, Any]
    retry_of: int | None
    first_step: int | None  # the first step this attempt logged
    allocated_gb: float  # verl's perf/max_memory_allocated_gb (NaN when not logged)
    metrics: str  # this attempt's metrics file

    @property
    def ok(self) -> bool:
        return (self.state == "COMPLETE" and not self.fail_reason and self.value is not None
                and math.isfinite(self.value) and self.lines > 0 and bool(self.objective))

    def problem(self) -> str:
        return (f"trial {self.number} {self.state}{f' ({self.fail_reason})' if self.fail_reason else ''}, value "
                f"{self.value}, {self.lines} metric lines, {len(self.objective)} objective values")


@dataclass
class Interrupted:
    """What happened around the SIGTERM and the resume (:func:`sigterm_and_resume`; judged by :func:`resume_row`)."""

    trial: int | None = None  # the trial whose checkpoint was waited for
    checkpoint_step: int | None = None  # its newest complete checkpoint when the SIGTERM was sent
    checkpoint_s: float = float("nan")  # search start -> that checkpoint
    exit_code: int | None = None  # the driver's, after the SIGTERM
    stop_s: float = float("nan")  # SIGTERM -> the driver gone
    queued: bool = False  # a WAITING retry of `trial` in the study after the SIGTERM
    ray_after_stop: list[str] = field(default_factory=list)
    resume_exit: int | None = None
    resume_s: float = float("nan")
    retry: int | None = None  # the retry's trial number
    resumed_from: int | None = None  # N of trainer.resume_from_path=.../global_step_N in the retry's command
    first_step: int | None = None  # the first step the retry logged
    loaded_log: bool = False  # the retry's log says verl loaded the checkpoint ("Resuming from ...")
    value: float | None = None  # the retry's objective value
    ray_left: list[str] = field(default_factory=list)
    error: str = ""
    trials: list[TrialFacts] = field(default_factory=list)


def resume_row(o: Interrupted) -> Check:
    """``ok`` when the driver exited 143 with the trial queued and no Ray process left, and the resumed retry
    continued after the checkpoint, completed and recorded the objective."""
    c = Check("verl SIGTERM + resume", seconds=sum(s for s in (o.checkpoint_s, o.stop_s, o.resume_s) if s == s))
    problems = [o.error] if o.error else []
    if o.exit_code != EXIT_SIGTERM and not o.error:
        problems.append(f"driver exit {o.exit_code} after SIGTERM (expected {EXIT_SIGTERM})")
    if o.trial is not None and not o.queued and not o.error:
        problems.append(f"trial {o.trial} not queued (no WAITING retry of it)")
    if o.ray_after_stop:
        problems.append(f"Ray processes left after the SIGTERM: {', '.join(o.ray_after_stop[:5])}")
    retry = next((f for f in o.trials if f.number == o.retry), None)
    if o.resume_exit is not None:
        if retry is None:
            problems.append(f"no retry of trial {o.trial} ran")
        elif not retry.ok:
            problems.append(retry.problem())
        if retry is not None and o.resumed_from is None:
            problems.append("the retry started afresh (no trainer.resume_from_path)")
        elif retry is not None and o.checkpoint_step is not None and (o.resumed_from or 0) < o.checkpoint_step:
            problems.append(f"the retry resumed from step {o.resumed_from}, before the checkpoint {o.checkpoint_step}")
        continued = o.first_step is not None and o.checkpoint_step is not None and o.first_step > o.checkpoint_step
        if retry is not None and not (continued or o.loaded_log):
            problems.append(f"the retry's first step {o.first_step} is not after the checkpoint's "
                            f"{o.checkpoint_step} and its log does not say it loaded one")
    if o.ray_left:
        problems.append(f"Ray processes left: {', '.join(o.ray_left[:5])}")
    parts = []
    if o.checkpoint_step is not None:
        parts.append(f"trial {o.trial} checkpoint at step {o.checkpoint_step} after {o.checkpoint_s:.0f} s")
    if o.exit_code is not None:
        parts.append(f"SIGTERM -> exit {o.exit_code} in {o.stop_s:.1f} s"
                     + (f", trial {o.trial} queued" if o.queued else ""))
    if o.resume_exit is not None:
        parts.append(f"resume exit {o.resume_exit} in {o.resume_s:.0f} s")
    if o.retry is not None:
        parts.append(f"retry {o.retry} resumed from step {o.resumed_from}, first step logged {o.first_step}"
                     + (" ('Resuming from' in its log)" if o.loaded_log else "") + f", value {o.value}")
    parts.append(f"Ray processes left: {len(o.ray_after_stop) + len(o.ray_left)}")
    c.status = "FAIL" if problems else "ok"
    c.detail = "; ".join(parts) + (f"; {'; '.join(problems)}" if problems else "")
    c.data = dataclasses.asdict(o)
    return c


def study_row(trials: list[TrialFacts], n_trials: int, metric: str, ray_left: list[str],
              interrupted: int | None = None) -> Check:
    """``ok`` when ``n_trials`` trials finished COMPLETE with the objective ``metric`` logged and a finite value
    (the worst value of a failed trial does not count), and no Ray process is left. The ``interrupted`` trial
    (FAIL, retried) is not judged here."""
    c = Check("verl study")
    judged = [f for f in trials if f.number != interrupted]
    problems = [f.problem() for f in judged if not f.ok]
    done = sum(f.ok for f in judged)
    if done < n_trials:
        problems.append(f"{done} of {n_trials} trials complete")
    if not any(f.objective for f in judged):
        problems.append(f"no {metric} recorded")
    if ray_left:
        problems.append(f"Ray processes left: {', '.join(ray_left[:5])}")
    c.status = "FAIL" if problems else "ok"
    c.detail = (f"{done} trial(s) complete, {sum(f.lines for f in trials)} metric lines, {metric} "
                f"{[round(f.objective[-1], 4) for f in judged if f.objective]}, Ray processes left: {len(ray_left)}"
                + (f"; {'; '.join(problems)}" if problems else ""))
    c.seconds = sum(f.end - f.start for f in trials if f.end == f.end and f.start == f.start)
    return c


def overlap_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which every interval ``(start, end)`` ran at once (negative: the gap; NaN: none given)."""
    if not intervals:
        return float("nan")
    return min(e for _, e in intervals) - max(s for s, _ in intervals)


@dataclass
class Pair:
    """Two trials at once (:func:`run_pair`; judged by :func:`pair_row`)."""

    exit_code: int | None = None
    seconds: float = float("nan")
    trials: list[TrialFacts] = field(default_factory=list)
    ray_left: list[str] = field(default_factory=list)
    error: str = ""


def pair_row(o: Pair) -> Check:
    """``ok`` when both trials completed with the objective, on different GPUs, and their wall-time intervals
    overlap (what catches trials that collide on one host: verl's ZMQ sockets under /tmp, Ray clusters, GPUs)."""
    c = Check("verl two trials at once", seconds=o.seconds if o.seconds == o.seconds else 0.0)
    problems = [o.error] if o.error else []
    problems += [f.problem() for f in o.trials if not f.ok]
    if len(o.trials) != 2:
        problems.append(f"{len(o.trials)} trials ran, not 2")
    both = o.trials[:2]
    overlap = overlap_s([(f.start, f.end) for f in both])
    if not overlap > 0:
        problems.append(f"the trials did not run at once (overlap {overlap:.1f} s)")
    if len({f.devices for f in both}) != len(both):
        problems.append(f"both trials got GPU(s) {both[0].devices!r}" if both else "no trial")
    if o.ray_left:
        problems.append(f"Ray processes left: {', '.join(o.ray_left[:5])}")
    c.status = "FAIL" if problems else "ok"
    shown = ", ".join(f"trial {f.number} on GPU {f.devices or '-'} {f.state} {f.end - f.start:.0f} s value {f.value}"
                      for f in both)
    c.detail = (f"{shown}; overlapping {overlap:.0f} s; Ray processes left: {len(o.ray_left)}"
                + (f"; {'; '.join(problems)}" if problems else ""))
    c.data = {"overlap_s": overlap, "trials": [dataclasses.asdict(f) for f in o.trials]}
    return c


@dataclass(frozen=True)
class MemoryFacts:
    """The verl estimate of a trial's config against what its GPU used (:func:`memory_row`)."""

    expected_gib: float  # judge_verl's estimate at the study's mean lengths
    worst_gib: float  # ... with every sequence at max_prompt_length + max_response_length
    measured_gib: float  # the GPU's peak used memory above its start (NVML, all processes)
    lengths: str  # where the expected lengths came from
    peak_phase: str
    actor_estimate_gib: float  # the estimate's actor allocator peak
    actor_allocated_gib: float  # verl's perf/max_memory_allocated_gb


def _ratio(a: float, b: float) -> float:
    return a / b if b == b and b > 0 else float("nan")


def memory_row(m: MemoryFacts) -> Check:
    """``ok`` when the expected estimate / measured is within :data:`EXPECTED_RATIO` and the worst case /
    measured is at least :data:`WORST_MIN_RATIO`."""
    c = Check("verl memory estimate")
    expected, worst = _ratio(m.expected_gib, m.measured_gib), _ratio(m.worst_gib, m.measured_gib)
    actor = _ratio(m.actor_estimate_gib, m.actor_allocated_gib)
    c.detail = (f"expected {m.expected_gib:.2f} GiB ({m.lengths}), worst case {m.worst_gib:.2f} GiB vs device peak "
                f"{m.measured_gib:.2f} GiB (NVML, all processes): ratios {expected:.2f} / {worst:.2f} (peak phase "
                f"{m.peak_phase}); actor allocator {m.actor_estimate_gib:.2f} GiB vs perf/max_memory_allocated_gb "
                f"{m.actor_allocated_gib:.2f}: ratio {actor:.2f}")
    ok = EXPECTED_RATIO[0] <= expected <= EXPECTED_RATIO[1] and worst >= WORST_MIN_RATIO
    c.status = "ok" if ok else "FAIL"
    if not ok:
        c.detail += (f"; want expected/measured in [{EXPECTED_RATIO[0]}, {EXPECTED_RATIO[1]}] and worst/measured "
                     f">= {WORST_MIN_RATIO}")
    c.data = {**dataclasses.asdict(m), "expected_ratio": expected, "worst_ratio": worst, "actor_ratio": actor}
    return c
