"""Promotion of the proxy's best settings to the target, and the check that decides whether the proxy is trusted
(``study.fidelity.proxy``; the driver calls these, :mod:`hpo.study._driver`).

* :func:`start_promotion`: once the proxy search has its ``n_trials``, its ``promote`` best distinct settings
  (:func:`proxy_ranking`) are kept in the study (:data:`~hpo.record.ATTR_PROMOTION`, set once: every driver and a
  resume promote the same ones) and each gets one WAITING target run (system attrs ``hpo:fidelity=target``,
  ``hpo:promoted_from``, ``hpo:promote_steps``), queued only when none is queued, running or finished; two drivers
  queueing one at once run it once (:func:`promotion_twin`: the later is surplus), as confirmation runs are.
  A promoted run stops at ``promote_steps`` (the first successive-halving rung, else a quarter of a trial's steps;
  :func:`promote_steps`) and its value is a target value.
* :func:`record_check`: when every promoted run has finished, the proxy's ranking of them is compared with the
  target's **at the same step** (:func:`agreement`): each promoted setting's proxy value at ``promote_steps`` (its
  proxy trial's last evaluation at or before it) against its target run's value there. Both then measure the same
  thing: how far the setting has learned by that step. (A proxy trial's final value against a short target run
  would ask the target's learning speed to rank like the proxy's end point: on the tiny_arith family the settings the
  proxy ranks best at 60 steps are often its slow starters, behind at 10 steps on both models, and such a check
  threw away the target's best setting; benchmarks/RESULTS.md, "model-size fidelity".) The figures: Kendall's tau-b
  with a 95% bootstrap interval (2,000 resamples of the settings, seed 0, so every driver computes the same) and the
  exact one-sided permutation p-value, and the gap between the target value of the setting the proxy ranks first at
  that step and the target's best there, against the race's resolution (``study.confirm.resolution``, else
  ``early_stopping.plateau_min_delta``, else 1% of the best). The proxy *holds* when that gap is within the
  resolution and tau > 0, or when the gap is and either model's values at that step are all within the resolution
  of each other (nothing to rank there: e.g. two promoted settings the proxy had at the same value); the gap is taken
  to the best target value of the settings the proxy had within the resolution of its first there (it makes no claim
  among them). When the check holds but the proxy had the target's best at that step within the resolution of its
  pick (its full-length first) while the target had it more than the resolution ahead, the proxy's preference for its
  pick is not measured: the check keeps that setting as ``unseen`` and the race takes both (build C of the tiny_arith
  family, study seed 2: the proxy had the two at 0.480 / 0.484, the target at 0.187 / 0.478, and at 60 steps the
  proxy's pick, a slow starter, was 0.047 behind on the target). The
  figures and the decision are kept in the study's user attr :data:`~hpo.record.ATTR_FIDELITY_CHECK`, the first
  driver to finish them writes them, and :func:`check_line` says them in one line. Which settings the race then runs
  is the proxy's full-length ranking's to say (:func:`hpo.study._continuation.proxy_field`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Callable, Container, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Param, Space
from hpo.record import (
    ATTR_FIDELITY,
    ATTR_FIDELITY_CHECK,
    ATTR_PROMOTE_STEPS,
    ATTR_PROMOTED_FROM,
    ATTR_PROMOTION,
    ATTR_PROXY_TIES,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
    ATTR_TRANSFER,
    PROXY,
    TARGET,
    full_steps,
    is_confirm,
    is_failed,
    is_finished,
    is_promoted,
    is_proxy,
    is_tie_run,
)

BOOTSTRAP = 2000
MAX_EXACT = 8  # the permutation p-value is exact up to this many settings (8! = 40,320 orderings)


def _sign(study: optuna.Study) -> float:
    return 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0


def _finite(t: FrozenTrial) -> bool:
    return t.values is not None and all(math.isfinite(v) for v in t.values) and all(
        v <= 0 for v in t.constraints.values())


def _value_at(t: FrozenTrial, step: int) -> float | None:
    """``t``'s reported value at its last evaluation at or before ``step`` (None: it reported none by then)."""
    steps = [s for s in t.intermediate_values if s <= step]
    return float(t.intermediate_values[max(steps)]) if steps else None


def tie_runs(trials: Sequence[FrozenTrial], of: int, seeds: Container[int] | None = None) -> list[FrozenTrial]:
    """The finished tie runs of proxy trial ``of`` (on ``seeds`` only, when given; a retried one's finished attempt;
    the runs queued, running or failed with a retry due are not evidence yet)."""
    return [t for t in trials if is_tie_run(t) and t.system_attrs.get(ATTR_TIE_OF) == of and is_finished(t)
            and (seeds is None or t.system_attrs.get(ATTR_TIE_SEED) in seeds)]


def proxy_value(t: FrozenTrial, trials: Sequence[FrozenTrial], sign: float,
                seeds: Container[int] | None = None) -> float:
    """A completed proxy trial's value as the promotion ranks it: its own, or with tie runs (``tie_seeds``) the mean
    over its seeds (those of ``seeds`` only, when given), a failed or non-finite tie run counting as the worst (the
    setting breaks under some seed)."""
    values = [float(r.values[0]) if r.values and not is_failed(r) else math.nan
              for r in (t, *tie_runs(trials, t.number, seeds))]
    if not all(math.isfinite(v) for v in values):
        return -sign * math.inf
    return math.fsum(values) / len(values)


def proxy_ranking(trials: Sequence[FrozenTrial], sign: float) -> list[FrozenTrial]:
    """The proxy's distinct settings, best first: completed trials by value (a plateau stop at step 40 is as complete
    as step 60), pruned ones by the steps they reached (a later rung first) and their value there, each pruned trial
    placed before the first completed one it beat both where both were measured and at the end (the completed
    trial's value at the pruned one's rung and its final value are lower: a trial that passed its rungs alone, or
    collapsed after them, is not better than one pruned at 0.93 for lack of room at a rung; a slow starter that
    was behind at the rung and ended above the pruned trial's value stays ahead of it). A completed trial with tie
    runs ranks by its mean over its seeds (:func:`proxy_value`)."""
    done = [t for t in trials if is_proxy(t) and not is_confirm(t) and not is_tie_run(t) and _finite(t)
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    value = {t.number: proxy_value(t, trials, sign) if t.state == TrialState.COMPLETE else float(t.values[0])
             for t in done}

    def steps(t: FrozenTrial) -> int:
        last = t.user_attrs.get("last_step")
        return last if isinstance(last, int) and not isinstance(last, bool) else max(t.intermediate_values, default=0)

    order = sorted((t for t in done if t.state == TrialState.COMPLETE), key=lambda t: (-sign * value[t.number],
                                                                                       t.number))
    floor = 0  # pruned trials keep their own order: each goes after the one placed before it
    for p in sorted((t for t in done if t.state == TrialState.PRUNED),
                    key=lambda t: (-steps(t), -sign * float(t.values[0]), t.number)):
        rung, v_p = steps(p), sign * float(p.values[0])
        at = next((i for i in range(floor, len(order)) if order[i].state == TrialState.COMPLETE
                   and (v := _value_at(order[i], rung)) is not None and sign * v < v_p
                   and sign * value[order[i].number] < v_p), len(order))
        order.insert(at, p)
        floor = at + 1
    out: list[FrozenTrial] = []
    for t in order:
        if all(t.params != o.params for o in out):
            out.append(t)
    return out


def promote_steps(space: Space, trials: Sequence[FrozenTrial]) -> int:
    """A promoted run's steps: ``promote_steps``, else the first successive-halving rung (``min_resource``), else a
    quarter of a trial's steps (at least 1)."""
    proxy = space.study.fidelity.proxy
    assert proxy is not None
    if proxy.promote_steps is not None:
        return proxy.promote_steps
    if space.study.pruner.type == "successive_halving":
        return max(1, space.study.pruner.min_resource)
    full = full_steps(trials) or 4
    return max(1, full // 4)


def promoted_runs(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if is_promoted(t)]


def start_promotion(study: optuna.Study, space: Space) -> list[int]:
    """Keep the promoted settings in the study (once) and queue the target run of each that has none yet (in any
    state: a run that failed for good is not queued again; an interrupted one's retry is queued by recovery); the
    proxy trials whose run was queued here."""
    proxy = space.study.fidelity.proxy
    assert proxy is not None
    trials = study.get_trials(deepcopy=False)
    kept = study._storage.get_study_system_attrs(study._study_id).get(ATTR_PROMOTION)
    if not isinstance(kept, dict):
        ranked = proxy_ranking(trials, _sign(study))[:proxy.promote]
        kept = {"candidates": [t.number for t in ranked], "steps": promote_steps(space, trials)}
        study._storage.set_study_system_attr(study._study_id, ATTR_PROMOTION, kept)
    by_number = {t.number: t for t in trials}
    present = {t.system_attrs.get(ATTR_PROMOTED_FROM) for t in promoted_runs(trials)}  # any state: queued once
    queued = []
    for n in kept.get("candidates", []):
        source = by_number.get(n)
        if source is None or n in present:
            continue
        study.add_trial(optuna.create_trial(
            state=TrialState.WAITING, params=source.params, distributions=source.distributions,
            system_attrs={ATTR_FIDELITY: TARGET, ATTR_PROMOTED_FROM: n, ATTR_PROMOTE_STEPS: int(kept["steps"])}))
        queued.append(n)
    return queued


def promotion(study: optuna.Study) -> dict[str, Any] | None:
    """The promoted settings kept in the study (None before the promotion)."""
    kept = study._storage.get_study_system_attrs(study._study_id).get(ATTR_PROMOTION)
    return kept if isinstance(kept, dict) else None


def _promoted_key(t: FrozenTrial) -> Any:
    return t.system_attrs.get(ATTR_PROMOTED_FROM) if is_promoted(t) else None


def _tie_key(t: FrozenTrial) -> Any:
    return (t.system_attrs.get(ATTR_TIE_OF), t.system_attrs.get(ATTR_TIE_SEED)) if is_tie_run(t) else None


def _twin(study: optuna.Study, run: FrozenTrial, key: Callable[[FrozenTrial], Any]) -> int | None:
    """Another queued run with ``run``'s ``key`` (None: not such a run) that goes first (finished, or queued or
    running with a lower number): ``run`` is then surplus. None when ``run`` is the one to run (a retry replaces its
    failed original)."""
    mine = key(run)
    for t in study.get_trials(deepcopy=False):
        if t.number == run.number or mine is None or key(t) != mine:
            continue
        if is_finished(t) or (t.state in (TrialState.RUNNING, TrialState.WAITING) and t.number < run.number):
            return t.number
    return None


def _pending(runs: Sequence[FrozenTrial]) -> tuple[bool, bool]:
    """(one of ``runs`` is waiting, one is running)."""
    return (any(t.state == TrialState.WAITING for t in runs), any(t.state == TrialState.RUNNING for t in runs))


def promotion_twin(study: optuna.Study, run: FrozenTrial) -> int | None:
    """Another target run of the same promoted setting that goes first (:func:`_twin`)."""
    return _twin(study, run, _promoted_key)


def promotion_pending(trials: Sequence[FrozenTrial]) -> tuple[bool, bool]:
    """(a promoted run is waiting, a promoted run is running)."""
    return _pending(promoted_runs(trials))


# ----------------------------------------------------------------------------- the proxy's ties
def tied_best(study: optuna.Study, space: Space, trials: Sequence[FrozenTrial]) -> list[int]:
    """The proxy's best settings it cannot tell apart: among the ``promote`` it ranks first, the completed trials whose
    value is within the race's resolution (:func:`resolution`) of the best completed one's, best first."""
    proxy = space.study.fidelity.proxy
    assert proxy is not None
    sign = _sign(study)
    ranked = [t for t in proxy_ranking(trials, sign)[:proxy.promote] if t.state == TrialState.COMPLETE]
    if not ranked:
        return []
    best = sign * float(ranked[0].values[0])
    res = resolution(space, float(ranked[0].values[0]))
    return [t.number for t in ranked if best - sign * float(t.values[0]) <= res + 1e-12]


def _ints(raw: Any) -> list[int]:
    """The ints of a stored list (storage is untrusted: anything else is dropped)."""
    return [v for v in raw if isinstance(v, int) and not isinstance(v, bool)] if isinstance(raw, list) else []


def _alive(trials: Sequence[FrozenTrial], settings: Sequence[int], seeds: Container[int], sign: float,
           res: float) -> list[int]:
    """The tied ``settings`` still within ``res`` of the best one's mean over the tuning seed and the tie runs on
    ``seeds`` (the rounds before the next one)."""
    by_number = {t.number: t for t in trials}
    means = {n: sign * proxy_value(by_number[n], trials, sign, seeds) for n in settings if n in by_number}
    if not means:
        return []
    best = max(means.values())
    return [n for n in settings if n in means and best - means[n] <= res + 1e-12]


def start_ties(study: optuna.Study, space: Space, seeds: Sequence[int]) -> list[tuple[int, int]]:
    """``study.fidelity.proxy.tie_seeds``: before the promotion, the proxy's best settings it cannot tell apart
    (:func:`tied_best`, two or more) run again on the proxy, one seed of ``seeds`` (the race's) per round, up to
    ``tie_seeds`` rounds: each round runs the settings still within the resolution of the best one's mean over the
    seeds so far (a setting more than the resolution behind drops out), and the rounds end when one is left. The
    promotion then ranks them by their mean over the proxy's seeds (:func:`proxy_value`). The tied settings and the
    seeds are kept in the study once (:data:`~hpo.record.ATTR_PROXY_TIES`: every driver and a resume run the same
    ones) and each round is decided from the finished runs alone, so every driver queues the same; each (setting,
    seed) gets one WAITING proxy run (system attrs ``hpo:fidelity=proxy``, ``hpo:tie_of``, ``hpo:tie_seed``), queued
    only when none is queued, running or finished, and a round's runs only once the round before has none waiting
    or running. The (setting, seed) pairs queued here."""
    proxy = space.study.fidelity.proxy
    assert proxy is not None
    trials = study.get_trials(deepcopy=False)
    kept = study._storage.get_study_system_attrs(study._study_id).get(ATTR_PROXY_TIES)
    if not isinstance(kept, dict):
        tied = tied_best(study, space, trials) if proxy.tie_seeds and seeds else []
        tied = tied if len(tied) >= 2 else []
        kept = {"settings": tied, "seeds": [int(s) for s in seeds[:proxy.tie_seeds]] if tied else []}
        study._storage.set_study_system_attr(study._study_id, ATTR_PROXY_TIES, kept)
    by_number = {t.number: t for t in trials}
    settings = [n for n in _ints(kept.get("settings")) if n in by_number and by_number[n].values]
    if len(settings) < 2:
        return []
    sign = _sign(study)
    res = resolution(space, float(by_number[settings[0]].values[0]))
    runs: dict[Any, list[FrozenTrial]] = {}
    for t in trials:
        if is_tie_run(t):
            runs.setdefault(_tie_key(t), []).append(t)
    queued: list[tuple[int, int]] = []
    round_seeds = _ints(kept.get("seeds"))
    for r, seed in enumerate(round_seeds):
        alive = _alive(trials, settings, set(round_seeds[:r]), sign, res)
        if len(alive) < 2:
            break
        for n in alive:
            if (n, seed) not in runs:
                source = by_number[n]
                study.add_trial(optuna.create_trial(
                    state=TrialState.WAITING, params=source.params, distributions=source.distributions,
                    system_attrs={ATTR_FIDELITY: PROXY, ATTR_TIE_OF: n, ATTR_TIE_SEED: seed}))
                queued.append((n, seed))
        if queued or any(t.state in (TrialState.WAITING, TrialState.RUNNING) for n in alive
                         for t in runs.get((n, seed), [])):
            break  # this round first
    return queued


def proxy_ties(study: optuna.Study) -> dict[str, list[int]] | None:
    """The tied settings and seeds kept in the study (None before they were decided)."""
    kept = study._storage.get_study_system_attrs(study._study_id).get(ATTR_PROXY_TIES)
    return {"settings": _ints(kept.get("settings")), "seeds": _ints(kept.get("seeds"))} \
        if isinstance(kept, dict) else None


def ties_pending(trials: Sequence[FrozenTrial]) -> tuple[bool, bool]:
    """(a tie run is waiting, a tie run is running)."""
    return _pending([t for t in trials if is_tie_run(t)])


def tie_twin(study: optuna.Study, run: FrozenTrial) -> int | None:
    """Another tie run of the same setting and seed that goes first (:func:`_twin`)."""
    return _twin(study, run, _tie_key)


def ties_line(study: optuna.Study, sign: float | None = None) -> str | None:
    """The proxy's tie, one line (None: no tie was run): the settings, their seeds and their means."""
    kept = proxy_ties(study)
    if not kept or not kept["settings"]:
        return None
    sign = _sign(study) if sign is None else sign
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    rows = [(proxy_value(t, trials, sign), n, 1 + len(tie_runs(trials, n))) for n in kept["settings"]
            if (t := by_number.get(n)) is not None and t.values]
    rows.sort(key=lambda r: (-sign * r[0], r[1]))
    return (f"proxy tie: {len(kept['settings'])} of the proxy's best settings were within the resolution of each "
            f"other on the tuning seed, so they ran again on the proxy, a round per seed of {kept['seeds']} while "
            "still tied: "
            + ", ".join(f"trial {n} {v:.4g} over {k} seed(s)" for v, n, k in rows)
            + " (the promotion ranks them by these means, best first)")


# ----------------------------------------------------------------------------- the check
def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two paired samples (None when either is constant)."""
    conc = disc = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif dx == dy:
            conc += 1
        else:
            disc += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / denom if denom else None


def tau_interval(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of tau over the settings (seeded: every driver gets the same)."""
    rng, n, taus = random.Random(0), len(x), []
    for _ in range(BOOTSTRAP):
        idx = [rng.randrange(n) for _ in range(n)]
        tau = kendall_tau([x[i] for i in idx], [y[i] for i in idx])
        if tau is not None:
            taus.append(tau)
    if len(taus) < BOOTSTRAP // 10:
        return None
    taus.sort()
    return taus[int(0.025 * (len(taus) - 1))], taus[int(math.ceil(0.975 * (len(taus) - 1)))]


def tau_p_value(x: Sequence[float], y: Sequence[float], tau: float) -> float | None:
    """P(tau >= the observed one) over every ordering of ``y`` (no association); None past :data:`MAX_EXACT`."""
    if len(x) > MAX_EXACT:
        return None
    taus = [kendall_tau(x, list(p)) for p in itertools.permutations(y)]
    return sum(1 for t in taus if t is not None and t >= tau - 1e-12) / len(taus)


def resolution(space: Space, best: float) -> float:
    """The race's resolution: ``study.confirm.resolution``, else ``plateau_min_delta``, else 1% of the best."""
    res = getattr(space.study.confirm, "resolution", None)
    if isinstance(res, (int, float)) and not isinstance(res, bool):
        return float(res)
    delta = space.early_stopping.plateau_min_delta
    return delta if delta > 0 else (0.01 * abs(best) or 1e-12)


def agreement(pairs: Sequence[tuple[int, int, float, float]], sign: float, space: Space) -> dict[str, Any]:
    """The check's figures from ``(proxy trial, target run, proxy value, target value)``, both values at the promotion
    step, in the proxy's full-length order (best first; see the module docstring). The proxy's first at that step is
    its highest value there, the earlier in its order on a tie."""
    n = len(pairs)
    if n < 2:
        return {"n": n, "holds": False, "why": f"{n} promoted setting(s) with a finite target value: nothing to rank"}
    x = [sign * p[2] for p in pairs]  # the proxy's values at the step, higher better
    y = [sign * p[3] for p in pairs]  # the target's values at the step, higher better
    best = max(range(n), key=lambda i: (y[i], -i))
    first = max(range(n), key=lambda i: (x[i], -i))
    res = resolution(space, pairs[best][3])
    # what the proxy claims at the step: its best there, and the settings within the resolution of it (it cannot tell
    # them apart); the gap is the target's best less the target's best of those
    gap = y[best] - max(y[i] for i in range(n) if x[first] - x[i] <= res + 1e-12)
    tau = kendall_tau(x, y)
    # either side within the resolution at that step: nothing to rank there, only the gap is asked
    flat = max(y) - min(y) <= res or max(x) - min(x) <= res
    holds = gap <= res and (flat or (tau is not None and tau > 0))
    out: dict[str, Any] = {
        "n": n, "tau": tau, "interval": tau_interval(x, y), "p_value": None if tau is None else tau_p_value(x, y, tau),
        "resolution": res, "gap": gap, "proxy_best": pairs[first][0], "target_best": pairs[best][0], "holds": holds,
        "pairs": [list(p) for p in pairs]}
    if holds and best != 0 and abs(x[best] - x[0]) <= res + 1e-12 and y[best] - y[0] > res:
        # the proxy's pick (its full-length first) and the target's best at the step: the proxy had them within the
        # resolution there, the target did not; the proxy's preference of its pick is not measured: the race takes both
        out["unseen"] = {"trial": pairs[best][0], "run": pairs[best][1], "of": pairs[0][0],
                         "proxy_gap": x[best] - x[0], "target_gap": y[best] - y[0]}
    side = ("" if not flat else "; the target has them within the resolution" if max(y) - min(y) <= res
            else "; it has them within the resolution there, so nothing to rank")
    out["why"] = ((f"its best is within the resolution of the target's best{side}" if flat else
                   "its best is within the resolution of the target's best and it ranks the rest alike") if holds
                  else f"its best is {gap:.4g} below the target's best, more than the resolution {res:.4g}" if gap > res
                  else "it ranks the promoted settings against the target's order")
    return out


def _unit(p: Param, value: Any) -> float | None:
    """``value`` of numeric parameter ``p`` on [0, 1] over its range (log scale for a log parameter)."""
    if p.type == "categorical" or p.low is None or p.high is None or not isinstance(value, (int, float)):
        return None
    lo, hi, v = (math.log(p.low), math.log(p.high), math.log(value)) if p.log and value > 0 else (p.low, p.high, value)
    return (v - lo) / (hi - lo) if hi > lo else 0.0


def without_transfer(space: Space, trials: Sequence[FrozenTrial], pairs: Sequence[tuple[int, int, float, float]],
                     factors: dict[str, float], sign: float, step: int | None = None) -> dict[str, Any] | None:
    """Whether the transfer rules helped, estimated from the runs the study has (no run is made for it): without the
    rules the proxy would have run each promoted setting's own values, so its value there is taken from the proxy
    trial that actually ran nearest them (its run values: the study's values / factor; within 0.1 of each range,
    categoricals equal; its value at ``step``, as the check compares, else its final one), and tau is computed again.
    None without rules or fewer than 2 such estimates."""
    if not factors:
        return None
    by_number = {t.number: t for t in trials}
    ran = [(t, {p.name: space.scaled(p, t.params.get(p.name)) for p in space.params}) for t in trials
           if is_proxy(t) and not is_tie_run(t) and _finite(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    estimates: list[tuple[float, float]] = []  # (the proxy's estimated value without the rules, the target value)
    for n, _, _, target in pairs:
        wanted = by_number[n].params
        best, near = None, 0.1
        for t, values in ran:
            if any(p.type == "categorical" and values.get(p.name) != wanted.get(p.name) for p in space.params):
                continue
            gaps = [abs((_unit(p, values.get(p.name)) or 0.0) - (_unit(p, wanted.get(p.name)) or 0.0))
                    for p in space.params if p.type != "categorical"]
            if max(gaps, default=0.0) <= near:
                best, near = t, max(gaps, default=0.0)
        if best is not None:
            at = None if step is None else _value_at(best, step)
            estimates.append((float(best.values[0]) if at is None else at, target))
    if len(estimates) < 2:
        return None
    x = [sign * e[0] for e in estimates]
    y = [sign * e[1] for e in estimates]
    return {"n": len(estimates), "tau": kendall_tau(x, y)}


def _promote_steps(kept: dict[str, Any]) -> int | None:
    """The promotion step of the stored ``kept`` record (None when absent or not an int: storage is untrusted)."""
    steps = kept.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def check_pairs(study: optuna.Study, trials: Sequence[FrozenTrial], kept: dict[str, Any]
                ) -> list[tuple[int, int, float, float]]:
    """(proxy trial, its promoted run, proxy value at the promotion step, target value) of each candidate with a
    finite target value, in the proxy's order (a retried run's finished attempt). The proxy value is the proxy trial's
    last evaluation at or before ``kept["steps"]`` (its final value when it reported none by then)."""
    by_number = {t.number: t for t in trials}
    runs = {t.system_attrs.get(ATTR_PROMOTED_FROM): t for t in sorted(promoted_runs(trials), key=lambda t: t.number)
            if is_finished(t) and _finite(t) and promotion_twin(study, t) is None}
    steps = _promote_steps(kept)
    out = []
    for n in kept.get("candidates", []):
        src, run = by_number.get(n), runs.get(n)
        if src is not None and run is not None and src.values is not None and run.values is not None:
            at = None if steps is None else _value_at(src, steps)
            if at is None or not math.isfinite(at):
                at = float(src.values[0])
            out.append((n, run.number, at, float(run.values[0])))
    return out


def record_check(study: optuna.Study, space: Space, factors: dict[str, float], kept: dict[str, Any]
                 ) -> dict[str, Any]:
    """The check of the proxy against the target on the promoted settings ``kept`` (computed and kept once; see the
    module docstring)."""
    attrs = study.user_attrs
    found = attrs.get(ATTR_FIDELITY_CHECK)
    if isinstance(found, dict) and isinstance(found.get("holds"), bool):
        return found
    trials = study.get_trials(deepcopy=False)
    check = agreement(check_pairs(study, trials, kept), _sign(study), space)
    proxy = space.study.fidelity.proxy
    assert proxy is not None
    check["steps"] = steps = _promote_steps(kept)
    scaled = dataclasses.replace(space, scale={k: 1.0 / f for k, f in factors.items()})  # what the proxy ran
    check["without_transfer"] = without_transfer(scaled, trials, check.get("pairs") or [], factors, _sign(study),
                                                 steps)
    check["transfer"] = {name: {"rule": rule.text(), "factor": factors.get(name)} for name, rule in
                         proxy.transfer.items()}
    check = json.loads(json.dumps(check))  # as the storage gives it back to every other driver
    study.set_user_attr(ATTR_FIDELITY_CHECK, check)
    if factors and ATTR_TRANSFER not in attrs:
        study.set_user_attr(ATTR_TRANSFER, dict(factors))
    return check


def unseen_setting(check: Any) -> dict[str, Any] | None:
    """The check's ``unseen`` record (the target's best at the promotion step that the proxy could not tell from its
    pick there; :func:`agreement`), None when absent or malformed (the study's record is read, never trusted)."""
    found = check.get("unseen") if isinstance(check, dict) else None
    if not isinstance(found, dict) or not all(isinstance(found.get(k), int) and not isinstance(found.get(k), bool)
                                              for k in ("trial", "run", "of")):
        return None
    if not all(isinstance(found.get(k), (int, float)) and math.isfinite(found[k]) for k in ("proxy_gap", "target_gap")):
        return None
    return found


def unseen_clause(check: dict[str, Any]) -> str:
    """``; ...`` saying the check's :func:`unseen_setting` ("" without one)."""
    found = unseen_setting(check)
    if found is None:
        return ""
    steps = check.get("steps")
    at = f"step {steps}" if isinstance(steps, int) and not isinstance(steps, bool) else "the promotion step"
    return (f"; at {at} it had trial {found['trial']} within the resolution of its pick, trial {found['of']} "
            f"({abs(found['proxy_gap']):.3g} apart), where the target had trial {found['trial']} "
            f"{found['target_gap']:.3g} ahead: the proxy's preference for its pick is not measured, so the race "
            "takes both")


def check_line(check: dict[str, Any]) -> str:
    """The check in one line (what the search prints, and ``best`` and the summary repeat)."""
    n = check.get("n", 0)
    tau, iv, p = check.get("tau"), check.get("interval"), check.get("p_value")
    figures = f"Kendall's tau {tau:.2f}" if isinstance(tau, (int, float)) else "Kendall's tau n/a"
    if isinstance(iv, (list, tuple)) and len(iv) == 2:
        figures += f", 95% interval [{iv[0]:.2f}, {iv[1]:.2f}]"
    if isinstance(p, (int, float)):
        figures += f", p {p:.2g}"
    transfer = "; ".join(f"{k}: {v.get('rule')} (x{v.get('factor'):.4g})" for k, v in
                         (check.get("transfer") or {}).items() if isinstance(v, dict)
                         and isinstance(v.get("factor"), (int, float)))
    rules = f"; transfer rules applied: {transfer}" if transfer else ""
    other = check.get("without_transfer")
    if transfer and isinstance(other, dict) and isinstance(other.get("tau"), (int, float)) \
            and isinstance(tau, (int, float)):
        helped = "helped" if tau > other["tau"] else "did not help"
        rules += (f", which {helped}: without them tau {other['tau']:.2f} (estimated from the proxy trials nearest "
                  f"{other['n']} settings)")
    elif transfer:
        rules += " (whether they helped: too few proxy trials near the promoted settings to tell)"
    steps = check.get("steps")
    at = f" at step {steps}" if isinstance(steps, int) and not isinstance(steps, bool) else ""
    if check.get("holds"):
        return (f"proxy check: the proxy holds on {n} promoted settings{at} ({figures}; {check.get('why')}){rules}"
                f"{unseen_clause(check)}: the confirmation races them on the target")
    return (f"proxy check: the proxy does not rank settings as the target does ({figures} on {n} promoted settings"
            f"{at}; {check.get('why')}){rules}: the rest of the budget searches on the target")
