"""A throughput study's picks, re-measured against the user's config and checked for the same math.

``verl-hpo confirm`` of a throughput study (:func:`hpo.study._confirm.queue_speed_check`) queues, for each of
``study.throughput.repeats`` seeds (``study.confirm.seed_base`` upwards), a run of the user's config
(``study.baseline``: its speed settings as overrides on the fixed ones; empty = the fixed overrides as they are) and
one of each of the ``top_k`` fastest distinct search trials, in that order on even seeds and reversed on odd ones
(ABBA: a linear drift of the host's speed cancels out); the driver runs them one at a time
(:class:`~hpo.study._driver.Driver`), so the user's config and the picks alternate on the same host and a slow
minute of a shared machine falls on both. Runs are ordinary confirmation runs of the study (``hpo:confirm_of``,
``hpo:confirm_seed``, ``hpo:baseline``): several drivers share them, and an interrupted confirm resumes.

:func:`speed_report` then gives, per pick:

* the speed-up: the geometric mean of the paired ratios pick / user's config of the runs on one seed (in the faster
  direction: time-per-step objectives are inverted), with its 95% t interval over the log ratios;
* the same-math check (:mod:`hpo.reporting._same_math`): at each seed, the first training step's ``math_metrics``
  (losses, gradient norm, score) of the pick's run and of the user's config's run must agree within ``tolerance``
  of their values where both updates saw the same samples (the trainer reproduces its first step, or both runs
  replayed one recorded first rollout), else within the control's spread; a metric logged by one run only
  disagrees. A pick that disagrees anywhere is reported with the metric and both values, and is not recommended.

``confirm`` re-measures until the decision is made (:func:`unresolved`): while the fastest pick that computes the
same update is not separated from the user's config (its interval includes 1), it queues one more seed's block, up
to ``study.throughput.max_repeats`` seeds (:func:`~hpo.experiment._throughput.repeat_cap`).

The recommendation is the fastest pick that passes the same-math check and is separated faster than the user's
config (its interval above 1). A pick faster by a ratio its interval does not support is not one: the verdict is "no
setting faster than yours was found on this host" (:data:`NONE_FASTER`), and ``best`` prints the user's own settings
(``study.baseline``) with that line. Otherwise ``best --format overrides`` prints the pick's speed settings and a
learning study takes them with ``study.speed_from``, only from a complete confirmation (:func:`confirmation_gaps`:
every paired run there, an interval that excludes 1), checked again by each ``resume`` / ``worker`` / ``confirm`` of the
learning study (:mod:`hpo.reporting._speed_from`).

Every value is read as untrusted (a trainer's bug or a planted storage): a run whose throughput is not in
(:data:`~hpo.experiment._throughput.SPEED_MIN`, ``SPEED_MAX``) is not a measurement and is skipped with a note, so a
ratio never underflows to 0 or overflows to inf, and a first step's non-numbers are not compared.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Space, repeat_cap, speed_value_ok
from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, is_confirm
from hpo.reporting._same_math import LOOSE_FLOOR, NOISE_FACTOR, UNCOMPARABLE, first_step, math_disagreements, run_noise
from hpo.study import BASELINE_OF, CONTROL_OF, LEVEL, strict_pair, t_quantile


@dataclass
class SpeedPick:
    """One pick against the user's config."""

    trial: FrozenTrial
    search_value: float
    pairs: list[tuple[int, float, float]] = field(default_factory=list)  # (seed, pick's value, user's value)
    failed: int = 0  # runs of the pick that ended without a finite value (an OOM, a crash)
    out_of_range: int = 0  # runs of the pick whose stored value is not a measurement (skipped)
    ratio: float | None = None  # > 1: faster than the user's config
    low: float | None = None
    high: float | None = None
    disagreements: list[str] = field(default_factory=list)  # the same-math check's findings
    compared: int = 0  # seeds whose first steps were compared
    replayed: int = 0  # ... of which both runs updated on one recorded first rollout (the strict check)

    @property
    def same_math(self) -> bool | None:
        """True: every compared first step agrees; False: one does not; None: nothing compared yet."""
        if self.disagreements:
            return False
        return True if self.compared else None

    @property
    def separated(self) -> bool:
        """Its 95% interval of the speed-up excludes 1 (faster or slower than the user's config: told apart)."""
        return self.low is not None and self.high is not None and (self.low > 1.0 or self.high < 1.0)

    def interval(self) -> str:
        """``1.148x [0.447, 2.948] over 3 paired runs`` (no interval: ``over 1 paired run``)."""
        shown = "" if self.low is None or self.high is None else f" [{self.low:.3f}, {self.high:.3f}]"
        return f"{self.ratio or 0.0:.3f}x{shown} over {len(self.pairs)} paired run(s)"


@dataclass
class SpeedReport:
    metric: str
    picks: list[SpeedPick]
    baseline_values: dict[int, float]  # seed -> the user's config's value
    tolerance: float
    pending: int
    noise: dict[str, float] | None = None  # the control's relative first-step differences (None: no control ran)
    baseline_out_of_range: int = 0  # runs of the user's config whose stored value is not a measurement (skipped)
    control_replayed: bool = False  # the control replayed the user's run's recorded first rollout

    @property
    def recommended(self) -> SpeedPick | None:
        """The fastest pick that computes the same update and is separated faster than the user's config (its
        interval above 1); None: keep the user's config."""
        ok = [p for p in self.picks if p.same_math and p.separated and (p.low or 0.0) > 1.0]
        return max(ok, key=lambda p: p.ratio or 0.0) if ok else None

    @property
    def leader(self) -> SpeedPick | None:
        """The fastest pick with a paired run that is not known to change the math (the one re-measuring decides on);
        None when there is none."""
        ok = [p for p in self.picks if p.same_math is not False and p.ratio is not None]
        return max(ok, key=lambda p: p.ratio or 0.0) if ok else None

    @property
    def none_faster(self) -> bool:
        """Measured, nothing pending, and no pick of the same math is separated faster (the leader is not separated,
        or slower): no setting faster than the user's was found on this host."""
        lead = self.leader
        return self.recommended is None and not self.pending and lead is not None and bool(lead.same_math)


def unresolved(report: SpeedReport) -> str | None:
    """Why ``confirm`` re-measures on one more seed: the leader (:attr:`SpeedReport.leader`) is not separated from the
    user's config yet (its interval includes 1, or it has none); None when it is, or there is no leader."""
    lead = report.leader
    if lead is None or lead.separated:
        return None
    return f"trial {lead.trial.number} {lead.interval()} is not separated from your config"


def _latest_runs(study: optuna.Study) -> tuple[dict[tuple[int, int], FrozenTrial], int]:
    """(confirmed trial or BASELINE_OF, seed) -> its finished run (the newest), and how many are still to run."""
    runs: dict[tuple[int, int], FrozenTrial] = {}
    pending = 0
    for t in study.get_trials(deepcopy=False):
        if not is_confirm(t):
            continue
        if t.state in (TrialState.WAITING, TrialState.RUNNING):
            pending += 1
        if t.state != TrialState.COMPLETE:
            continue
        try:  # BASELINE_OF, CONTROL_OF or the pick's trial number; the seed
            of, seed = int(t.system_attrs[ATTR_CONFIRM_OF]), int(t.system_attrs[ATTR_CONFIRM_SEED])
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        runs[(of, seed)] = t
    return runs, pending


def _measured(t: FrozenTrial) -> tuple[float | None, bool]:
    """A run's throughput, or (None, out of range): a failed run (``fail_reason``, or no value) is not out of
    range; a stored value outside the bounds of a measurement (0, negative, 5e-324, 1e308, inf) is."""
    v = t.values[0] if t.values else None
    if v is not None and speed_value_ok(v):
        return float(v), False
    return None, v is not None and "fail_reason" not in t.user_attrs


def _value(t: FrozenTrial) -> float | None:
    return _measured(t)[0]


NONE_FASTER = "no setting faster than yours was found on this host"


def _log_ratio(a: float, b: float, faster_is_higher: bool) -> float | None:
    """log(a / b) in the faster direction; None when either value is not a measurement (a ratio that would
    underflow to 0 or overflow to inf)."""
    if not (speed_value_ok(a) and speed_value_ok(b)):
        return None
    return math.log(a) - math.log(b) if faster_is_higher else math.log(b) - math.log(a)


def _exp(x: float) -> float:
    return math.exp(x) if x < 700.0 else math.inf


def _ratio(pairs: list[tuple[int, float, float]], faster_is_higher: bool
           ) -> tuple[float | None, float | None, float | None]:
    """Geometric mean of the paired ratios (in the faster direction) and its t interval over the log ratios; a pair
    with a value out of range is skipped (None: no pair left)."""
    logs = [lr for _, a, b in pairs if (lr := _log_ratio(a, b, faster_is_higher)) is not None]
    if not logs:
        return None, None, None
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return _exp(mean), None, None
    half = t_quantile(0.5 + LEVEL / 2.0, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return _exp(mean), _exp(mean - half), _exp(mean + half)


def speed_report(study: optuna.Study, space: Space) -> SpeedReport | None:
    """The re-measured picks (None before any run of the user's config finished)."""
    runs, pending = _latest_runs(study)
    base = {seed: t for (of, seed), t in runs.items() if of == BASELINE_OF}
    if not base:
        return None
    metric = space.objective.objectives[0].metric if space.objective.multi else space.objective.metric
    higher = space.objective.directions[0] == "maximize"  # a throughput (faster: higher) or a step time
    tol = space.study.throughput.tolerance
    control = next(((seed, t) for (of, seed), t in runs.items() if of == CONTROL_OF and seed in base), None)
    rel_noise: dict[str, float] = {}
    replayed = control is not None and strict_pair(control[1], base[control[0]])
    if control is not None:
        first_b, first_c = first_step(base[control[0]]), first_step(control[1])
        if first_b is not None and first_c is not None:
            rel_noise = run_noise(first_b, first_c)
    numbers = sorted({of for of, _ in runs if of not in (BASELINE_OF, CONTROL_OF)})
    by_number = {t.number: t for t in study.get_trials(deepcopy=False) if t.number in numbers}
    picks = [_pick(by_number[n], runs, base, higher, tol, rel_noise) for n in numbers if n in by_number]
    picks.sort(key=lambda p: -(p.ratio or 0.0))
    return SpeedReport(metric, picks, {s: v for s, t in base.items() if (v := _value(t)) is not None}, tol, pending,
                       None if control is None else rel_noise, sum(_measured(t)[1] for t in base.values()), replayed)


def _pick(trial: FrozenTrial, runs: dict[tuple[int, int], FrozenTrial], base: dict[int, FrozenTrial], higher: bool,
          tol: float, rel_noise: dict[str, float]) -> SpeedPick:
    """One pick's paired runs against the user's config's on the same seeds, and its same-math check."""
    v = trial.values[0] if trial.values else math.nan
    pick = SpeedPick(trial, float(v))
    for (of, seed), run in sorted(runs.items()):
        if of != trial.number or seed not in base:
            continue
        (a, a_bad), b = _measured(run), _value(base[seed])
        pick.out_of_range += a_bad
        pick.failed += a is None and not a_bad
        if a is not None and b is not None:
            pick.pairs.append((seed, a, b))
        first_a, first_b = first_step(run), first_step(base[seed])
        if first_a is not None and first_b is not None:
            pick.compared += 1
            replayed = strict_pair(run, base[seed])
            pick.replayed += replayed
            pick.disagreements += [f"seed {seed}: {d}" for d in math_disagreements(first_a, first_b, tol, rel_noise,
                                                                                   replayed)]
    if pick.pairs:
        pick.ratio, pick.low, pick.high = _ratio(pick.pairs, higher)
    return pick


def _skipped(n: int) -> str:
    return f"; {n} run(s) out of range (not a valid measurement), skipped" if n else ""


def _pick_line(p: SpeedPick, names: list[str]) -> str:
    """One pick: its settings, its speed-up with the interval, and the same-math check."""
    setting = " ".join(f"{n}={p.trial.params.get(n)}" for n in names)
    if p.ratio is None:
        speed = ("no paired run yet" if not p.failed and not p.out_of_range else
                 "no valid paired run" if not p.failed else f"{p.failed} run(s) failed (no value)")
    else:
        interval = "" if p.low is None else f" [{p.low:.3f}, {p.high:.3f}] (95%, {len(p.pairs)} paired runs)"
        speed = f"{p.ratio:.3f}x your config's speed{interval}"
    same = {True: "same math: agrees", False: "same math: DIFFERS (" + "; ".join(p.disagreements[:3]) + ")",
            None: "same math: not checked (no first step logged by both)"}[p.same_math]
    if p.compared:
        same += f" (strict on {p.replayed} of {p.compared} seed(s): one recorded first rollout replayed)" \
            if p.replayed else ""
    return f"trial {p.trial.number} ({setting}): {speed}{_skipped(p.out_of_range)}; {same}"


def _control_line(report: SpeedReport) -> str:
    """What the control (the user's config twice on one seed) says about the same-math check's strictness."""
    noise = report.noise or {}
    moved = {m: r for m, r in sorted(noise.items()) if r > 1e-9}
    worst = max(noise.values(), default=0.0)
    if report.control_replayed:
        return ("control (your config twice on one seed, the second replaying the first's recorded first rollout): "
                f"its first step differs by at most {worst:.2g} (relative); the same-math check is strict where both "
                f"runs of a seed updated on one recorded rollout: each metric within {report.tolerance:g} of its value")
    if not moved:
        return ("control (your config twice on one seed): the first step reproduces exactly; the same-math check "
                f"is strict (each metric within {report.tolerance:g} of its value)")
    skipped = [m for m, r in moved.items() if r > UNCOMPARABLE]
    return ("control (your config twice on one seed): the first step differs between runs ("
            + ", ".join(f"{m} by {100 * r:.2g}%" for m, r in list(moved.items())[:5])
            + f"), so the same-math check is loose: each metric within max({NOISE_FACTOR:g}x that, "
            f"{100 * LOOSE_FLOOR:.0f}%) of its value" + (f", {', '.join(skipped)} not compared" if skipped else "")
            + " (it catches a change of scale)")


def speed_lines(report: SpeedReport, space: Space) -> list[str]:
    """The report as lines: one per pick, then the recommendation."""
    names = [p.name for p in space.params]
    base = list(report.baseline_values.values())
    out = [(f"user's config: {report.metric} {statistics.fmean(base):.4g} over {len(base)} run(s)" if base else
            "user's config: no finished run with a finite value") + _skipped(report.baseline_out_of_range)]
    if report.noise is not None:
        out.append(_control_line(report))
    out += [_pick_line(p, names) for p in report.picks]
    left = f"; {report.pending} run(s) still to run" if report.pending else ""
    rec, lead = report.recommended, report.leader
    if rec is None and lead is not None and lead.same_math is not False and not lead.separated and report.pending:
        out.append(f"recommended: none yet (the fastest, trial {lead.trial.number} {lead.interval()}, is not "
                   f"separated from your config yet){left}")
    elif rec is None:
        why = ("no pick computes the same update as your config" if report.picks and not any(
            p.same_math for p in report.picks) else "no pick has a valid paired run yet" if lead is None else
            f"{NONE_FASTER}: the fastest, trial {lead.trial.number}, is slower ({lead.interval()})"
            if lead.separated else
            f"{NONE_FASTER}: the fastest, trial {lead.trial.number} {lead.interval()}, is not separated from your "
            f"config (re-measured on up to study.throughput.max_repeats = "
            f"{repeat_cap(space.study.throughput, len(lead.pairs))} seeds)")
        mine = "; verl-hpo best --format overrides prints your own settings" if report.none_faster else ""
        out.append(f"recommended: keep your config ({why}){mine}{left}")
    else:
        out.append(f"recommended: trial {rec.trial.number}, {rec.interval()} (its interval excludes 1); verl-hpo "
                   f"best --format overrides prints its settings{left}")
    return out


def confirmation_gaps(report: SpeedReport, pick: SpeedPick, required: int, pending_ok: bool = False) -> list[str]:
    """What the confirmation of the recommended ``pick`` lacks before a learning study may take its settings: its
    ``required`` paired runs (``study.throughput.repeats``, at least 2: an interval), an interval that excludes 1, a
    same-math check at each paired seed, and (unless ``pending_ok``) no run still to run; [] when complete."""
    n, gaps = pick.trial.number, []
    if len(pick.pairs) < required:
        gaps.append(f"trial {n} has {len(pick.pairs)} of {required} paired run(s)")
    if pick.low is None or pick.high is None:
        gaps.append("no interval")
    elif pick.low <= 1.0:
        gaps.append(f"its interval [{pick.low:.3f}, {pick.high:.3f}] includes 1 (not separated from your config)")
    if pick.compared < len(pick.pairs):
        gaps.append(f"{len(pick.pairs) - pick.compared} paired run(s) with no first step to compare")
    if report.pending and not pending_ok:
        gaps.append(f"{report.pending} run(s) still to run")
    return gaps


def speed_settings(study: optuna.Study, space: Space, pending_ok: bool = False
                   ) -> tuple[dict[str, Any], SpeedPick]:
    """The recommended pick's speed settings {trainer key: value} (what ``study.speed_from`` runs with); ValueError
    (one line) when the study is not a throughput study whose complete confirmation (:func:`confirmation_gaps`)
    recommends a pick."""
    name = study.study_name
    if space.study.kind != "throughput":
        raise ValueError(f"study {name!r} is not a throughput study (study.kind: {space.study.kind})")
    report = speed_report(study, space)
    if report is None:
        raise ValueError(f"throughput study {name!r} is not re-measured yet: run verl-hpo confirm --study {name} "
                         "first")
    rec, lead, required = report.recommended, report.leader, max(2, space.study.throughput.repeats)
    if rec is None and lead is not None and lead.same_math is not False and not lead.separated and (
            report.pending and not pending_ok or len(lead.pairs) < required):
        rec = lead  # not decided yet: what its confirmation lacks (below)
    if rec is None:
        lines = speed_lines(report, space)
        top = next((line for line in lines if line.startswith(f"trial {report.picks[0].trial.number} (")), None) \
            if report.picks else None
        raise ValueError(f"throughput study {name!r} recommends keeping the user's config "
                         + lines[-1].removeprefix("recommended: keep your config ") + (f"; {top}" if top else ""))
    gaps = confirmation_gaps(report, rec, required, pending_ok)
    if gaps:
        more = "" if report.pending else f" --seeds {max(required, len(rec.pairs)) + 1}"
        raise ValueError(f"throughput study {name!r}: its confirmation is not complete ({', '.join(gaps)}): "
                         f"verl-hpo confirm --study {name}{more} goes on with it")
    return {p.key: rec.trial.params[p.name] for p in space.params if p.name in rec.trial.params}, rec


def render_yours(space: Space, fmt: str) -> str:
    """The user's own settings (``study.baseline``), as ``best`` prints a pick's when no setting faster than them was
    found: ``overrides``, one shell-ready line of their ``key=value`` (empty when the baseline sets none: the fixed
    overrides as they are); ``yaml``, a nested fragment; ``command``, the trainer command with them."""
    import shlex
    from pathlib import Path

    import yaml

    from hpo.backends import Attempt, backend_of
    from hpo.experiment import format_value
    from hpo.reporting._command_line import command_for
    from hpo.reporting._report import nest

    yours = dict(space.study.baseline)
    if fmt == "yaml":
        return yaml.safe_dump(nest({k.lstrip("+"): v for k, v in yours.items()}), sort_keys=False).rstrip()
    if fmt == "command":
        try:
            overrides = backend_of(space).configure(Attempt(space=space, trial_dir=Path("."), extra=yours)).overrides
        except (OSError, ValueError):  # the trainer's config is gone from here: the experiment's own overrides
            overrides = [f"{k}={format_value(v)}" for k, v in {**space.fixed_overrides(), **yours}.items()]
        return command_for(space, overrides)
    return shlex.join(f"{k}={format_value(v)}" for k, v in yours.items())
