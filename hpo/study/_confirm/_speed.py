"""A throughput study's confirmation: ABBA blocks of the user's config and the fastest picks per seed, a control run,
and a killed run's block made again as a new generation."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Space
from hpo.record import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_SPEED_BLOCK,
    is_confirm,
)
from hpo.study._confirm._seeds import BASELINE_OF, confirm_seeds, top_trials

CONTROL_OF = -2  # hpo:confirm_of of a throughput study's control: the user's config again, on the first seed


def queue_speed_check(study: optuna.Study, space: Space, top_k: int, repeats: int) -> list[tuple[int, int]]:
    """A throughput study's confirmation (:mod:`hpo.reporting._speed` reads it): for each of ``repeats`` seeds a run
    of the user's config (``study.baseline``) and one of each of the ``top_k`` fastest distinct search trials, in that
    order on even seeds and the reverse on odd ones (the driver runs them one at a time, so they alternate on the
    host and a linear drift of its speed cancels out), and right after the first seed's run of the user's config a
    control: the same config on the same seed again, which tells the same-math check how far two runs of one config
    and seed differ on this trainer (0 where its rollout is reproducible). Never from the kept baselines (a timing
    is its run's own). ValueError when the search has no finite trial. ``confirm`` calls it again with one seed more
    while the fastest pick is not separated from the user's config (up to ``study.throughput.max_repeats``: the
    command's ``more`` hook, :meth:`hpo.study._driver.Driver.run_confirm`); the blocks already there stay.

    The runs of one seed are a block (:data:`~hpo.record.ATTR_SPEED_BLOCK`: their order and the block's generation):
    what is not queued yet is queued, and a block that lost a run for good (it failed and was not retried) while
    others of its runs stand is queued again whole, as a new generation (:func:`speed_block_retry`)."""
    picks = top_trials(study, top_k)
    if not picks:
        raise ValueError(f"study {study.study_name!r} has no completed throughput trial with a finite value yet")
    trials = study.get_trials(deepcopy=False)
    live = [t for t in trials if is_confirm(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED,
                                                               TrialState.RUNNING, TrialState.WAITING)]
    queued: list[tuple[int, int]] = []
    control = any(t.system_attrs.get(ATTR_CONFIRM_OF) == CONTROL_OF for t in live)
    for i, seed in enumerate(confirm_seeds(space, repeats)):
        one = [None, *picks]  # the user's config first, then each pick; the next seed the other way round (ABBA):
        block = one if i % 2 == 0 else one[::-1]  # a drift of the host's speed cancels out
        order = [BASELINE_OF if t is None else t.number for t in block]
        newest: dict[int, int] = {}  # member -> the newest generation of its runs standing on this seed
        for run in live:
            member, made = run.system_attrs.get(ATTR_CONFIRM_OF), _generation(run)
            if run.system_attrs.get(ATTR_CONFIRM_SEED) == seed and member in order and made is not None:
                newest[member] = max(newest.get(member, made), made)
        whole = set(newest) == set(order) and len(set(newest.values())) == 1
        gen = len(trials) if newest else 0  # none queued yet: generation 0; a broken block: all of it again
        for pick, of in zip(block, order):
            if not whole:
                _add_speed_run(study, pick, seed, {"order": order, "generation": gen})
                queued.append((of, seed))
            if i == 0 and pick is None and not control:  # right after the first seed's run of the user's config
                study.add_trial(optuna.create_trial(
                    state=TrialState.WAITING, params={}, distributions={},
                    system_attrs={ATTR_CONFIRM_OF: CONTROL_OF, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True}))
                queued.append((CONTROL_OF, seed))
                control = True
    return queued


def _generation(t: FrozenTrial) -> int | None:
    """The generation of a throughput re-measurement's block (-1: a run queued before blocks were recorded); None
    for any other run (the control, a learning study's)."""
    block = t.system_attrs.get(ATTR_SPEED_BLOCK)
    if t.system_attrs.get(ATTR_CONFIRM_OF) == CONTROL_OF or not is_confirm(t):
        return None
    gen = block.get("generation") if isinstance(block, dict) else -1
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else -1


def speed_generation(t: FrozenTrial) -> int | None:
    """A throughput re-measurement's block generation (a later one replaces an earlier one of its seed); None for
    any run that is not one (only runs that carry a block are)."""
    return _generation(t) if isinstance(t.system_attrs.get(ATTR_SPEED_BLOCK), dict) else None


def _add_speed_run(study: optuna.Study, t: FrozenTrial | None, seed: int, block: dict[str, Any],
                   system: dict[str, Any] | None = None) -> None:
    """Queue a run of the user's config (``t`` None) or of pick ``t`` on ``seed`` in ``block``; ``system``: the
    system attrs of a retry instead of a fresh run's."""
    of = BASELINE_OF if t is None else t.number
    attrs = {**(system or {ATTR_CONFIRM_OF: of, ATTR_CONFIRM_SEED: seed, **({ATTR_BASELINE: True} if t is None
                                                                              else {})}), ATTR_SPEED_BLOCK: block}
    study.add_trial(optuna.create_trial(state=TrialState.WAITING, params={} if t is None else t.params,
                                        distributions={} if t is None else t.distributions, system_attrs=attrs))


def speed_block_retry(study: optuna.Study, killed: FrozenTrial, retry: dict[str, Any]) -> bool:
    """Queue the retry (system attrs ``retry``) of a throughput re-measurement that was killed (its driver killed or
    interrupted, its Ray node lost) as part of its seed's block made again; False, queueing nothing, for any other
    run (a learning study's, the control, a run queued before blocks were recorded): it is retried on its own.

    A pick's speed-up is the ratio of its run to the user's config's on the same seed, and it cancels a drift of the
    host's speed only because the runs of one seed run back to back. A retry is queued after everything already
    queued, and a killed driver may be resumed hours later, so neither "after the whole sequence" (the old way: paired
    with a run made minutes before) nor "next" can pair a retry with a run made before the kill. The seed's block is
    therefore discarded and re-made: its runs (the user's config and each pick, in the block's ABBA order), the retry
    in the killed run's place, queued together after the rest as a new generation of the block. The old block's
    runs still waiting are then surplus (:func:`hpo.study._compare.twin_of`: never run) and the report compares the
    newest finished run of each config and seed, so nothing made before the kill is paired with the new runs. A kill
    costs the block's other runs once more."""
    block = killed.system_attrs.get(ATTR_SPEED_BLOCK)
    order = block.get("order") if isinstance(block, dict) else None
    of, seed = killed.system_attrs.get(ATTR_CONFIRM_OF), killed.system_attrs.get(ATTR_CONFIRM_SEED)
    if (not isinstance(order, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in order)
            or of not in order or not isinstance(seed, int) or isinstance(seed, bool)):
        return False
    trials = study.get_trials(deepcopy=False)
    picks = {t.number: t for t in trials if t.number in order}
    if any(n != BASELINE_OF and n not in picks for n in order):
        return False
    new = {"order": order, "generation": len(trials)}  # above every generation before it
    for n in order:
        _add_speed_run(study, None if n == BASELINE_OF else picks[n], seed, new, retry if n == of else None)
    return True
