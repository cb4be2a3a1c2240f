"""A PBT study's confirmation (``verl-hpo confirm``): the best final segments' schedules re-run from scratch with fresh
seeds, each as a chain of segments queued one after another (:func:`queue_schedule_confirmations`), and each chain's
next segment queued with the checkpoint its predecessor left (:func:`schedule_confirms`, called by the driver's loop).
The population itself (members, exploit and explore, segments) is :mod:`hpo.study._population`."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Space
from hpo.record import is_confirm
from hpo.samplers import lineage, schedule
from hpo.study._checkpoints import CHECKPOINTS, TRIAL_MARKER, CheckpointUnusable
from hpo.study._population import (
    A_CHECKPOINT,
    A_END,
    A_INDEX,
    A_INTERMEDIATE,
    A_SCHEDULE,
    A_START,
    COPIES,
    NoHealthyMember,
    link_checkpoint,
    no_healthy_line,
    pbt_total,
    segments_of,
    step_name,
    to_segment_like,
)


def queue_schedule_confirmations(study: optuna.Study, space: Space, top_k: int, n_seeds: int
                                 ) -> list[tuple[int, int]]:
    """``verl-hpo confirm`` of a pbt study: re-run the ``top_k`` best final segments' schedules from scratch with
    fresh seeds, each as a chain of segments (one per step range of the schedule, each continuing the previous
    one's checkpoint with the range's values). Every segment is a confirmation trial (``hpo:confirm_of`` = the
    final segment, ``hpo:confirm_seed``); intermediate ones carry ``pbt:intermediate`` and only count in the
    confirmed mean when they stopped early (a schedule that collapses under another seed is not confirmed).
    Returns the (trial, seed) chains queued."""
    from hpo.study._confirm import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, confirm_seeds

    trials = study.get_trials(deepcopy=False)
    seeds = confirm_seeds(space, n_seeds)
    present = {(t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs.get(ATTR_CONFIRM_SEED)) for t in trials
               if is_confirm(t) and t.system_attrs.get(A_INDEX) == 0 and t.state != TrialState.FAIL}
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    total = pbt_total(space)
    finals = [s for s in segments_of(trials) if s.finished and s.reached_end and s.end >= total
              and s.value is not None]
    if not finals:
        raise NoHealthyMember(no_healthy_line(study, total))
    finals.sort(key=lambda s: (sign * float(s.value), s.number))  # type: ignore[arg-type]
    queued: list[tuple[int, int]] = []
    seen: list[list[dict[str, Any]]] = []
    for final in finals:
        sched = schedule(lineage(segments_of(trials), final.number))
        if sched in seen:
            continue
        seen.append(sched)
        for seed in seeds:
            if (final.number, seed) not in present:
                _queue_chain(study, space, {ATTR_CONFIRM_OF: final.number, ATTR_CONFIRM_SEED: seed}, sched, 0, None)
                queued.append((final.number, seed))
        if len(seen) == top_k:
            break
    return queued


def _queue_chain(study: optuna.Study, space: Space, tag: dict[str, Any], sched: list[dict[str, Any]], index: int,
                 checkpoint: str | None) -> None:
    step = sched[index]
    system = {**tag, A_SCHEDULE: sched, A_INDEX: index, A_START: step["start"], A_END: step["end"],
              A_CHECKPOINT: checkpoint, A_INTERMEDIATE: index < len(sched) - 1}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=step["params"],
        distributions={p.name: p.distribution() for p in space.params}, system_attrs=system))


def schedule_confirms(study: optuna.Study, space: Space, study_dir: Path, trials: list[FrozenTrial]) -> int:
    """Queue the next segment of every confirmation chain whose newest segment ran to its end (its checkpoint
    hard-linked into ``<study>/pbt`` first, then deleted from the finished segment, as are the copies finished
    segments started from: a confirmation run keeps no checkpoint). Returns how many were queued."""
    from hpo.study._confirm import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED

    chains: dict[tuple[Any, Any], FrozenTrial] = {}
    for t in trials:
        if not is_confirm(t) or A_INDEX not in t.system_attrs or t.user_attrs.get("stop_reason") == "surplus":
            continue
        key = (t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs.get(ATTR_CONFIRM_SEED))
        cur = chains.get(key)
        if cur is None or (t.system_attrs[A_INDEX], t.number) > (cur.system_attrs[A_INDEX], cur.number):
            chains[key] = t
    queued = 0
    for t in chains.values():
        s, sched = t.system_attrs, t.system_attrs[A_SCHEDULE]
        if t.state != TrialState.COMPLETE:
            continue
        trial_dir = Path(str(t.user_attrs.get("trial_dir", "")))
        own = trial_dir / CHECKPOINTS
        seg = to_segment_like(t)
        if seg and s[A_INDEX] < len(sched) - 1:
            dst = study_dir / COPIES / f"c{t.number}-{uuid.uuid4().hex[:8]}" / step_name(space, s[A_END])
            try:
                link_checkpoint(trial_dir.parent, [trial_dir.name, CHECKPOINTS, step_name(space, s[A_END])], dst)
            except CheckpointUnusable:
                continue
            _queue_chain(study, space, {ATTR_CONFIRM_OF: s[ATTR_CONFIRM_OF], ATTR_CONFIRM_SEED: s[ATTR_CONFIRM_SEED]},
                         sched, s[A_INDEX] + 1, str(dst))
            queued += 1
        if own.is_dir() and (own.parent / TRIAL_MARKER).is_file() and not own.is_symlink():
            shutil.rmtree(own, ignore_errors=True)
        ck = s.get(A_CHECKPOINT)
        if ck and Path(ck).parent.parent == study_dir / COPIES and (Path(ck).parent / TRIAL_MARKER).is_file():
            shutil.rmtree(Path(ck).parent, ignore_errors=True)
    return queued


