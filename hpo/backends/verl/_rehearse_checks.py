"""What ``verl-hpo rehearse`` (:mod:`hpo.backends.verl._rehearse`) makes of the corners it ran: each check on what
they logged is a :class:`Finding` (one line naming the key, file or row); the verdict and its exit code
(:func:`exit_code`) and the report (:func:`render`). Read again by ``--recheck`` from the runs a rehearsal kept.

The checks (:func:`check_runs`): each corner ran, else why (the root exception from its workers' logs,
:func:`root_cause`), or that this machine could not finish it (:func:`unfinished_why`: out of its time, killed by the
host, Ray not started in time; not rehearsed, not failed); the objective metric is logged under exactly its name; each
tuned parameter reaches the trainer where verl logs it back (:data:`ECHOES`); non-finite metrics (a property of the
corner, reported, not a failure); the default point's checkpoint resumes at its step.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.analysis import FileRefused, read_bounded
from hpo.backends.verl._launch import RAY_START_TIMEOUT, override_key
from hpo.backends.verl._resume import retry_note
from hpo.execution import RunResult

if TYPE_CHECKING:
    from hpo.experiment import Space

# A tuned key and the metric verl 0.9.1 logs it back as (the value of the corner must reach the trainer).
ECHOES = {
    "actor_rollout_ref.actor.optim.lr": "actor/lr",
    "critic.optim.lr": "critic/lr",
    "actor_rollout_ref.actor.kl_loss_coef": "actor/kl_coef",
}
EXIT_PASS, EXIT_FAIL = 0, 1
EXIT_UNFINISHED = 3  # could not finish here: a corner ran out of time or the host killed it (2: bad file)
LEVELS = ("ok", "note", "unfinished", "problem")  # a Finding's level


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


def values_text(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "no tuned parameters"


def read_records(path: Path) -> list[dict[str, Any]]:
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


def failure_line(result: RunResult, log_dir: Path | None = None) -> str:
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


def unfinished_why(result: RunResult, log_dir: Path | None = None) -> str | None:
    """Why a corner could not finish on this machine, not a failure of the experiment: it ran out of the corner's
    time, the host killed it (the kernel's OOM killer, a SIGKILL nobody here sent), or Ray could not start on this
    machine in time (:data:`RAY_START_TIMEOUT`, from the attempt's logs in ``log_dir``). None when it finished or
    failed on its own."""
    if result.stop == "timeout":
        return "ran out of the corner's time limit"
    if result.kernel_oom:
        return "was killed by the host's kernel OOM killer (this machine's memory, not the experiment's GPUs)"
    if result.stop is None and result.exit_code == -9:
        return "was killed by the host (SIGKILL, not sent by the rehearsal)"
    if result.exit_code != 0 and RAY_START_TIMEOUT in failure_line(result, log_dir):
        return "could not start Ray on this machine in time (Ray: the node timed out during startup: a busy host)"
    return None


def _last_logs(o: CornerOutcome) -> Path:
    """The directory of a corner's last attempt's logs."""
    return o.trial_dir if len(o.results) <= 1 else o.trial_dir / f"attempt{len(o.results) - 1}"


def check_runs(space: Space, outcomes: Sequence[CornerOutcome], resumed: bool = True) -> list[Finding]:
    """Every corner ran; the objective metric was logged; tuned values reached the trainer; finite metrics; the
    default point resumed at its checkpoint's step (``resumed``: it was meant to)."""
    found: list[Finding] = []
    logged: set[str] = set()
    # each corner's host reason once (it may read the last attempt's logs, up to 32 MB each)
    hosts = {o.corner.name: unfinished_why(o.results[-1], _last_logs(o)) if o.results else None for o in outcomes}
    for o in outcomes:
        last = o.results[-1] if o.results else None
        logs = _last_logs(o)
        host = hosts[o.corner.name]
        if last is not None and host is not None:
            limit = f" ({o.timeout_s:.0f} s; --corner-timeout S gives it more)" if last.stop == "timeout" \
                and o.timeout_s else ""
            found.append(Finding("run", "unfinished", f"corner {o.corner.name} ({values_text(o.corner.values)}) not "
                                 f"rehearsed: it {host}{limit} {_how_far(o)}, {last.wall_time_s:.0f} s in; this "
                                 f"machine could not finish it, which says nothing against the experiment "
                                 f"(logs: {logs})"))
        elif last is None or last.exit_code != 0:
            why = "never started" if last is None else (last.failure or last.stop or f"exit {last.exit_code}")
            found.append(Finding("run", "problem", f"corner {o.corner.name} ({values_text(o.corner.values)}) failed "
                                 f"({why}): {failure_line(last, logs) if last else ''} (logs: {logs})"))
        else:
            found.append(Finding("run", "ok", f"corner {o.corner.name} ({values_text(o.corner.values)}) ran "
                                 f"{max(_train_steps(o.records[-1]), default=0)} steps in "
                                 f"{sum(r.wall_time_s for r in o.results):.0f} s"))
        for recs in o.records:
            for rec in recs:
                logged.update(rec["data"])
    finished = any(o.results and o.results[-1].exit_code == 0 for o in outcomes)
    cut_short = any(hosts.values())
    found += [f if finished or not cut_short or f.level != "problem" else
              Finding(f.check, "unfinished", f"not checked: no corner finished on this machine ({f.message})")
              for f in _objective(space, logged)]
    found += _echoes(space, outcomes)
    found += _finite(outcomes)
    found += _resume(outcomes, hosts) if resumed else [
        Finding("resume", "note", "not checked (--quick): a retried trial resuming from its checkpoint; rehearse "
                "without --quick")]
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
            want = o.corner.values[p.name]
            if isinstance(want, bool) or not isinstance(want, (int, float)):
                continue  # a value read back by --recheck that is no number: nothing to compare
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
            out.append(Finding("finite", "note", f"corner {o.corner.name} ({values_text(o.corner.values)}) logged a "
                               f"non-finite {key} at step {step} ({len(bad)} values in all): a property of this "
                               "corner, which the study will record, not a failure of the rehearsal"))
    return out


def _resume(outcomes: Sequence[CornerOutcome], hosts: dict[str, str | None]) -> list[Finding]:
    o = next((o for o in outcomes if o.corner.name == "default"), None)
    if o is None or not o.results:
        return []
    if hosts[o.corner.name] is not None:
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
    slow = next((f for f in findings if f.level == "unfinished"), None)  # a step before the corners ran out of time
    verdict = (f"FAIL: {len(problems)} problem(s); a real study would fail" if problems else
               f"NOT FINISHED HERE: {len(unfinished)} corner(s) could not finish on this machine (not rehearsed, "
               "not failed); the checks that ran passed" if unfinished else
               f"NOT FINISHED HERE: this machine could not finish the rehearsal's {slow.check} step in its time (not "
               "rehearsed, not failed); the checks that ran passed" if slow else
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
