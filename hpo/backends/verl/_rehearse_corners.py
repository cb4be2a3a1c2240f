"""The corners of ``verl-hpo rehearse`` (:mod:`hpo.backends.verl._rehearse`): which points it runs
(:func:`rehearsal_corners`: the default point, every parameter at its low end, every parameter at its high end), each
attempt's time limit (:func:`corner_timeout`), how many run at once (:func:`corner_parallelism`), and one corner's run
with verl's ``main_ppo`` on the CPU (:class:`_Runner`: :data:`STEPS` steps; the default point one step more, killed
once its first checkpoint is complete and resumed from it as a retried trial is).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._check import trial_base_env
from hpo.backends.verl._launch import (
    DROPPED_ROW_PATTERNS,
    format_override,
    override_key,
    verl_argv,
    verl_cleanup,
    verl_env,
    verl_metrics_path,
    verl_overrides,
)
from hpo.backends.verl._rehearse_checks import CornerOutcome, RehearsalCorner, read_records, values_text
from hpo.backends.verl._resume import checkpoint_step
from hpo.execution import RunResult, TrialProcess, TrialRun
from hpo.experiment import baseline_secrets, secret_overrides

if TYPE_CHECKING:
    from hpo.experiment import Space

STEPS = 2  # training steps of each corner (validation before the first and after every step)
CORNER_TIMEOUT_S = 1800.0  # a corner's limit when neither --corner-timeout nor trial.timeout_s sets one
CORNER_CORES = 0.75  # free cores a corner needs beside another (verl's CPU workers mostly take turns)


# ----------------------------------------------------------------------------- the plan
def middle(param: Any) -> Any:
    """The middle of a parameter's range: the geometric mean on a log scale, on its step grid; the middle choice."""
    if param.type == "categorical":
        return param.choices[(len(param.choices) - 1) // 2]
    lo, hi = float(param.low), float(param.high)
    mid = math.sqrt(lo * hi) if param.log and lo > 0 else (lo + hi) / 2
    if param.step:
        mid = lo + round((mid - lo) / float(param.step)) * float(param.step)
    return int(round(mid)) if param.type == "int" else float(f"{mid:.6g}")


def rehearsal_corners(space: Space) -> list[RehearsalCorner]:
    """The default point (``study.baseline`` where it sets a tuned key, else the middle of the parameter's range: verl's
    own defaults are often invalid beside a space, e.g. ``ppo_mini_batch_size=256`` with a batch of 32), every
    parameter at its low end, every parameter at its high end (a corner equal to one before it is dropped)."""
    baseline = {override_key(k): v for k, v in space.study.baseline.items()}
    default = {p.name: baseline.get(override_key(p.key), middle(p)) for p in space.params}
    out: list[RehearsalCorner] = []
    for name, values in (("default", default), ("low", {p.name: p.corner_values()[0] for p in space.params}),
                         ("high", {p.name: p.corner_values()[-1] for p in space.params})):
        # secrets as references (their values go in the corner's environment: _secret_env), as in a trial's argv
        fixed = {**space.fixed_overrides(), **(space.study.baseline if name == "default" else {})}
        overrides = verl_overrides(fixed, {p.key: values[p.name] for p in space.params})
        if all(c.overrides != overrides for c in out):
            out.append(RehearsalCorner(name, values, overrides))
    return out


def _secret_env(space: Space) -> dict[str, str]:
    """The values of the experiment's secret overrides and ``study.baseline`` secrets, which a corner's argv holds
    as references (``hpo.experiment._secrets``)."""
    return {**secret_overrides(space.overrides), **baseline_secrets(space.raw)}


# ----------------------------------------------------------------------------- each attempt's limit, corners at once
def corner_timeout(space: Space, given: float | None) -> tuple[float, str]:
    """(each corner attempt's time limit, where it comes from): ``--corner-timeout``, else the experiment's own
    ``trial.timeout_s``, else :data:`CORNER_TIMEOUT_S`."""
    if given is not None:
        return given, "--corner-timeout"
    if space.trial.timeout_s:
        return float(space.trial.timeout_s), "trial.timeout_s"
    return CORNER_TIMEOUT_S, "the default"


def busy_cores(seconds: float = 2.0) -> float:
    """Cores the host's other processes keep busy now: the CPU time used over ``seconds`` (``/proc/stat`` through
    psutil), in cores. Measured when the rehearsal's own preparation has ended, so it is what the corners would
    share the host with; the load average would also count the rehearsal's own last minute."""
    import psutil

    from hpo.backends.verl._cpu import host_cpus

    return psutil.cpu_percent(interval=seconds) / 100.0 * (psutil.cpu_count() or host_cpus())


def corner_parallelism(cpus: int | None = None, busy: float | None = None) -> tuple[int, str]:
    """(corners run at once, why): two when the host has the free cores two corners need (its CPUs less what other
    processes keep busy, :func:`busy_cores`), else one at a time, so that a busy host slows the rehearsal, not fails
    it."""
    from hpo.backends.verl._cpu import host_cpus

    cpus = host_cpus() if cpus is None else cpus
    busy = busy_cores() if busy is None else busy
    free = cpus - busy
    if free >= 2 * CORNER_CORES:
        return 2, f"{free:.1f} of {cpus} cores free"
    return 1, f"one at a time: {max(free, 0.0):.1f} of {cpus} cores free, two corners need {2 * CORNER_CORES:g}"


# ----------------------------------------------------------------------------- running the corners
@dataclass
class _Runner:
    space: Space
    python: str
    home: Path
    shrunk: list[str]  # overrides every corner gets (tiny model, data, lengths, steps)
    timeout_s: float
    say: Callable[[str], None]
    resume: bool = True  # the default point is killed after its first checkpoint and resumed
    halt: threading.Event = field(default_factory=threading.Event)  # a stop signal: no run goes on or starts

    def corner_overrides(self, corner: RehearsalCorner, steps: int, save_freq: int) -> list[str]:
        own = [o for o in corner.overrides if override_key(o) != "trainer.logger"]  # no tracker from a rehearsal
        return [*own, *self.shrunk, format_override("trainer.total_training_steps", steps),
                format_override("trainer.save_freq", save_freq)]

    def attempt(self, outcome: CornerOutcome, overrides: list[str], attempt: int, resume_from: Path | None,
                stop_at_checkpoint: bool) -> RunResult:
        trial_dir = outcome.trial_dir
        argv = verl_argv(self.python, self.space.config, overrides, f"rehearse-{self.space.name}", outcome.index,
                         trial_dir, 0, resume_from)
        env = verl_env({**os.environ, **trial_base_env(self.space), **_secret_env(self.space)}, trial_dir, attempt,
                       cpu=True)
        stop = threading.Event()

        def tick(_step: int | None, _gb: float) -> None:
            if self.halt.is_set():
                stop.set()  # the rehearsal was stopped by a signal
            elif stop_at_checkpoint and (checkpoint_step(trial_dir / "checkpoints") or 0) >= 1:
                stop.set()  # killed as a crashed trial would be, after its first complete checkpoint

        log_dir = trial_dir if attempt == 0 else trial_dir / f"attempt{attempt}"
        try:
            metrics = verl_metrics_path(trial_dir, attempt)
            run = TrialRun(argv, env, log_dir, metrics, timeout_s=self.timeout_s, on_tick=tick, stop_event=stop,
                           dropped_row_patterns=DROPPED_ROW_PATTERNS)
            result = TrialProcess(run, private_tmp=trial_dir / f"slash-tmp{attempt}").run()
        finally:
            verl_cleanup(trial_dir, attempt, keep_logs=False)
        for line in result.log_lines():  # a log cut at its cap, the rows verl dropped: as a study's trial says them
            self.say(f"  corner {outcome.corner.name}: {line}")
        outcome.results.append(result)
        outcome.records.append(read_records(verl_metrics_path(trial_dir, attempt)))
        return result

    def run(self, corner: RehearsalCorner, index: int) -> CornerOutcome:
        outcome = CornerOutcome(corner, self.home / "trials" / f"{index}-{corner.name}", index,
                                timeout_s=self.timeout_s)
        outcome.trial_dir.mkdir(parents=True)
        if self.halt.is_set():
            return outcome
        started = time.monotonic()
        self.say(f"  corner {corner.name} ({values_text(corner.values)}) started")
        if corner.name != "default" or not self.resume:
            result = self.attempt(outcome, self.corner_overrides(corner, STEPS, -1), 0, None, False)
        else:  # one step more than the others, killed after its first checkpoint, then resumed from it
            overrides = self.corner_overrides(corner, STEPS + 1, 1)
            result = self.attempt(outcome, overrides, 0, None, True)
            step = checkpoint_step(outcome.trial_dir / "checkpoints")
            if result.stop == "interrupted" and step is not None and not self.halt.is_set():
                outcome.resumed_from = step
                self.say(f"  corner default killed after its checkpoint of step {step}; resuming from it")
                result = self.attempt(outcome, overrides, 1,
                                      outcome.trial_dir / "checkpoints" / f"global_step_{step}", False)
        how = "ok" if result.exit_code == 0 else result.failure or result.stop or f"exit {result.exit_code}"
        self.say(f"  corner {corner.name} ended: {how} in {time.monotonic() - started:.0f} s")
        return outcome

