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
* the same-math check: at each seed, the first training step's ``math_metrics`` (losses, gradient norm, score) of the
  pick's run and of the user's config's run must agree within ``tolerance x max(1, |value|)``, and a metric logged by
  one run only disagrees. A pick that disagrees anywhere is reported with the metric and both values, and is not
  recommended.

The recommendation is the fastest pick that passes the same-math check and is faster than the user's config (ratio >
1); ``best --format overrides`` prints its speed settings and a learning study takes them with ``study.speed_from``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment._space import Space
from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, is_confirm
from hpo.study._compare import LEVEL, t_quantile
from hpo.study._confirm import BASELINE_OF, CONTROL_OF


@dataclass
class SpeedPick:
    """One pick against the user's config."""

    trial: FrozenTrial
    search_value: float
    pairs: list[tuple[int, float, float]] = field(default_factory=list)  # (seed, pick's value, user's value)
    failed: int = 0  # runs of the pick that ended without a finite value (an OOM, a crash)
    ratio: float | None = None  # > 1: faster than the user's config
    low: float | None = None
    high: float | None = None
    disagreements: list[str] = field(default_factory=list)  # the same-math check's findings
    compared: int = 0  # seeds whose first steps were compared

    @property
    def same_math(self) -> bool | None:
        """True: every compared first step agrees; False: one does not; None: nothing compared yet."""
        if self.disagreements:
            return False
        return True if self.compared else None


@dataclass
class SpeedReport:
    metric: str
    picks: list[SpeedPick]
    baseline_values: dict[int, float]  # seed -> the user's config's value
    tolerance: float
    pending: int
    noise: dict[str, float] | None = None  # the control's relative first-step differences (None: no control ran)

    @property
    def recommended(self) -> SpeedPick | None:
        ok = [p for p in self.picks if p.same_math and p.ratio is not None and p.ratio > 1.0]
        return max(ok, key=lambda p: p.ratio or 0.0) if ok else None


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
        try:
            of = int(t.system_attrs[ATTR_CONFIRM_OF])  # BASELINE_OF, CONTROL_OF or the pick's trial number
        except (TypeError, ValueError):
            continue
        runs[(of, int(t.system_attrs[ATTR_CONFIRM_SEED]))] = t
    return runs, pending


def _value(t: FrozenTrial) -> float | None:
    v = t.values[0] if t.values else None
    return float(v) if v is not None and math.isfinite(v) and v > 0 else None


NOISE_FACTOR = 3.0  # a metric may differ by this many times what two runs of the user's config on one seed differ by
LOOSE_FLOOR = 0.5  # ... and at least by this share of its value when the trainer's first step does not reproduce
UNCOMPARABLE = 0.5  # a metric that moved more than this share between the user's two runs is not compared


def math_disagreements(pick: dict[str, Any], base: dict[str, Any], tolerance: float,
                       noise: dict[str, float] | None = None) -> list[str]:
    """The first-step metrics (``first_step`` user attrs) that differ beyond what is allowed, or that only one run
    logged (``step``: where each was taken). ``noise``: per metric, how far two runs of the user's config on one seed
    differ relative to its value (:func:`run_noise`; None or all 0: the trainer reproduces its first step, and each
    metric must agree within ``tolerance x max(1, |base|)``). Where the first step does not reproduce (an
    asynchronous rollout samples differently run to run), a metric may also differ by ``max(NOISE_FACTOR x noise,
    LOOSE_FLOOR)`` of its value, and one that moved by more than :data:`UNCOMPARABLE` between the user's own two runs
    (a loss near 0) is not compared: the check then catches a change of the update's scale or form (a loss
    aggregation switch moves the gradient norm several-fold), not a small one."""
    noise = noise or {}
    loose = any(r > 1e-9 for r in noise.values())
    out = []
    for m in sorted((set(pick) | set(base)) - {"step"}):
        a, b = pick.get(m), base.get(m)
        if a is None or b is None:
            out.append(f"{m} logged by {'the pick' if b is None else 'your config'} only")
            continue
        if loose and noise.get(m, 0.0) > UNCOMPARABLE:
            continue
        extra = max(NOISE_FACTOR * noise.get(m, 0.0), LOOSE_FLOOR) * abs(float(b)) if loose else 0.0
        if not abs(float(a) - float(b)) <= tolerance * max(1.0, abs(float(b))) + extra:
            out.append(f"{m} {float(a):.6g} vs {float(b):.6g}")
    if pick.get("step") != base.get("step") and "step" in pick and "step" in base:
        out.append(f"first step {pick['step']} vs {base['step']}")
    return out


def run_noise(base: dict[str, Any], control: dict[str, Any]) -> dict[str, float]:
    """Per metric, how far the user's config's two runs on one seed differ at the first step, relative to the first
    run's value (``|a - b| / max(1e-12, |a|)``): 0 everywhere where the trainer reproduces its first step."""
    return {m: abs(float(control[m]) - float(base[m])) / max(1e-12, abs(float(base[m])))
            for m in set(base) & set(control) - {"step"}}


def _ratio(pairs: list[tuple[int, float, float]], faster_is_higher: bool) -> tuple[float, float | None, float | None]:
    """Geometric mean of the paired ratios (in the faster direction) and its t interval over the log ratios."""
    logs = [math.log(a / b) if faster_is_higher else math.log(b / a) for _, a, b in pairs]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    half = t_quantile(0.5 + LEVEL / 2.0, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


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
    if control is not None:
        first_b, first_c = base[control[0]].user_attrs.get("first_step"), control[1].user_attrs.get("first_step")
        if isinstance(first_b, dict) and isinstance(first_c, dict):
            rel_noise = run_noise(first_b, first_c)
    numbers = sorted({of for of, _ in runs if of not in (BASELINE_OF, CONTROL_OF)})
    by_number = {t.number: t for t in study.get_trials(deepcopy=False) if t.number in numbers}
    picks = []
    for n in numbers:
        trial = by_number[n]
        pick = SpeedPick(trial, float(trial.values[0]) if trial.values else math.nan)
        for (of, seed), run in sorted(runs.items()):
            if of != n or seed not in base:
                continue
            a, b = _value(run), _value(base[seed])
            if a is None:
                pick.failed += 1
            if a is not None and b is not None:
                pick.pairs.append((seed, a, b))
            first_a, first_b = run.user_attrs.get("first_step"), base[seed].user_attrs.get("first_step")
            if isinstance(first_a, dict) and isinstance(first_b, dict):
                pick.compared += 1
                pick.disagreements += [f"seed {seed}: {d}"
                                       for d in math_disagreements(first_a, first_b, tol, rel_noise)]
        if pick.pairs:
            pick.ratio, pick.low, pick.high = _ratio(pick.pairs, higher)
        picks.append(pick)
    picks.sort(key=lambda p: -(p.ratio or 0.0))
    return SpeedReport(metric, picks, {s: v for s, t in base.items() if (v := _value(t)) is not None}, tol, pending,
                       None if control is None else rel_noise)


def speed_lines(report: SpeedReport, space: Space) -> list[str]:
    """The report as lines: one per pick, then the recommendation."""
    names = [p.name for p in space.params]
    base = list(report.baseline_values.values())
    out = [f"user's config: {report.metric} {statistics.fmean(base):.4g} over {len(base)} run(s)" if base else
           "user's config: no finished run with a finite value"]
    if report.noise is not None:
        moved = {m: r for m, r in sorted(report.noise.items()) if r > 1e-9}
        skipped = [m for m, r in moved.items() if r > UNCOMPARABLE]
        out.append("control (your config twice on one seed): the first step reproduces exactly; the same-math check "
                   f"is strict (within {report.tolerance:g})" if not moved else
                   "control (your config twice on one seed): the first step differs between runs ("
                   + ", ".join(f"{m} by {100 * r:.2g}%" for m, r in list(moved.items())[:5])
                   + f"), so the same-math check is loose: each metric within max({NOISE_FACTOR:g}x that, "
                   f"{100 * LOOSE_FLOOR:.0f}%) of its value" + (f", {', '.join(skipped)} not compared" if skipped
                                                                else "") + " (it catches a change of scale)")
    for p in report.picks:
        setting = " ".join(f"{n}={p.trial.params.get(n)}" for n in names)
        if p.ratio is None:
            speed = "no paired run yet" if not p.failed else f"{p.failed} run(s) failed (no value)"
        else:
            interval = "" if p.low is None else f" [{p.low:.3f}, {p.high:.3f}] (95%, {len(p.pairs)} paired runs)"
            speed = f"{p.ratio:.3f}x your config's speed{interval}"
        same = {True: "same math: agrees", False: "same math: DIFFERS (" + "; ".join(p.disagreements[:3]) + ")",
                None: "same math: not checked (no first step logged by both)"}[p.same_math]
        out.append(f"trial {p.trial.number} ({setting}): {speed}; {same}")
    rec = report.recommended
    if rec is None:
        why = ("no pick computes the same update as your config" if report.picks and not any(
            p.same_math for p in report.picks) else "no pick is faster than your config")
        out.append(f"recommended: keep your config ({why})" + (f"; {report.pending} run(s) still to run"
                                                               if report.pending else ""))
    else:
        sure = " (its interval excludes 1)" if rec.low is not None and rec.low > 1.0 else \
            " (its interval includes 1: not separated from your config)"
        out.append(f"recommended: trial {rec.trial.number}, {rec.ratio:.3f}x{sure}; verl-hpo best --format overrides "
                   "prints its settings")
    return out


def speed_settings(study: optuna.Study, space: Space) -> tuple[dict[str, Any], SpeedPick]:
    """The recommended pick's speed settings {trainer key: value} (what ``study.speed_from`` runs with); ValueError
    (one line) when the study is not a re-measured throughput study with a recommendation."""
    if space.study.kind != "throughput":
        raise ValueError(f"study {study.study_name!r} is not a throughput study (study.kind: {space.study.kind})")
    report = speed_report(study, space)
    if report is None:
        raise ValueError(f"throughput study {study.study_name!r} is not re-measured yet: run verl-hpo confirm --study "
                         f"{study.study_name} first")
    rec = report.recommended
    if rec is None:
        raise ValueError(f"throughput study {study.study_name!r} recommends keeping the user's config: "
                         + speed_lines(report, space)[-1].removeprefix("recommended: keep your config "))
    return {p.key: rec.trial.params[p.name] for p in space.params if p.name in rec.trial.params}, rec


def speed_from(space: Space, storage_url: str) -> tuple[list[str], dict[str, Any]]:
    """``study.speed_from``: the trainer overrides (``key=value`` texts) of the named throughput study's
    recommendation, for a learning study's every trial, and what to report of it; SpaceError (one line) when the
    study cannot give one or a setting clashes with a key this study tunes."""
    from hpo.experiment._space import SpaceError, format_value
    from hpo.study._optuna import load_stored

    name = space.study.speed_from
    assert name is not None
    where = f"{space.source}: study.speed_from: {name!r}"
    try:
        speed_space, speed_study = load_stored(name, storage_url, None)
        settings, pick = speed_settings(speed_study, speed_space)
    except (SpaceError, ValueError) as err:
        raise SpaceError(f"{where}: {err}") from None
    if speed_space.trial.backend != space.trial.backend:
        raise SpaceError(f"{where}: its trials ran trial.backend {speed_space.trial.backend}, this study's run "
                         f"{space.trial.backend}")
    tuned = {p.key.lstrip("+"): p.name for p in space.params}
    for key in settings:
        if key.lstrip("+") in tuned:
            raise SpaceError(f"{where}: it sets {key}, which this study tunes (params.{tuned[key.lstrip('+')]}); a "
                             "speed setting is fixed for every learning trial")
    replaced = {k: space.overrides[k] for k in settings if k in space.overrides and space.overrides[k] != settings[k]}
    info = {"study": name, "trial": pick.trial.number, "ratio": pick.ratio, "low": pick.low, "high": pick.high,
            "settings": {k: format_value(v) for k, v in settings.items()},
            "replaced": {k: format_value(v) for k, v in replaced.items()}}
    return [f"{k}={format_value(v)}" for k, v in settings.items()], info


def speed_from_note(info: dict[str, Any]) -> str:
    """One line for the search's start: which settings, from where, and what they save per trial."""
    ratio, low, high = info["ratio"], info.get("low"), info.get("high")
    interval = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
    settings = " ".join(f"{k}={v}" for k, v in info["settings"].items())
    replaced = "; replacing " + ", ".join(f"{k}={v}" for k, v in info["replaced"].items()) if info["replaced"] else ""
    return (f"speed settings from throughput study {info['study']} (trial {info['trial']}, same math as your config, "
            f"{ratio:.3f}x{interval} its throughput): {settings}{replaced}; each learning trial's training steps take "
            f"~{100 * (1 - 1 / ratio):.0f}% less time")
