"""What the summary of a throughput search says beyond its table: each trial's spread over its measured steps, how
busy the host was while the trials ran, the trials stopped at their time limit, and a warning when that spread or
load says the ranking of the fastest settings may be noise.

How busy the host was: each trial's user attr ``host_busy``, the share of the host's CPU time (all its cores, from
``/proc/stat``) that other processes used while the trial ran, its own processes' CPU time taken out
(:mod:`hpo.execution._hostload`). A trial that shares two cores with a benchmark runs at half speed whatever its
settings; trials measured at different loads are not comparable, which is why ``confirm`` re-measures the picks
against the user's config interleaved (:mod:`hpo.reporting._speed`).

The ranking may be noise (a warning line) when the two fastest distinct settings are closer than twice the trials'
median coefficient of variation over their measured steps (:data:`NOISE_SPREADS`), or when other processes' share of
the CPU moved by more than :data:`LOAD_SWING` between trials."""

from __future__ import annotations

import statistics

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import speed_value_ok
from hpo.record import is_confirm, is_failed

NOISE_SPREADS = 2.0  # two settings closer than this many times the trials' median step-to-step spread: not told apart
LOAD_SWING = 0.25  # other processes' CPU share moving more than this between trials: not one host's speed


def _number(t: FrozenTrial, key: str) -> float | None:
    v = t.user_attrs.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def speed_search_summary(study: optuna.Study, trials: list[FrozenTrial]) -> str:
    """The summary's lines on a throughput search ("" for any other study)."""
    search = [t for t in trials if not is_confirm(t)]
    cvs = sorted(v for t in search if (v := _number(t, "throughput_cv")) is not None)
    timed = [t for t in search if t.user_attrs.get("fail_reason") == "timeout" and "timeout_rate" in t.user_attrs]
    if not cvs and not timed:
        return ""
    out = ""
    if cvs:
        out += (f"throughput spread over each trial's measured steps (after its warm-up): coefficient of variation "
                f"median {100 * cvs[len(cvs) // 2]:.1f}%, max {100 * cvs[-1]:.1f}% over {len(cvs)} trial(s)\n")
    busy = {t.number: v for t in search if (v := _number(t, "host_busy")) is not None}
    if busy:
        low, high = min(busy.values()), max(busy.values())
        spread = (f" (median over {len(busy)} trials; {100 * low:.0f}% to {100 * high:.0f}%, the most during trial "
                  f"{max(busy, key=lambda n: busy[n])})" if len(busy) > 1 else "")
        out += (f"host: other processes used {100 * statistics.median(busy.values()):.0f}% of this host's CPU time "
                f"while the trials ran{spread}\n")
    if timed:
        shown = ", ".join(f"{t.number} ({_partial(t)})" for t in timed[:8]) + (" ..." if len(timed) > 8 else "")
        out += (f"timed out: trial(s) {shown} ran past trial.timeout_s: slower settings, ranked below every finished "
                "trial (told just below the slowest trial finished before them, or their partial rate where "
                "slower)\n")
    noise = _noise(study, search, cvs, busy)
    if noise:
        out += (f"warning: the search's ranking may be noise: {'; '.join(noise)}; verl-hpo confirm re-measures the "
                "fastest settings against your config, interleaved on this host\n")
    return out


def _partial(t: FrozenTrial) -> str:
    rate = _number(t, "timeout_rate")
    return "no measured step" if rate is None else f"{rate:.4g} over its measured steps"


def _noise(study: optuna.Study, search: list[FrozenTrial], cvs: list[float], busy: dict[int, float]) -> list[str]:
    """Why the ranking of the fastest settings may be noise (none: it may not)."""
    out = []
    faster = 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
    done = sorted((t for t in search if t.state == TrialState.COMPLETE and not is_failed(t) and t.values
                   and speed_value_ok(t.values[0])), key=lambda t: (-faster * t.values[0], t.number))
    second = next((t for t in done[1:] if t.params != done[0].params), None) if done else None
    if second is not None and cvs:
        best, spread = done[0], statistics.median(cvs)
        gap = abs(best.values[0] - second.values[0]) / abs(best.values[0])
        if gap < NOISE_SPREADS * spread:
            out.append(f"the fastest (trial {best.number}, {best.values[0]:.4g}) and the next (trial "
                       f"{second.number}, {second.values[0]:.4g}) are {100 * gap:.1f}% apart, within "
                       f"{NOISE_SPREADS:g}x the trials' own spread over their measured steps (median "
                       f"{100 * spread:.1f}%)")
    if busy and max(busy.values()) - min(busy.values()) > LOAD_SWING:
        out.append(f"other processes' share of the CPU moved from {100 * min(busy.values()):.0f}% to "
                   f"{100 * max(busy.values()):.0f}% between trials (trials measured at different loads)")
    return out

