"""Population-based training on the study: segments as trials, their lineage, queueing the next ones, the
checkpoints they continue from and which of those stay on disk (``study.strategy: pbt``; decisions in
:mod:`hpo.study._pbt`).

**Mapping.** Every interval of a member is one trial of the study, queued WAITING with its parameters fixed
(the sampler is never asked) and its lineage in system attrs, so storage, several workers, heartbeats and
retries (:mod:`hpo.study._recovery`), dashboards and ``best`` work as for any trial:

* ``pbt:member``, ``pbt:seq`` (the member's segment count), ``pbt:generation`` (the interval index,
  ``start // interval_steps``), ``pbt:start`` / ``pbt:end`` (the step range), ``pbt:action`` (start, continue,
  exploit, rollback, retry), ``pbt:parent_trial`` (the member's previous segment), ``pbt:donor`` (the trial whose
  checkpoint was exploited), ``pbt:source`` (the trial whose end checkpoint it continues: the parent, the donor,
  or for a rollback the collapsed segment's own source), ``pbt:checkpoint`` (the path it continues from),
  ``pbt:rollbacks``, ``pbt:why``. The running trial shows them as user attrs ``pbt_*`` (plus ``pbt_step_range``);
  its parameters are the hyperparameters in force.
* **Asynchronous, no stall.** Every loop of every driver of the study calls :meth:`Population.schedule`: for each
  member whose newest segment is finished and has no successor, it decides (:func:`hpo.study._pbt.decide`) and
  queues the next segment. Whichever driver is alive does it, so a dead worker never stalls the population: its
  running segment is recovered and retried like any trial, and its queued decisions are anyone's to run. Two
  drivers deciding at once queue the same ``(member, seq)`` twice; the later trial is ``surplus`` when picked up.
* **Checkpoints.** A segment saves at its last step (``trainer.save_freq`` = its end) into its trial directory. The
  next segment's start checkpoint is hard-linked (else copied) at decision time into
  ``<study>/pbt/m<member>-s<seq>-<id>/global_step_<N>``, a private copy no other decision touches; the trainer
  resumes from it (``trainer.resume_mode=resume_path``, the new hyperparameters winning: verl_core
  ``checkpoint.apply_config_hyperparameters``). :meth:`Population.retain` keeps only what a live lineage can reach:
  each member's newest finished segment's checkpoints, and the copies referenced by a segment that is not finished
  or is its member's newest and failed (a rollback restarts from it); everything else the driver made goes (never a path
  outside a driver-made trial directory or ``<study>/pbt``).
* **Done** when every member's newest segment is finished and :func:`~hpo.study._pbt.decide` has nothing left for
  it (it reached the total steps, or ran out of rollbacks with no healthy member to exploit).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.experiment._space import ROLLBACK_LABELS, Space, SpaceError
from hpo.study._checkpoints import CHECKPOINTS, TRIAL_MARKER, checkpoint_dirs, dir_bytes
from hpo.study._confirm import is_confirm
from hpo.study._pbt import Decision, Segment, decide, initial_population, latest, lineage, schedule
from hpo.study._slots import is_finished

P = "pbt:"
A_MEMBER, A_SEQ, A_GEN = "pbt:member", "pbt:seq", "pbt:generation"
A_START, A_END, A_ACTION = "pbt:start", "pbt:end", "pbt:action"
A_PARENT, A_DONOR, A_SOURCE, A_CHECKPOINT = "pbt:parent_trial", "pbt:donor", "pbt:source", "pbt:checkpoint"
A_ROLLBACKS, A_WHY = "pbt:rollbacks", "pbt:why"
A_SCHEDULE, A_INDEX, A_INTERMEDIATE = "pbt:schedule", "pbt:schedule_index", "pbt:intermediate"  # confirm chains
COPIES = "pbt"  # <study dir>/pbt: the start checkpoints of queued segments
ORPHAN_AGE_S = 600.0  # a copy no trial references yet may be a decision being queued: kept this long


def is_segment(t: FrozenTrial) -> bool:
    return is_segment_attrs(t.system_attrs)


def is_segment_attrs(system: dict[str, Any]) -> bool:
    """A trial's system attrs are those of a pbt segment (of the population)."""
    return A_MEMBER in system


def runs_steps(system: dict[str, Any]) -> bool:
    """A segment of the population or of a schedule's confirmation chain: it runs a step range."""
    return A_START in system


def link_tree(src: Path, dst: Path) -> None:
    """``dst`` as a copy of the directory ``src``: hard links where the filesystem allows, else copies; written
    under a temporary name and renamed, so a half-made copy is never used. FileNotFoundError when ``src`` is
    gone."""
    if not src.is_dir() or src.is_symlink():
        raise FileNotFoundError(str(src))
    tmp = dst.parent / f".{dst.name}.tmp{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp, copy_function=link, symlinks=True)
    tmp.rename(dst)


def to_segment(t: FrozenTrial, finished: bool | None = None) -> Segment:
    s, u = t.system_attrs, t.user_attrs
    end = int(s[A_END])
    value = None
    if t.state == TrialState.COMPLETE and t.values and math.isfinite(t.values[0]):
        value = float(t.values[0])
    stop = str(u.get("stop_reason") or "")
    label = stop.partition(":")[2] if stop.startswith("collapsed:") else None
    reached = (t.state == TrialState.COMPLETE and not stop and "fail_reason" not in u
               and u.get("last_step") == end)
    return Segment(number=t.number, member=int(s[A_MEMBER]), seq=int(s[A_SEQ]), start=int(s[A_START]), end=end,
                   params=dict(t.params), finished=is_finished(t) if finished is None else finished, value=value,
                   reached_end=reached, collapse=label if label in ROLLBACK_LABELS else None, source=s.get(A_SOURCE),
                   checkpoint=s.get(A_CHECKPOINT), rollbacks=int(s.get(A_ROLLBACKS, 0)),
                   action=str(s.get(A_ACTION, "start")))


def segments_of(trials: list[FrozenTrial], max_retry: int | None = None) -> list[Segment]:
    """The study's segments, less surplus duplicates and failed attempts that a retry replaced. An attempt that
    failed without a result and will not be retried (``max_retry`` reached) counts as a finished, failed segment
    (its member decides on); one whose retry is being queued counts as not finished."""
    retried = {t.system_attrs.get("failed_trial") for t in trials}
    out = []
    for t in trials:
        if not is_segment(t) or is_confirm(t) or t.user_attrs.get("stop_reason") == "surplus":
            continue
        if t.state == TrialState.FAIL and not is_finished(t):
            if t.number in retried:
                continue
            history = t.system_attrs.get("retry_history", [])
            exhausted = max_retry is not None and len(history) + 1 > max_retry
            out.append(to_segment(t, finished=exhausted))
            continue
        out.append(to_segment(t))
    return out


class Population:
    """The PBT glue of one driver: schedules next segments, plans a segment's overrides, retains checkpoints."""

    def __init__(self, space: Space, study: optuna.Study, study_dir: Path, total: int) -> None:
        self.space = space
        self.spec = space.study.pbt
        self.study = study
        self.study_dir = study_dir
        self.trials_dir = study_dir / "trials"
        self.total = total
        self.maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        self._seen_finished: set[int] = set()
        self.notes: list[str] = []

    # ------------------------------------------------------------------ scheduling
    def schedule(self, trials: list[FrozenTrial]) -> bool:
        """Queue the initial population, and the next segment of every member that needs one; retain checkpoints
        when a segment finished since the last call. True when the population is done."""
        segs = segments_of(trials, self.space.study.max_retry)
        if not segs:
            rng = random.Random(self.spec.seed)  # the seed's design is TPE's / GP's start-up (hpo.study._startup)
            self.queue_initial(initial_population(self.space.params, self.spec.population, rng, self.spec.init))
            return False
        done = True
        newest = latest(segs)
        for m, seg in sorted(newest.items()):
            if not seg.finished:
                done = False
                continue
            d = decide(seg, segs, self.space.params, self.spec, self.total, self.maximize,
                       random.Random(f"pbt:{self.spec.seed}:{seg.number}"))
            if d is None:
                continue
            done = False
            self._queue(m, seg.seq + 1, d, seg)
        finished = {s.number for s in segs if s.finished}
        if finished - self._seen_finished:
            self._seen_finished = finished
            self.retain(trials)
        return done

    def queue_initial(self, values: list[dict[str, Any]]) -> None:
        """Queue the first segment of members 0..len(values)-1 with these parameters (by name)."""
        for m, v in enumerate(values):
            self._queue(m, 0, Decision("start", 0, min(self.spec.interval_steps, self.total), dict(v)), None)

    def _queue(self, member: int, seq: int, d: Decision, parent: Segment | None) -> bool:
        """Queue one segment (its start checkpoint copied first); False when the source checkpoint is gone (the
        next schedule decides again)."""
        ckpt = d.checkpoint
        if d.source is not None and d.checkpoint is None:
            src = self.trials_dir / str(d.source) / CHECKPOINTS / f"global_step_{d.start}"
            dst = self.study_dir / COPIES / f"m{member}-s{seq}-{uuid.uuid4().hex[:8]}" / f"global_step_{d.start}"
            try:
                link_tree(src, dst)
            except FileNotFoundError:
                self.notes.append(f"pbt: member {member}: checkpoint {src} is gone; deciding again")
                return False
            (dst.parent / TRIAL_MARKER).write_text(json.dumps({"pbt_copy_of": str(src)}) + "\n")
            ckpt = str(dst)
        system: dict[str, Any] = {
            A_MEMBER: member, A_SEQ: seq, A_GEN: d.start // self.spec.interval_steps, A_START: d.start, A_END: d.end,
            A_ACTION: d.action, A_PARENT: None if parent is None else parent.number, A_DONOR: d.donor,
            A_SOURCE: d.source, A_CHECKPOINT: ckpt, A_ROLLBACKS: d.rollbacks, A_WHY: d.why[:500]}
        self.study.add_trial(optuna.trial.create_trial(
            state=TrialState.WAITING, params=d.params,
            distributions={p.name: p.distribution() for p in self.space.params}, system_attrs=system))
        return True

    def is_surplus(self, frozen: FrozenTrial, trials: list[FrozenTrial]) -> bool:
        """A trial this strategy did not queue (a sampler's trial asked when the queue ran dry), or a duplicate
        of an earlier trial's ``(member, seq)`` (two drivers decided at once)."""
        if is_confirm(frozen):
            return False
        if not is_segment(frozen):
            return True
        key = (frozen.system_attrs[A_MEMBER], frozen.system_attrs[A_SEQ])
        mine = set(frozen.system_attrs.get("retry_history", []))
        for t in trials:
            if t.number >= frozen.number or not is_segment(t) or t.number in mine:
                continue
            if (t.system_attrs[A_MEMBER], t.system_attrs[A_SEQ]) != key:
                continue
            if t.user_attrs.get("stop_reason") == "surplus" or (t.state == TrialState.FAIL and not is_finished(t)):
                continue
            return True
        return False

    # ------------------------------------------------------------------ retention
    def retain(self, trials: list[FrozenTrial]) -> float:
        """Delete the checkpoints no live lineage can reach (module docstring); returns the GB freed."""
        segs = segments_of(trials, self.space.study.max_retry)
        newest = {s.number for s in latest([s for s in segs if s.finished]).values()}
        live_refs = {s.checkpoint for s in segs if s.checkpoint and (not s.finished or (
            s.number in newest and not s.reached_end))}  # a rollback or retry restarts from it
        running = {t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)}
        freed = 0
        for d in checkpoint_dirs(self.trials_dir, [t.number for t in trials if is_segment(t)]):
            if int(d.parent.name) in newest or int(d.parent.name) in running:
                continue
            freed += dir_bytes(d)
            shutil.rmtree(d, ignore_errors=True)
        copies = self.study_dir / COPIES
        if copies.is_dir() and not copies.is_symlink():
            now = time.time()
            for entry in copies.iterdir():
                if entry.is_symlink() or not entry.is_dir() or not (entry / TRIAL_MARKER).is_file():
                    continue
                if any(ref is not None and Path(ref).parent == entry for ref in live_refs):
                    continue
                referenced = any(s.checkpoint and Path(s.checkpoint).parent == entry for s in segs)
                if not referenced and now - entry.stat().st_mtime < ORPHAN_AGE_S:
                    continue  # a decision being queued right now
                freed += dir_bytes(entry)
                shutil.rmtree(entry, ignore_errors=True)
        return freed / 2**30


# ----------------------------------------------------------------------------- one segment's launch
def segment_overrides(space: Space, system: dict[str, Any], trial: Trial) -> tuple[list[str], Path | None]:
    """A segment's trainer overrides (its last step, a checkpoint there, verl_core's resume from its start
    checkpoint) and that checkpoint (verl: for ``verl_argv``'s resume_path); its lineage becomes user attrs."""
    start, end, ckpt = int(system[A_START]), int(system[A_END]), system.get(A_CHECKPOINT)
    for k in (A_MEMBER, A_GEN, A_ACTION, A_PARENT, A_DONOR, A_CHECKPOINT, A_ROLLBACKS):
        trial.set_user_attr("pbt_" + k[len(P):], system.get(k))
    trial.set_user_attr("pbt_step_range", [start, end])
    out = [f"trainer.total_training_steps={end}", f"trainer.save_freq={end}"]
    if space.trial.is_verl:  # verl_argv adds resume_mode=resume_path and resume_from_path; the weights only, so
        if not ckpt:         # that the config's learning rate wins over the restored optimizer's (_launch)
            return out, None
        from hpo.backends.verl._launch import weights_only_overrides

        return out + weights_only_overrides(), Path(ckpt)
    out += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}"] if ckpt else \
        ["trainer.resume_mode=disable"]
    return out, None if not ckpt else Path(ckpt)


# ----------------------------------------------------------------------------- confirming a schedule
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
        own = Path(str(t.user_attrs.get("trial_dir", ""))) / CHECKPOINTS
        seg = to_segment_like(t)
        if seg and s[A_INDEX] < len(sched) - 1:
            src = own / f"global_step_{s[A_END]}"
            dst = study_dir / COPIES / f"c{t.number}-{uuid.uuid4().hex[:8]}" / f"global_step_{s[A_END]}"
            try:
                link_tree(src, dst)
            except FileNotFoundError:
                continue
            (dst.parent / TRIAL_MARKER).write_text(json.dumps({"pbt_copy_of": str(src)}) + "\n")
            _queue_chain(study, space, {ATTR_CONFIRM_OF: s[ATTR_CONFIRM_OF], ATTR_CONFIRM_SEED: s[ATTR_CONFIRM_SEED]},
                         sched, s[A_INDEX] + 1, str(dst))
            queued += 1
        if own.is_dir() and (own.parent / TRIAL_MARKER).is_file() and not own.is_symlink():
            shutil.rmtree(own, ignore_errors=True)
        ck = s.get(A_CHECKPOINT)
        if ck and Path(ck).parent.parent == study_dir / COPIES and (Path(ck).parent / TRIAL_MARKER).is_file():
            shutil.rmtree(Path(ck).parent, ignore_errors=True)
    return queued


def to_segment_like(t: FrozenTrial) -> bool:
    """A finished chain segment that ran to its end (no stop, no failure, its last step reached)."""
    u = t.user_attrs
    return (t.state == TrialState.COMPLETE and not u.get("stop_reason") and "fail_reason" not in u
            and u.get("last_step") == t.system_attrs.get(A_END))


# ----------------------------------------------------------------------------- reporting
def lineage_of(trials: list[FrozenTrial], number: int) -> list[Segment]:
    return lineage(segments_of(trials), number)


def best_final(study: optuna.Study, total: int | None = None) -> FrozenTrial | None:
    """The best segment that reached the members' last step (any segment when none did)."""
    trials = study.get_trials(deepcopy=False)
    segs = [s for s in segments_of(trials) if s.finished and s.value is not None]
    if not segs:
        return None
    end = total if total is not None else max(s.end for s in segs)
    final = [s for s in segs if s.end >= end and s.reached_end] or segs
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    best = min(final, key=lambda s: (sign * float(s.value), s.number))  # type: ignore[arg-type]
    return next(t for t in trials if t.number == best.number)


def schedule_of(trials: list[FrozenTrial], number: int) -> list[dict[str, Any]]:
    """The hyperparameter schedule (values by step range) of the lineage ending in trial ``number``."""
    return schedule(lineage_of(trials, number))


def pbt_total(space: Space) -> int:
    """The members' total trainer steps: ``study.pbt.total_steps``, else the config's."""
    if space.study.pbt.total_steps is not None:
        return int(space.study.pbt.total_steps)
    from hpo.study._command import total_steps

    n = total_steps(space, space.trainer_overrides({}))
    if n is None:
        raise SpaceError(f"{space.source}: study.pbt.total_steps: needed (null), since the trainer's "
                         "trainer.total_training_steps is not among the overrides")
    return int(n)
