"""What ``confirm`` and ``best`` say about confirmed settings beyond the table: where the held-out value comes from,
which settings cannot be told apart (paired on shared seeds, else Welch), which are within the resolution of the best
mean and which one is preferred among those, that the better mean is kept when two are not separated but further
apart (:mod:`hpo.study._compare`), and the improvement over ``study.baseline`` on the same seeds."""

from __future__ import annotations

import math

import optuna

from hpo.experiment import Space, format_value
from hpo.record import is_confirm, study_cost
from hpo.samplers import ties_line
from hpo.study import (
    RULE,
    Confirmed,
    Difference,
    Verdict,
    baseline_confirmed,
    confirmed,
    heldout_note,
    improvement,
    proxy_race_line,
    race_state,
    verdict,
)

UNSEPARATED_ENDS = ("seed cap", "budget")  # a race ended with candidates left that it could not separate


def _maximize(study: optuna.Study) -> bool:
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def tolerance(space: Space, ranked: list[Confirmed]) -> float:
    """How close to its best a run must come to count as on its plateau: ``early_stopping.plateau_min_delta``, else
    1% of the best confirmed mean."""
    delta = space.early_stopping.plateau_min_delta
    if delta > 0:
        return delta
    top = abs(ranked[0].mean) if ranked and math.isfinite(ranked[0].mean) else 0.0
    return 0.01 * top or 1e-12


def resolution(space: Space, ranked: list[Confirmed]) -> float:
    """The confirmed means' differences that do not matter: ``study.confirm.resolution``, else
    :func:`tolerance`'s ``early_stopping.plateau_min_delta``, else 1% of the best confirmed mean."""
    res = space.study.confirm.resolution
    return tolerance(space, ranked) if res is None else float(res)


def study_verdict(study: optuna.Study, space: Space) -> Verdict | None:
    """The verdict on the confirmed settings (None before any confirmation run finished)."""
    ranked = confirmed(study)
    if not ranked:
        return None
    race = race_state(study, space)
    out = frozenset(race.dropped) if race is not None else frozenset()
    if race is not None and race.alive and ranked[0].trial.number in out:  # a dropped one's lucky first runs
        ranked = [c for c in ranked if c.trial.number not in out] + [c for c in ranked if c.trial.number in out]
    res = race.resolution if race is not None else resolution(space, ranked)  # the race's own: one answer
    return verdict(ranked, _maximize(study), tolerance(space, ranked), out, res)


def race_lines(study: optuna.Study, space: Space) -> list[str]:
    """What a racing confirmation decided: how it ended (or that it goes on), who was dropped when, and the runs it
    spent against the runs confirming every seed of every candidate would have taken."""
    race = race_state(study, space)
    if race is None:
        return []
    proxy = proxy_race_line(study, space)  # a proxy search: the race's field, and the promoted runs it continued
    shown = {None: "goes on", "separated": "ended: the leader is separated from every other candidate",
             "tied": f"ended: the candidates left are tied at the resolution {race.resolution:.4g}",
             "seed cap": f"ended at the seed cap ({len(race.seeds)}): the candidates left are not separated",
             "budget": "ended at the budget (study.budget: the next round would pass it): the candidates left are "
                       "not separated"}
    ties = ties_line(study) if space.study.fidelity.proxy is not None else None  # the proxy's tie, on its seeds
    out = [line for line in (ties, proxy) if line is not None]
    out.append(f"racing confirmation {shown.get(race.end, race.end)} after {race.rounds} seed(s); leader trial "
               f"{race.leader}")
    for c, (seeds, gap) in sorted(race.dropped.items()):
        why = "a run failed" if gap is None else f"behind the leader by {gap.text()} (paired 95%)"
        out.append(f"racing confirmation dropped trial {c} after {seeds} seed(s): {why}")
    runs = sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
               if is_confirm(t))
    every = len(race.candidates) * len(race.seeds) + (len(race.seeds) if space.study.baseline else 0)
    out.append(f"racing confirmation ran {runs} run(s) (the baseline's included) where every seed of every candidate "
               f"takes {every}")
    return out


def _steps(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.0f}"


def verdict_lines(study: optuna.Study, space: Space) -> list[str]:
    """The lines ``confirm`` prints under its table and ``best`` prints (as comments) above the overrides."""
    out: list[str] = []
    note = heldout_note(space)
    if note:
        out.append(f"held-out: {note}; only validation values rank and choose")
    v = study_verdict(study, space)
    if v is None:
        return out
    out += race_lines(study, space)
    out += _pair_lines(study, v) + _choice_lines(v)
    out.append(f"spent: {study_cost(study.get_trials(deepcopy=False)).text()}")
    out += baseline_lines(study, space, v.pick)
    return out


def _pair_lines(study: optuna.Study, v: Verdict) -> list[str]:
    """The best confirmed setting against each other one: the interval, and what it decides."""
    out, top, res = [], v.top.trial.number, v.resolution
    tied, unseparated = _numbers(v.tied), _numbers(v.unseparated)
    for c in confirmed(study)[1:]:
        d = v.gaps.get(c.trial.number)
        gap = "n/a (fewer than 2 runs)" if d is None else f"{d.text()} ({_test(d)})"
        word = (f"cannot be told apart, within the resolution {res:.3g} of it" if c.trial.number in tied else
                f"not separated, but more than the resolution {res:.3g} below trial {top}"
                if c.trial.number in unseparated else f"trial {top} is better")
        out.append(f"trial {top} vs trial {c.trial.number}: confirmed difference {gap}: {word}")
    return out


def _choice_lines(v: Verdict) -> list[str]:
    """Which setting is recommended and why: preferred among the tied ones, or the better mean of settings not
    separated but more than the resolution apart, or the best, separated from every other."""
    out, top, res = [], v.top, v.resolution
    if v.tied:
        names = ", ".join(str(c.trial.number) for c in (top, *v.tied))
        why = ", ".join(f"trial {c.trial.number}: {v.bad[c.trial.number]} bad run(s), "
                        f"{_steps(v.plateau_steps[c.trial.number])} steps to plateau, mean {c.mean:.4g}"
                        for c in (top, *v.tied))
        out.append(f"trials {names} are not separated after {_seeds(v, v.tied[0])} seeds and within the resolution "
                   f"{res:.3g} of the best mean; preferring trial {v.pick.trial.number} by the rule {RULE} ({why})")
    if v.unseparated:
        other = v.unseparated[0]
        if v.pick is top:
            out.append(f"not separated after {_seeds(v, other)} seeds: the recommendation is the better mean, trial "
                       f"{top.trial.number} {top.mean:.4g} vs trial {other.trial.number} {other.mean:.4g} (more than "
                       f"the resolution {res:.3g} apart: bad runs and steps to plateau decide only within it)")
        else:
            names = ", ".join(f"trial {c.trial.number} {c.mean:.4g}" for c in v.unseparated)
            out.append(f"not separated after {_seeds(v, other)} seeds from {names}, but more than the resolution "
                       f"{res:.3g} below the best mean {top.mean:.4g}: the better means win over it")
    if not v.tied and not v.unseparated:
        tests = sorted({d.test for d in v.gaps.values() if d is not None})
        out.append(f"trial {top.trial.number} is better than every other confirmed setting "
                   f"({'/'.join(tests) + ' ' if tests else ''}95% intervals exclude 0)")
    return out


def _numbers(group: tuple[Confirmed, ...]) -> set[int]:
    return {c.trial.number for c in group}


def _seeds(v: Verdict, c: Confirmed) -> int:
    """The seeds the best confirmed setting and ``c`` were compared on."""
    d = v.gaps.get(c.trial.number)
    return d.n if d is not None else min(v.top.n, c.n)


def _test(d: Difference) -> str:
    return f"paired 95% on {d.n} shared seeds" if d.test == "paired" else "Welch 95%"


def baseline_lines(study: optuna.Study, space: Space, pick: Confirmed) -> list[str]:
    """The pick against ``study.baseline`` on the same seeds: difference of means and its Welch interval, on the
    validation values and on the held-out test values."""
    if not space.study.baseline:
        return []
    shown = " ".join(f"{k}={format_value(val)}" for k, val in space.study.baseline.items())
    base = baseline_confirmed(study)
    if base is None:
        return [f"baseline ({shown}): no finished run yet (verl-hpo confirm runs it on the same seeds)"]
    maximize = _maximize(study)
    val = improvement(pick.values, base.values, maximize)
    test = improvement(pick.test_values, base.test_values, maximize) if pick.test_values and base.test_values \
        else None
    parts = [f"validation {_diff(val)}"] + ([f"held-out test {_diff(test)}"] if test is not None else [])
    decisive = test if test is not None else val
    if decisive is None:
        word = "too few runs to tell"
    elif decisive.low > 0:
        word = "the search pays: the interval excludes 0"
    elif decisive.high < 0:
        word = "the baseline is better"
    else:
        word = "cannot be told apart from the baseline at this spread"
    same = sorted(set(pick.seeds) & set(base.seeds))
    reused = [str(r.user_attrs["baseline_reused"]) for r in base.runs if r.user_attrs.get("baseline_reused")]
    kept = [f"{len(reused)} of the baseline's {len(base.runs)} run(s) reused from this host's earlier runs of the same "
            f"experiment, seed and trainer version (study#trial: {', '.join(reused[:3])}"
            f"{', ...' if len(reused) > 3 else ''})"] if reused else []
    return kept + [f"improvement of trial {pick.trial.number} over the baseline ({shown}; mean {base.mean:.4g} +- "
            f"{base.std:.3g}" + (f", test {base.test_mean:.4g} +- {base.test_std:.3g}" if base.test_values else "")
            + f") on seeds {', '.join(map(str, same)) or '-'}: {'; '.join(parts)} (Welch 95%): {word}"]


def _diff(d: Difference | None) -> str:
    return "n/a (fewer than 2 runs)" if d is None else d.text()
