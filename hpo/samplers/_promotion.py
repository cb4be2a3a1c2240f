"""Promotion of the proxy's best settings to the target, and the proxy's ties before it (``study.fidelity.proxy``;
the driver calls these, :mod:`hpo.study._driver`).

* :func:`start_promotion`: once the proxy search has its ``n_trials``, its ``promote`` best distinct settings
  (:func:`proxy_ranking`) are kept in the study (:data:`~hpo.record.ATTR_PROMOTION`, set once: every driver and a
  resume promote the same ones) and each gets one WAITING target run (system attrs ``hpo:fidelity=target``,
  ``hpo:promoted_from``, ``hpo:promote_steps``), queued only when none is queued, running or finished; two drivers
  queueing one at once run it once (:func:`promotion_twin`: the later is surplus), as confirmation runs are.
  A promoted run stops at ``promote_steps`` (the first successive-halving rung, else a quarter of a trial's steps;
  :func:`promote_steps`) and its value is a target value.
* The check of the proxy against the target, once every promoted run has finished, is
  :mod:`hpo.samplers._check`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Space
from hpo.record import (
    ATTR_FIDELITY,
    ATTR_PROMOTE_STEPS,
    ATTR_PROMOTED_FROM,
    ATTR_PROMOTION,
    ATTR_PROXY_TIES,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
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


def resolution(space: Space, best: float) -> float:
    """The race's resolution: ``study.confirm.resolution``, else ``plateau_min_delta``, else 1% of the best."""
    res = getattr(space.study.confirm, "resolution", None)
    if isinstance(res, (int, float)) and not isinstance(res, bool):
        return float(res)
    delta = space.early_stopping.plateau_min_delta
    return delta if delta > 0 else (0.01 * abs(best) or 1e-12)


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
