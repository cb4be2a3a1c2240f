"""``verl-hpo rehearse``: a verl experiment's own pipeline, shrunk, run by verl's real ``main_ppo`` on the CPU in
minutes, to find what would fail a study hours into its GPU time.

What runs: the user's config and overrides, their data files (the first rows, prompts as they are), their reward
function, their objective and parameters, with a small model of the same architecture built from the model's
``config.json`` and the model's own tokenizer (``hpo/backends/verl/_shrink.py``, in verl's interpreter), on the CPU
platform of :mod:`hpo.backends.verl._cpu`. What is swapped (the model, world size, tensor parallelism, response
length, loggers) is printed, so the user knows what was not rehearsed.

Corners (:func:`rehearsal_corners`): the default point (``study.baseline`` where it sets a tuned key, else the middle
of each range), every parameter at its low end, every parameter at its high end; each :data:`STEPS`
steps with validation every step. The default point runs one step more, is killed once its first checkpoint is
complete, and resumes from it as a retried trial does (``trainer.resume_mode=resume_path``).

Checks (:class:`Finding`, one line each, naming the key, file or row): the data's columns; the reward function on
every kept validation row; keys the space sets that nothing in verl reads; each corner runs; the objective metric is
logged under exactly its name; each tuned parameter reaches the trainer where verl logs it back (:data:`ECHOES`);
non-finite metrics (a property of the corner, reported, not a failure); the checkpoint resumes at its step; the
memory estimate of each corner on the user's GPUs, at the prompt lengths measured from the data and in the worst
case. Exit 0 when a real study would run, 1 when it would fail, 2 for a bad file (raised before anything runs), 3
when this machine could not finish a corner (out of its time, killed by the host): not rehearsed, not failed.
The rehearsal's files live under ``<studies-dir>/rehearsals/<space>/`` (trials, shrunk model and data, the report).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hpo.analysis._files import FileRefused, read_bounded
from hpo.backends._registry import backend_of
from hpo.backends.verl._check import compose_corners, interpreter_problem, trial_base_env
from hpo.backends.verl._cpu import CPU_OVERRIDES, cpu_overrides, transfer_queue_overrides
from hpo.backends.verl._launch import (
    format_override,
    override_key,
    verl_argv,
    verl_cleanup,
    verl_env,
    verl_metrics_path,
    verl_overrides,
)
from hpo.backends.verl._resume import checkpoint_step, retry_note
from hpo.execution._runner import RunResult, TrialProcess
from hpo.experiment._space import SpaceError

if TYPE_CHECKING:
    from hpo.experiment._space import Space

SHRINK_SCRIPT = Path(__file__).parent / "_shrink.py"
STEPS = 2  # training steps of each corner (validation before the first and after every step)
RESPONSE_TOKENS = 16  # data.max_response_length of the rehearsal
VAL_ROWS = 8  # validation rows kept (every one is scored by the reward function)
CORNER_TIMEOUT_S = 1800.0  # a corner's limit when neither --corner-timeout nor trial.timeout_s sets one
CORNER_CORES = 0.75  # free cores a corner needs beside another (verl's CPU workers mostly take turns)
MARKER = ".verl-hpo-rehearsal"  # in a rehearsal directory: what the driver made and may replace
# A tuned key and the metric verl 0.9.1 logs it back as (the value of the corner must reach the trainer).
ECHOES = {
    "actor_rollout_ref.actor.optim.lr": "actor/lr",
    "critic.optim.lr": "critic/lr",
    "actor_rollout_ref.actor.kl_loss_coef": "actor/kl_coef",
}
# GPU-only sizes the CPU rehearsal sets to one (each swap is printed when the experiment sets another value).
ONE_DEVICE_KEYS = ("actor_rollout_ref.rollout.tensor_model_parallel_size",
                   "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                   "actor_rollout_ref.ref.ulysses_sequence_parallel_size")
EXIT_PASS, EXIT_FAIL = 0, 1
EXIT_UNFINISHED = 3  # could not finish here: a corner ran out of time or the host killed it (2: bad file)


@dataclass(frozen=True)
class Finding:
    """One line of the report: ``level`` ok (a check passed), note (reported, not a failure), unfinished (this
    machine could not finish a corner: not rehearsed, not a failure) or problem (a real study would fail)."""

    check: str
    level: str
    message: str


@dataclass(frozen=True)
class RehearsalCorner:
    name: str  # default, low, high
    values: dict[str, Any]  # parameter values (by name)
    overrides: list[str]  # the space's trainer overrides for it (fixed [+ study.baseline] + values)


@dataclass
class CornerOutcome:
    corner: RehearsalCorner
    trial_dir: Path
    index: int
    results: list[RunResult] = field(default_factory=list)  # one per attempt
    records: list[list[dict[str, Any]]] = field(default_factory=list)  # metrics lines per attempt
    resumed_from: int | None = None  # the default point: the checkpoint step its retry resumed from
    timeout_s: float | None = None  # each attempt's time limit


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
        fixed = {**space.overrides, **(space.study.baseline if name == "default" else {})}
        overrides = verl_overrides(fixed, {p.key: values[p.name] for p in space.params})
        if all(c.overrides != overrides for c in out):
            out.append(RehearsalCorner(name, values, overrides))
    return out


def _shown(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "no tuned parameters"


def rehearsal_home(studies_dir: Path, space: Space) -> Path:
    """``<studies-dir>/rehearsals/<space>``, emptied of an earlier rehearsal's files (only a directory that holds
    :data:`MARKER`, i.e. one the driver made, is ever emptied; anything else there is an error)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", space.name).lstrip(".") or "space"
    home = studies_dir / "rehearsals" / name
    if home.is_symlink() or (home.exists() and not (home / MARKER).is_file()):
        raise SpaceError(f"{home}: exists and was not made by verl-hpo rehearse; remove it or use --studies-dir")
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / MARKER).write_text("made by verl-hpo rehearse; replaced by the next rehearsal of this experiment\n")
    return home


# ----------------------------------------------------------------------------- verl's interpreter
SCRIPT_TAIL_BYTES = 4 << 20  # of a helper script's stdout and stderr, only the end is kept (its reply is the last line)


def _tail_of(stream: Any, keep: list[bytes]) -> None:
    """Read ``stream`` to its end, keeping only its last :data:`SCRIPT_TAIL_BYTES` in ``keep[0]``."""
    tail = b""
    for chunk in iter(lambda: stream.read(1 << 16), b""):
        tail = (tail + chunk)[-SCRIPT_TAIL_BYTES:]
    keep[0] = tail


def _script(python: str, script: Path, request: dict[str, Any], timeout_s: float,
            env: Mapping[str, str]) -> dict[str, Any]:
    """Run a helper script in verl's interpreter and return its one-line JSON reply; what it (or the user's code it
    calls) prints is read to the end but only its last :data:`SCRIPT_TAIL_BYTES` are kept."""
    import threading

    try:
        proc = subprocess.Popen([python, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**env, "HYDRA_FULL_ERROR": "1"})
    except OSError as err:
        return {"status": "error", "message": f"{script.name} in {python} failed ({type(err).__name__})"}
    out, err_tail = [b""], [b""]
    readers = [threading.Thread(target=_tail_of, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_tail_of, args=(proc.stderr, err_tail), daemon=True)]
    for t in readers:
        t.start()
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"status": "error", "message": f"{script.name} took over {timeout_s:.0f} s"}
    except OSError:
        pass  # it exited before reading the request: its reply (or none) says why
    finally:
        for t in readers:
            t.join(timeout=10)
    try:
        reply = json.loads(out[0].decode("utf-8", "replace").strip().splitlines()[-1])
        return reply if isinstance(reply, dict) else {"status": "error", "message": f"{script.name}: no reply"}
    except (IndexError, ValueError) as err:
        return {"status": "error", "message": f"{script.name} in {python} failed ({type(err).__name__})"}


def _config_request(config: str) -> dict[str, Any]:
    from hpo.backends.verl._launch import is_config_path

    if is_config_path(config):
        path = Path(config).expanduser().resolve()
        return {"config_dir": str(path.parent), "config_name": path.stem}
    return {"config_dir": None, "config_name": config}


# ----------------------------------------------------------------------------- running the corners
def _read_records(path: Path) -> list[dict[str, Any]]:
    """The metrics lines of a trial's file (a regular file of at most 64 MiB; a bad line is skipped)."""
    try:
        text = read_bounded(path, str(path), 64 << 20).decode("utf-8", "replace")
    except (OSError, FileRefused):
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and isinstance(rec.get("data"), dict):
            out.append(rec)
    return out


@dataclass
class _Runner:
    space: Space
    python: str
    home: Path
    shrunk: list[str]  # overrides every corner gets (tiny model, data, lengths, steps)
    timeout_s: float
    say: Callable[[str], None]
    resume: bool = True  # the default point is killed after its first checkpoint and resumed

    def corner_overrides(self, corner: RehearsalCorner, steps: int, save_freq: int) -> list[str]:
        own = [o for o in corner.overrides if override_key(o) != "trainer.logger"]  # no tracker from a rehearsal
        return [*own, *self.shrunk, format_override("trainer.total_training_steps", steps),
                format_override("trainer.save_freq", save_freq)]

    def attempt(self, outcome: CornerOutcome, overrides: list[str], attempt: int, resume_from: Path | None,
                stop_at_checkpoint: bool) -> RunResult:
        trial_dir = outcome.trial_dir
        argv = verl_argv(self.python, self.space.config, overrides, f"rehearse-{self.space.name}", outcome.index,
                         trial_dir, 0, resume_from)
        env = verl_env({**os.environ, **trial_base_env(self.space)}, trial_dir, attempt, cpu=True)
        stop = threading.Event()

        def tick(_step: int | None, _gb: float) -> None:
            if stop_at_checkpoint and (checkpoint_step(trial_dir / "checkpoints") or 0) >= 1:
                stop.set()  # killed as a crashed trial would be, after its first complete checkpoint

        log_dir = trial_dir if attempt == 0 else trial_dir / f"attempt{attempt}"
        try:
            metrics = verl_metrics_path(trial_dir, attempt)
            result = TrialProcess(argv=argv, env=env, log_dir=log_dir, metrics_path=metrics,
                                  timeout_s=self.timeout_s, on_tick=tick, stop_event=stop,
                                  private_tmp=trial_dir / f"slash-tmp{attempt}").run()
        finally:
            verl_cleanup(trial_dir, attempt, keep_logs=False)
        outcome.results.append(result)
        outcome.records.append(_read_records(verl_metrics_path(trial_dir, attempt)))
        return result

    def run(self, corner: RehearsalCorner, index: int) -> CornerOutcome:
        outcome = CornerOutcome(corner, self.home / "trials" / f"{index}-{corner.name}", index,
                                timeout_s=self.timeout_s)
        outcome.trial_dir.mkdir(parents=True)
        started = time.monotonic()
        self.say(f"  corner {corner.name} ({_shown(corner.values)}) started")
        if corner.name != "default" or not self.resume:
            result = self.attempt(outcome, self.corner_overrides(corner, STEPS, -1), 0, None, False)
        else:  # one step more than the others, killed after its first checkpoint, then resumed from it
            overrides = self.corner_overrides(corner, STEPS + 1, 1)
            result = self.attempt(outcome, overrides, 0, None, True)
            step = checkpoint_step(outcome.trial_dir / "checkpoints")
            if result.stop == "interrupted" and step is not None:
                outcome.resumed_from = step
                self.say(f"  corner default killed after its checkpoint of step {step}; resuming from it")
                result = self.attempt(outcome, overrides, 1,
                                      outcome.trial_dir / "checkpoints" / f"global_step_{step}", False)
        how = "ok" if result.exit_code == 0 else result.failure or result.stop or f"exit {result.exit_code}"
        self.say(f"  corner {corner.name} ended: {how} in {time.monotonic() - started:.0f} s")
        return outcome


# ----------------------------------------------------------------------------- checks on what the corners logged
def _train_steps(records: Sequence[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if any(k.startswith("actor/") for k in r["data"])]


_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?:: (\S.*))?$")
_WRAPPERS = {"RayTaskError", "EngineDeadError", "RayActorError", "ActorDiedError", "ActorUnavailableError",
             "RaySystemError", "TaskUnschedulableError"}
_RAY_PREFIX = re.compile(r"^\((?:[^()]|\([^()]*\))*? pid=\d+(?:, ip=[^)]*)?\)\s?")  # "(TaskRunner pid=12) "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _exception_lines(text: str) -> list[str]:
    """The exception line closing each Python traceback in ``text`` (Ray's ``(Actor pid=N)`` prefixes and colours
    removed), in order: the first line after a ``Traceback (most recent call last):`` block's indented frames.
    A wrapper's own type (``RayTaskError(ValueError)``) is reduced to the cause's when the cause is named."""
    out: list[str] = []
    in_tb = False
    for raw in text.splitlines():
        line = _RAY_PREFIX.sub("", _ANSI.sub("", raw)).rstrip()
        if line.startswith("Traceback (most recent call last)"):
            in_tb = True
            continue
        if not in_tb or not line or line[0].isspace():
            continue
        in_tb = False
        wrapped = re.match(r"^(\w+)\((\w+)\)(: .*)?$", line)  # RayTaskError(ValueError): ray::X() ...
        if wrapped and wrapped.group(1) in _WRAPPERS:
            continue  # the cause's own traceback follows (Ray prints it), or came before
        m = _EXCEPTION.match(line)
        if m and m.group(1).rpartition(".")[2] not in _WRAPPERS:
            out.append(line)
    return out


def root_cause(log_dir: Path) -> str | None:
    """The root exception of a verl run from its logs (stdout then stderr, where Ray and vLLM print their workers'
    tracebacks): the closing line of the first traceback that is not one of Ray's or vLLM's wrappers around another
    process's failure (``RayTaskError``, ``ActorDiedError``, ...). None when no traceback is in the logs."""
    for name in ("stdout.log", "stderr.log"):
        try:
            text = read_bounded(log_dir / name, name, 32 << 20).decode("utf-8", "replace")
        except (OSError, FileRefused):
            continue
        found = _exception_lines(text)
        if found:
            return found[0]
    return None


def _failure_line(result: RunResult, log_dir: Path | None = None) -> str:
    """Why a corner failed: the root exception from its logs, then the trainer's own final exception when that is
    another; with neither, that none was found and where the logs are (never a random last line of output)."""
    cause = root_cause(log_dir) if log_dir is not None else None
    final = _ANSI.sub("", result.final_exception or "").strip() or None
    if cause and final and cause not in final and final not in cause:
        text = f"{cause} (then: {final})"
    else:
        text = cause or final or (f"no exception found in its logs ({log_dir / 'stdout.log'}, stderr.log)"
                                  if log_dir is not None else "no exception found in its output")
    return " ".join(text.split())[:500]


def _how_far(o: CornerOutcome) -> str:
    """How far a corner got, from what it logged: "after verl's step-0 validation and 1 training step"."""
    records = o.records[-1] if o.records else []
    steps = _train_steps(records)
    validated = any(r["step"] == 0 or any(k.startswith("val-") for k in r["data"]) for r in records) if records \
        else False
    if not records:
        return "before verl logged its first metrics line"
    parts = ["verl's step-0 validation"] if validated and not steps else []
    if steps:
        parts.append(f"{len(steps)} training step(s) (last: {steps[-1]})")
    return "after " + (" and ".join(parts) if parts else "its first metrics line")


def unfinished_why(result: RunResult) -> str | None:
    """Why a corner could not finish on this machine, not a failure of the experiment: it ran out of the corner's
    time, or the host killed it (the kernel's OOM killer, a SIGKILL nobody here sent). None when it finished or
    failed on its own."""
    if result.stop == "timeout":
        return "ran out of the corner's time limit"
    if result.kernel_oom:
        return "was killed by the host's kernel OOM killer (this machine's memory, not the experiment's GPUs)"
    if result.stop is None and result.exit_code == -9:
        return "was killed by the host (SIGKILL, not sent by the rehearsal)"
    return None


def check_runs(space: Space, outcomes: Sequence[CornerOutcome], resumed: bool = True) -> list[Finding]:
    """Every corner ran; the objective metric was logged; tuned values reached the trainer; finite metrics; the
    default point resumed at its checkpoint's step (``resumed``: it was meant to)."""
    found: list[Finding] = []
    logged: set[str] = set()
    for o in outcomes:
        last = o.results[-1] if o.results else None
        logs = o.trial_dir if len(o.results) <= 1 else o.trial_dir / f"attempt{len(o.results) - 1}"
        host = unfinished_why(last) if last is not None else None
        if last is not None and host is not None:
            limit = f" ({o.timeout_s:.0f} s; --corner-timeout S gives it more)" if last.stop == "timeout" \
                and o.timeout_s else ""
            found.append(Finding("run", "unfinished", f"corner {o.corner.name} ({_shown(o.corner.values)}) not "
                                 f"rehearsed: it {host}{limit} {_how_far(o)}, {last.wall_time_s:.0f} s in; this "
                                 f"machine could not finish it, which says nothing against the experiment "
                                 f"(logs: {logs})"))
        elif last is None or last.exit_code != 0:
            why = "never started" if last is None else (last.failure or last.stop or f"exit {last.exit_code}")
            found.append(Finding("run", "problem", f"corner {o.corner.name} ({_shown(o.corner.values)}) failed "
                                 f"({why}): {_failure_line(last, logs) if last else ''} (logs: {logs})"))
        else:
            found.append(Finding("run", "ok", f"corner {o.corner.name} ({_shown(o.corner.values)}) ran "
                                 f"{max(_train_steps(o.records[-1]), default=0)} steps in "
                                 f"{sum(r.wall_time_s for r in o.results):.0f} s"))
        for recs in o.records:
            for rec in recs:
                logged.update(rec["data"])
    finished = any(o.results and o.results[-1].exit_code == 0 for o in outcomes)
    cut_short = any(o.results and unfinished_why(o.results[-1]) for o in outcomes)
    found += [f if finished or not cut_short or f.level != "problem" else
              Finding(f.check, "unfinished", f"not checked: no corner finished on this machine ({f.message})")
              for f in _objective(space, logged)]
    found += _echoes(space, outcomes)
    found += _finite(outcomes)
    found += _resume(outcomes) if resumed else [Finding("resume", "note", "not checked (--quick): a retried trial "
                                                         "resuming from its checkpoint; rehearse without --quick")]
    note = retry_note(space)
    if note:
        found.append(Finding("resume", "note", note))
    return found


def _objective(space: Space, logged: set[str]) -> list[Finding]:
    metrics = [space.objective.metric] if space.objective.metric else []
    metrics += [o.metric for o in getattr(space.objective, "objectives", ()) or () if getattr(o, "metric", None)]
    if space.early_stopping.enabled and space.early_stopping.metric:
        metrics.append(space.early_stopping.metric)
    out = []
    for metric in dict.fromkeys(metrics):
        if metric in logged:
            out.append(Finding("objective", "ok", f"{metric} is logged"))
            continue
        if not logged:
            out.append(Finding("objective", "problem", f"objective metric {metric!r} could not be checked: no corner "
                               "logged any metric"))
            continue
        near = difflib.get_close_matches(metric, sorted(logged), n=5, cutoff=0.0)
        out.append(Finding("objective", "problem", f"objective metric {metric!r} was never logged; the names logged, "
                           f"closest first: {', '.join(near)}"))
    return out


def _echoes(space: Space, outcomes: Sequence[CornerOutcome]) -> list[Finding]:
    out = []
    for p in space.params:
        metric = ECHOES.get(override_key(p.key))
        if metric is None:
            continue
        for o in outcomes:
            if p.name not in o.corner.values or not o.records or not o.results or o.results[-1].exit_code != 0:
                continue
            want = float(o.corner.values[p.name])
            seen = [r["data"][metric] for recs in o.records for r in recs
                    if isinstance(r["data"].get(metric), (int, float))]
            if not seen:
                out.append(Finding("reach", "note", f"params.{p.name}: verl logged no {metric} in corner "
                                   f"{o.corner.name}, so its value could not be checked"))
            elif not any(math.isclose(v, want, rel_tol=1e-5, abs_tol=1e-12) for v in seen):
                out.append(Finding("reach", "problem", f"params.{p.name} ({p.key}) = {want:g} in corner "
                                   f"{o.corner.name}, but verl logged {metric} = {seen[-1]:g}: the tuned value does "
                                   "not reach the trainer"))
            else:
                out.append(Finding("reach", "ok", f"params.{p.name} reaches the trainer ({metric} = {want:g} in "
                                   f"corner {o.corner.name})"))
    return out


def _finite(outcomes: Sequence[CornerOutcome]) -> list[Finding]:
    out = []
    for o in outcomes:
        bad = [(r["step"], k) for recs in o.records for r in recs for k, v in r["data"].items()
               if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            step, key = bad[0]
            out.append(Finding("finite", "note", f"corner {o.corner.name} ({_shown(o.corner.values)}) logged a "
                               f"non-finite {key} at step {step} ({len(bad)} values in all): a property of this "
                               "corner, which the study will record, not a failure of the rehearsal"))
    return out


def _resume(outcomes: Sequence[CornerOutcome]) -> list[Finding]:
    o = next((o for o in outcomes if o.corner.name == "default"), None)
    if o is None or not o.results:
        return []
    if unfinished_why(o.results[-1]) is not None:
        return [Finding("resume", "unfinished", "not checked: corner default could not finish on this machine, so "
                        "its kill and resume were not rehearsed")]
    if o.resumed_from is None:
        if o.results[0].exit_code == 0 or o.results[0].stop == "interrupted":
            return [Finding("resume", "problem", "corner default saved no complete checkpoint with "
                            "trainer.save_freq=1, so a retried trial would start over")]
        return [Finding("resume", "note", "not checked: corner default failed before its first checkpoint, so a "
                        "retried trial resuming from it was not rehearsed")]
    steps = _train_steps(o.records[-1]) if len(o.records) > 1 else []
    if o.results[-1].exit_code == 0 and steps and steps[0] == o.resumed_from + 1:
        return [Finding("resume", "ok", f"the checkpoint of step {o.resumed_from} resumes at step {steps[0]} (the "
                        "retry logged steps " + ", ".join(map(str, steps)) + ")")]
    return [Finding("resume", "problem", f"the checkpoint of step {o.resumed_from} did not resume at step "
                    f"{o.resumed_from + 1}: the retry logged training steps {steps or 'none'}")]


# ----------------------------------------------------------------------------- the memory estimate
def memory_lines(space: Space, corners: Sequence[RehearsalCorner], inputs: Any, gpus: int | None = None,
                 gpu_bytes: int | None = None) -> list[Finding]:
    """Each corner's estimate on the real study's GPUs (``gpus`` per trial, else ``trial.gpus_per_trial``; GPUs of
    ``gpu_bytes``): at the prompts measured from the data and a short response (what ``search`` refuses on) and in
    the worst case. ``inputs`` were composed for that many GPUs."""
    from hpo.backends._preflight import GiB, predictions_from_inputs

    if not gpus and space.trial.gpus_per_trial == 0:
        return [Finding("memory", "note", "trial.gpus_per_trial is 0: the study's trials run on the CPU, as here; "
                                          "no GPU estimate (--gpus N --gpu-memory 80GiB gives one for N GPUs)")]
    try:
        preds = predictions_from_inputs(space, inputs, [], None, gpu_bytes)
    except Exception as err:  # noqa: BLE001 - ModelConfigUnavailable and SpaceError: reported, not fatal
        return [Finding("memory", "note", f"no memory estimate: {err}")]
    out = []
    for corner, pred in zip(corners, preds, strict=True):
        level = "ok" if pred.fits else "problem"
        worst = pred.worst_total if pred.worst_total is not None else pred.total
        lengths = pred.table.splitlines()[0].removeprefix("at the expected lengths: ")
        verdict = "fits" if pred.fits and not pred.warning else "fits, but the worst case does not" if pred.fits \
            else "DOES NOT FIT"
        out.append(Finding("memory", level, f"corner {corner.name} on {gpus or space.trial.gpus_per_trial} GPU(s): "
                           f"{pred.total / GiB:.1f} GiB per GPU at {lengths}; "
                           f"{worst / GiB:.1f} GiB in the worst case; budget {pred.budget / GiB:.0f} GiB "
                           f"({pred.budget_source}): {verdict}"))
    if out and all(f.level == "problem" for f in out):
        return out
    return [f if f.level == "ok" else Finding("memory", "note", f.message) for f in out]


# ----------------------------------------------------------------------------- --recheck: the checks again
STATE = "rehearsal.json"  # what --recheck reads: the experiment's fingerprint, the swaps, each corner's attempts


def fingerprint(space: Space) -> str:
    """What decides a rehearsal's runs: the config, the fixed overrides, the parameters, the baseline and the trial
    section (not the objective, early stopping or the study's search settings, which --recheck may change)."""
    import dataclasses
    import hashlib

    decides = {"config": space.config, "overrides": space.overrides, "baseline": space.study.baseline,
               "params": [dataclasses.asdict(p) for p in space.params], "trial": dataclasses.asdict(space.trial)}
    return hashlib.sha256(json.dumps(decides, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_state(home: Path, space: Space, swaps: Sequence[str], outcomes: Sequence[CornerOutcome], quick: bool,
               before: Sequence[Finding]) -> None:
    corners = [{"name": o.corner.name, "values": o.corner.values, "trial_dir": str(o.trial_dir), "index": o.index,
                "resumed_from": o.resumed_from,
                "results": [{"exit_code": r.exit_code, "stop": r.stop, "wall_time_s": r.wall_time_s,
                             "final_exception": r.final_exception, "stderr_tail": r.stderr_tail[-2000:]}
                            for r in o.results]} for o in outcomes]
    (home / STATE).write_text(json.dumps({"fingerprint": fingerprint(space), "quick": quick, "swaps": list(swaps),
                                          "before": [f.__dict__ for f in before], "corners": corners}, default=str))


def recheck(space: Space, studies_dir: Path, *, fmt: str = "text", out: TextIO = sys.stdout) -> int:
    """The checks on the runs of this experiment's last rehearsal again (nothing is run): after fixing what does
    not change the runs, such as the objective's name. SpaceError when there is none, or the experiment changed."""
    started = time.monotonic()
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", space.name).lstrip(".") or "space"
    home = studies_dir / "rehearsals" / name
    try:
        if not (home / MARKER).is_file():
            raise FileNotFoundError
        state = json.loads(read_bounded(home / STATE, STATE, 16 << 20))
    except (OSError, FileRefused, ValueError):
        raise SpaceError(f"{space.source}: no finished rehearsal in {home}: run verl-hpo rehearse first") from None
    if not isinstance(state, dict):
        raise SpaceError(f"{space.source}: the rehearsal state {home / STATE} is malformed (a JSON "
                         f"{type(state).__name__}, not an object): rehearse again")
    if state.get("fingerprint") != fingerprint(space):
        raise SpaceError(f"{space.source}: config, overrides, params or trial changed since the rehearsal in {home}: "
                         "rehearse again (--recheck only reruns the checks)")
    try:  # a file on disk: anything may be in it
        outcomes = []
        for c in state["corners"]:
            corner = RehearsalCorner(str(c["name"]), dict(c["values"]), [])
            o = CornerOutcome(corner, Path(c["trial_dir"]), int(c["index"]), resumed_from=c.get("resumed_from"))
            for attempt, r in enumerate(c["results"]):
                o.results.append(RunResult(r["exit_code"], r["stop"], 0.0, float(r["wall_time_s"]), None, None,
                                           str(r["stderr_tail"]), final_exception=r["final_exception"]))
                o.records.append(_read_records(verl_metrics_path(o.trial_dir, attempt)))
            outcomes.append(o)
        before = [Finding(**f) for f in state["before"]]
        quick = bool(state["quick"])
        swaps = [str(x) for x in state["swaps"]]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise SpaceError(f"{space.source}: the rehearsal state {home / STATE} is malformed ({type(err).__name__}: "
                         f"{str(err)[:200]}): rehearse again") from None
    findings = before + check_runs(space, outcomes, resumed=not quick)
    text = render(space, swaps, findings, fmt, time.monotonic() - started, home)
    out.write(text)
    out.flush()
    return exit_code(findings)


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when a real study would fail, else 3 when a corner could not finish here, else 0."""
    if any(f.level == "problem" for f in findings):
        return EXIT_FAIL
    return EXIT_UNFINISHED if any(f.level == "unfinished" for f in findings) else EXIT_PASS


# ----------------------------------------------------------------------------- the report
def render(space: Space, swaps: Sequence[str], findings: Sequence[Finding], fmt: str, seconds: float,
           home: Path) -> str:
    problems = [f for f in findings if f.level == "problem"]
    unfinished = [f for f in findings if f.level == "unfinished" and f.check == "run"]
    verdict = (f"FAIL: {len(problems)} problem(s); a real study would fail" if problems else
               f"NOT FINISHED HERE: {len(unfinished)} corner(s) could not finish on this machine (not rehearsed, "
               "not failed); the checks that ran passed" if unfinished else
               "PASS: a real study of this experiment would run")
    mark = {"ok": "ok", "note": "note", "unfinished": "NOT RUN", "problem": "PROBLEM"}
    if fmt == "md":
        lines = [f"## verl-hpo rehearse: `{space.source}`", "", f"**{verdict}** ({seconds:.0f} s on the CPU; files "
                 f"in `{home}`)", "", "### Not rehearsed (swapped for the CPU)", ""]
        lines += [f"- {s}" for s in swaps] + ["", "### Checks", "", "| check | result | detail |", "|---|---|---|"]
        lines += [f"| {f.check} | {mark[f.level]} | {f.message.replace('|', '/')} |" for f in findings]
        return "\n".join(lines) + "\n"
    lines = [f"rehearsal of {space.source}: {verdict} ({seconds:.0f} s; files in {home})", "swapped for the CPU:"]
    lines += [f"  {s}" for s in swaps]
    lines += [f"{mark[f.level]:>7}  {f.check}: {f.message}" for f in findings]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the command
def _prepare(space: Space, home: Path) -> str | None:
    """The experiment's prepare step (its data, its model), as ``search`` runs it; one line when it fails."""
    cmd = space.trial.prepare_command
    if not cmd:
        return None
    argv = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(cmd)]
    argv += ["--config", space.config, *space.trainer_overrides({})]
    result = TrialProcess(argv=argv, env=dict(os.environ), log_dir=home / "prepare",
                          metrics_path=home / "prepare" / "metrics.jsonl").run()
    if result.exit_code != 0:
        return f"trial.prepare_command failed (exit {result.exit_code}): {_failure_line(result)}"
    return None


def _model_configs(selected: Mapping[str, Any], use_critic: bool) -> dict[str, dict[str, Any]]:
    from verl_core.memory_verl import read_hub_or_local_config

    keys = ["actor_rollout_ref.model.path"]
    if use_critic and selected.get("critic.model.path") not in (None, selected.get(keys[0])):
        keys.append("critic.model.path")
    return {k: read_hub_or_local_config(str(selected.get(k)), k) for k in keys}


def _shrunk_overrides(space: Space, reply: Mapping[str, Any], selected: Mapping[str, Any], response_tokens: int,
                      swaps: list[str], quick: bool = False) -> list[str]:
    """What every corner gets on top of its own overrides, each swap described in ``swaps``."""
    models = reply["models"]
    actor = models["actor_rollout_ref.model.path"]
    out = [format_override("actor_rollout_ref.model.path", actor["dir"])]
    swaps.append(f"model: {actor['architecture']} {actor['from']} -> {actor['to']} (random weights, float32; "
                 f"the model's own tokenizer from {actor['tokenizer']}): rewards and learning are not rehearsed")
    critic = models.get("critic.model.path")
    if selected.get("critic.model.path") is not None:
        out.append(format_override("critic.model.path", (critic or actor)["dir"]))
    data = reply["data"]
    max_prompt = int(selected.get("data.max_prompt_length") or 512)
    # the longest kept prompt, so nothing is cut or filtered that the real run keeps, and no padding beyond it
    prompt = min(max_prompt, max(int(data[s]["prompt_tokens"]["max"]) for s in ("train", "val")))
    out += [format_override("data.train_files", data["train"]["file"]),
            format_override("data.val_files", data["val"]["file"]),
            format_override("data.max_prompt_length", prompt),
            format_override("data.max_response_length", response_tokens),
            format_override("trainer.total_epochs", 100), format_override("trainer.test_freq", 1),
            format_override("trainer.val_before_train", True), format_override("trainer.logger", ["console"])]
    picked = (f"the {data['train']['rows']} training rows with the longest prompts (of {data['train'].get('total')})"
              if data["train"].get("picked") == "longest" else f"the first {data['train']['rows']} training rows")
    swaps.append(f"data: {picked} and the first {data['val']['rows']} validation rows (prompts "
                 f"as they are: mean {data['train']['prompt_tokens']['mean']:.0f}, longest "
                 f"{data['train']['prompt_tokens']['max']} tokens); data.max_prompt_length "
                 f"{max_prompt} -> {prompt}, data.max_response_length "
                 f"{selected.get('data.max_response_length')} -> {response_tokens}")
    swaps.append(f"steps: {STEPS} per corner (" + ("--quick: the default point only, no resume" if quick else
                 f"the default point {STEPS + 1}, killed after its first checkpoint and resumed") + "), validation "
                 "before the first step and after every step; loggers: console (+ the file logger the driver reads)")
    gpus = int(selected.get("trainer.n_gpus_per_node") or 1) * int(selected.get("trainer.nnodes") or 1)
    swaps.append(f"devices: the CPU (verl's CPU platform, gloo, vLLM's CPU build) for trial.gpus_per_trial="
                 f"{space.trial.gpus_per_trial} ({gpus} GPU(s) in the config): world size, GPU memory and speed are "
                 "not rehearsed (the memory estimate below is)")
    for key in ONE_DEVICE_KEYS:
        if selected.get(key) not in (None, 1):
            out.append(format_override(key, 1))
            swaps.append(f"{key}: {selected.get(key)} -> 1")
    swaps.append("CPU platform overrides: " + ", ".join(sorted({k.lstrip("+") for k in CPU_OVERRIDES})))
    return out


REHEARSAL_SELECT = ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size",
                    *ONE_DEVICE_KEYS)


def refusal(space: Space) -> str:
    """Why ``space`` cannot be rehearsed ("" when it can): only verl experiments are."""
    if backend_of(space).name == "verl":
        return ""
    return (f"{space.source}: trial.backend is {space.trial.backend!r}: rehearse runs verl experiments "
            "(trial.backend: verl)")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g|mib|mb|m|tib|tb|t)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """Bytes of a GPU size as typed: ``80GiB``, ``141G``, ``24576MiB``, a bare number is GiB (G, GB and GiB are
    all 2**30: GPU makers' "80 GB" is 80 GiB of memory). None when it is not a positive size."""
    m = _SIZE.match(text)
    if not m:
        return None
    unit = (m.group(2) or "g").lower()[0]
    size = float(m.group(1)) * {"m": 2**20, "g": 2**30, "t": 2**40}[unit]
    return int(size) if size >= 2**20 else None


def corner_timeout(space: Space, given: float | None) -> tuple[float, str]:
    """(each corner attempt's time limit, where it comes from): ``--corner-timeout``, else the experiment's own
    ``trial.timeout_s``, else :data:`CORNER_TIMEOUT_S`."""
    if given is not None:
        return given, "--corner-timeout"
    if space.trial.timeout_s:
        return float(space.trial.timeout_s), "trial.timeout_s"
    return CORNER_TIMEOUT_S, "the default"


def corner_parallelism(cpus: int | None = None, load: float | None = None) -> tuple[int, str]:
    """(corners run at once, why): two when the host has the free cores two corners need (its CPUs less the last
    minute's load average), else one at a time, so that a busy host slows the rehearsal, not fails it."""
    from hpo.backends.verl._cpu import host_cpus

    cpus = host_cpus() if cpus is None else cpus
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
    free = cpus - load
    if free >= 2 * CORNER_CORES:
        return 2, f"{free:.1f} of {cpus} cores free"
    return 1, f"one at a time: {max(free, 0.0):.1f} of {cpus} cores free, two corners need {2 * CORNER_CORES:g}"


def rehearse(space: Space, studies_dir: Path, *, tokenizer: Path | None = None, fmt: str = "text",
             out: TextIO = sys.stdout, err: TextIO = sys.stderr, python: str | None = None,
             response_tokens: int = RESPONSE_TOKENS, timeout_s: float | None = None,
             parallel: int | None = None, quick: bool = False, reward_timeout_s: float = 120.0,
             gpus: int | None = None, gpu_bytes: int | None = None) -> int:
    """Run the rehearsal (see the module docstring) and print its report; the exit code. ``quick``: the default
    point only, without the resume (the objective, the reward and the keys are still checked). ``reward_timeout_s``:
    what the reward check's calls of the user's function may take in all. ``timeout_s``: each corner attempt's
    limit (None: :func:`corner_timeout`); ``parallel``: corners at once (None: :func:`corner_parallelism`).
    ``gpus``, ``gpu_bytes``: the real study's GPUs per trial and GPU size for the memory estimate (None:
    ``trial.gpus_per_trial``; this host's GPU, else an 80 GiB one)."""
    from hpo.backends._preflight import MEASURED_PROMPTS, verl_memory_inputs
    from hpo.backends.verl._launch import default_python

    started = time.monotonic()
    python = python or space.trial.python or default_python()

    def say(line: str) -> None:
        print(line, file=err, flush=True)

    home = rehearsal_home(studies_dir, space)
    findings: list[Finding] = []
    swaps: list[str] = []

    def finish() -> int:
        text = render(space, swaps, findings, fmt, time.monotonic() - started, home)
        (home / ("report.md" if fmt == "md" else "report.txt")).write_text(text)
        (home / "report.json").write_text(json.dumps([f.__dict__ for f in findings], indent=1))
        out.write(text)
        out.flush()
        return exit_code(findings)

    say(f"rehearsing {space.source} on the CPU in {home}")
    problem = _prepare(space, home)
    if problem:
        findings.append(Finding("prepare", "problem", problem))
        return finish()
    corners = rehearsal_corners(space)[:1] if quick else rehearsal_corners(space)
    say(f"composing {len(corners)} corners and measuring the prompts in {python}")
    try:
        inputs = verl_memory_inputs(space, [c.overrides for c in corners], gpus or max(1, space.trial.gpus_per_trial),
                                    python,
                                    MEASURED_PROMPTS, extra_select=REHEARSAL_SELECT)
    except SpaceError as bad:
        findings.append(Finding("config", "problem", str(bad)))
        return finish()
    info, selected = inputs[0]
    from hpo.backends.verl._data import overlong_verdict

    long = overlong_verdict((info.get("prompt_lengths") or {}).get("overlong"))
    if long is not None:
        findings.append(Finding("data", "problem" if long[0] == "problem" else "note", long[1]))
    try:
        models = _model_configs(selected, bool(info.get("use_critic")))
    except Exception as bad:  # noqa: BLE001 - verl_core's ConfigError / ModelConfigUnavailable: one line
        path = selected.get("actor_rollout_ref.model.path")
        findings.append(Finding("model", "problem", f"{bad}; to rehearse, fetch config.json, tokenizer.json and "
                                f"tokenizer_config.json of {path} (https://huggingface.co/{path}) into a directory "
                                "and set --override actor_rollout_ref.model.path=DIR"))
        return finish()
    set_keys = [*space.overrides, *(p.key for p in space.params)]
    request = {**_config_request(space.config), "overrides": corners[0].overrides, "out": str(home / "shrunk"),
               "train_rows": max(1, int(selected.get("data.train_batch_size") or 8)) * (STEPS + 1),
               "val_rows": VAL_ROWS, "tokenizer": str(tokenizer) if tokenizer else None, "models": models,
               "set_keys": set_keys, "reward_timeout_s": reward_timeout_s}
    say("building the small model, taking the data's first rows, calling the reward function")
    reply = _script(python, SHRINK_SCRIPT, request, 900.0, {**os.environ, **trial_base_env(space)})
    if reply.get("status") != "ok":
        findings.append(Finding("shrink", "problem", f"the rehearsal could not be prepared: {reply.get('message')}"))
        return finish()
    for p in reply["problems"]:
        findings.append(Finding(p["check"], "problem", p["message"]))
    tuned = {p.key: p.name for p in space.params}
    for key in reply["unread"]:
        if key in tuned:
            findings.append(Finding("reach", "problem", f"params.{tuned[key]}: {key} is not a key of verl's config and "
                                    f"no file of verl mentions {key.rpartition('.')[2]!r}: the tuned value reaches "
                                    "no trainer (a typo?)"))
        else:
            findings.append(Finding("keys", "note", f"overrides.{key}: not a key of verl's config and no file of verl "
                                    f"mentions {key.rpartition('.')[2]!r}: nothing reads it"))
    if reply["problems"] or any(f.level == "problem" for f in findings):
        return finish()
    reward = reply["reward"]
    findings.append(Finding("data", "ok", f"data files have the columns verl reads; {reply['data']['train']['rows']} "
                            "training prompts tokenized with the model's chat template"))
    findings.append(Finding("reward", "ok", f"{reward['where']} returned finite numbers in {reward['calls']} calls on "
                            f"{reply['data']['val']['rows']} validation rows and the "
                            f"{reply['data']['train'].get('unusual', 0)} training rows with the most unusual ground "
                            f"truths (from {reward['min']:g} to "
                            f"{reward['max']:g})"))
    shrunk = _shrunk_overrides(space, reply, selected, response_tokens, swaps, quick)
    limit, limit_from = corner_timeout(space, timeout_s)
    runner = _Runner(space, python, home, shrunk, limit, say, resume=not quick)
    cpu = [[*cpu_overrides(o), *transfer_queue_overrides(o, True), *o]
           for o in (runner.corner_overrides(c, STEPS, -1) for c in corners)]
    report = compose_corners(python, space.config, cpu, 0, env={**os.environ, **trial_base_env(space)})
    for corner, result in zip(corners, report.results, strict=True):
        if isinstance(result, Exception):
            findings.append(Finding("config", "problem", f"corner {corner.name} shrunk for the CPU is rejected by "
                                    f"verl: {result}"))
        else:
            why = interpreter_problem(report.interpreter or {}, result, python, cpu=True)
            if why:
                findings.append(Finding("interpreter", "problem", why))
                break
    if any(f.level == "problem" for f in findings):
        return finish()
    at_once, why = (parallel, "as asked") if parallel else corner_parallelism()
    say(f"running {len(corners)} corners with verl's main_ppo on the CPU, {at_once} at a time ({why}); each "
        f"attempt's limit {limit:.0f} s ({limit_from})")
    with ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
        outcomes = list(pool.map(runner.run, corners, range(len(corners))))
    findings += memory_lines(space, corners, inputs, gpus, gpu_bytes)
    save_state(home, space, swaps, outcomes, quick, findings)
    findings += check_runs(space, outcomes, resumed=not quick)
    return finish()
