"""The check that decides whether the proxy is trusted (``study.fidelity.proxy``), made once every promoted run
(:mod:`hpo.samplers._promotion`) has finished; the driver calls it (:mod:`hpo.study._driver`).

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
  among them).
* **A catch-up the proxy never measured** (``unmeasured``): the check holds, and the proxy's pick (its full-length
  first) is not the target's best at that step, and the target has the pick further behind that setting there than
  the proxy had it, by more than the resolution. On the proxy the pick made up its deficit at that step and ended
  ahead; the target's deficit is larger, and whether the pick makes that up on the target is not measured by
  anything the study ran. The check keeps that setting, its line says so, and the race takes both (beyond
  ``confirm_top``): the target decides at full length. A pick whose deficit on the target is no larger than on the
  proxy (to the resolution) is trusted. On build C of the tiny_arith family the proxy's picks were slow starters and
  the target's deficit was 7 and 70 times the proxy's (study seeds 0 and 2: 0.049 -> 0.351, 0.004 -> 0.291 at step
  10); on fresh seeds those picks tested 0.056 and 0.033 below the other promoted setting (benchmarks/RESULTS.md,
  "model-size fidelity").

The figures and the decision are kept in the study's user attr :data:`~hpo.record.ATTR_FIDELITY_CHECK`, the first
driver to finish them writes them, and :func:`check_line` says them in one line. Which settings the race then runs is
the proxy's full-length ranking's to say, with the unmeasured one (:func:`hpo.study._continuation.proxy_field`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Param, Space
from hpo.record import ATTR_FIDELITY_CHECK, ATTR_PROMOTED_FROM, ATTR_TRANSFER, is_finished, is_proxy, is_tie_run
from hpo.samplers._promotion import _finite, _sign, _value_at, promoted_runs, promotion_twin, resolution

BOOTSTRAP = 2000
MAX_EXACT = 8  # the permutation p-value is exact up to this many settings (8! = 40,320 orderings)


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
    if holds and best != 0 and (y[best] - y[0]) - (x[best] - x[0]) > res + 1e-12:
        # the proxy's pick (its full-length first) is further behind the target's best at the step on the target than
        # it was on the proxy: a catch-up the proxy never measured (module docstring): the race takes both
        out["unmeasured"] = {"trial": pairs[best][0], "run": pairs[best][1], "of": pairs[0][0], "of_run": pairs[0][1],
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


def unmeasured_setting(check: Any) -> dict[str, Any] | None:
    """The check's ``unmeasured`` record (the target's best at the promotion step, whose lead over the proxy's pick
    there is larger on the target than the proxy measured; :func:`agreement`), None when absent or malformed (the
    study's record is read, never trusted)."""
    found = check.get("unmeasured") if isinstance(check, dict) else None
    if not isinstance(found, dict) or not all(isinstance(found.get(k), int) and not isinstance(found.get(k), bool)
                                              for k in ("trial", "run", "of")):
        return None
    if not all(isinstance(found.get(k), (int, float)) and math.isfinite(found[k]) for k in ("proxy_gap", "target_gap")):
        return None
    return found


def unmeasured_words(check: Any) -> str | None:
    """The check's :func:`unmeasured_setting` in words (``at step 10 its pick, trial 3, was 0.004 behind trial 8 on
    the proxy and 0.291 behind it on the target``), None without one."""
    found = unmeasured_setting(check)
    if found is None:
        return None
    steps = check.get("steps")
    at = f"step {steps}" if isinstance(steps, int) and not isinstance(steps, bool) else "the promotion step"
    g = found["proxy_gap"]
    proxy = f"{g:.3g} behind" if g > 0 else f"{-g:.3g} ahead of" if g < 0 else "level with"
    of_run = found.get("of_run")
    runs = (f" (target run {of_run})" if isinstance(of_run, int) and not isinstance(of_run, bool) else "",
            f" (target run {found['run']})")
    return (f"at {at} its pick, trial {found['of']}{runs[0]}, was {proxy} trial {found['trial']}{runs[1]} on the "
            f"proxy and {found['target_gap']:.3g} behind it on the target")


def unmeasured_clause(check: dict[str, Any]) -> str:
    """``; ...`` saying the check's :func:`unmeasured_setting` ("" without one)."""
    words = unmeasured_words(check)
    return "" if words is None else f"; {words}: a catch-up the proxy never measured, so the race takes both"


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
                f"{unmeasured_clause(check)}: the confirmation races them on the target")
    return (f"proxy check: the proxy does not rank settings as the target does ({figures} on {n} promoted settings"
            f"{at}; {check.get('why')}){rules}: the rest of the budget searches on the target")
