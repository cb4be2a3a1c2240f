"""Population-based training on the study: segments as trials, their lineage, queueing the next ones, the
checkpoints they continue from and which of those stay on disk (``study.strategy: pbt``; decisions in
:mod:`hpo.samplers._pbt`).

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
  member whose newest segment is finished and has no successor, it decides (:func:`hpo.samplers._pbt.decide`) and
  queues the next segment. Whichever driver is alive does it, so a dead worker never stalls the population: its
  running segment is recovered and retried like any trial, and its queued decisions are anyone's to run. Two
  drivers deciding at once queue the same ``(member, seq)`` twice; the later trial is ``surplus`` when picked up.
* **Checkpoints.** A segment saves at its last step (the trainer's ``resumable.segments`` overrides: verl_core's
  ``trainer.save_freq`` = its end) into its trial directory, under the name its layout gives (:func:`step_name`:
  ``global_step_<N>``). The next segment's start checkpoint is hard-linked (else copied) at decision time into
  ``<study>/pbt/m<member>-s<seq>-<id>/global_step_<N>`` (``pbt:checkpoint``), which no trainer is ever given: when
  the segment launches, :func:`segment_overrides` copies it (a reflink where the filesystem makes one) into
  ``.../trial-<number>/global_step_<N>``, the segment's own, and the trainer resumes from that (the attempt's
  ``resume_from``: verl_core ``trainer.resume_mode=resume_path``, the new hyperparameters winning:
  ``checkpoint.apply_config_hyperparameters``). A trainer that rewrites files in its resume directory changes no
  other segment's checkpoint, and a rollback or retry restarts from the start checkpoint as it was. A trial's
  checkpoint is read without following any symbolic link below ``trials/`` (:func:`~hpo.study._checkpoints.
  clone_tree`). :meth:`Population.retain` keeps only what a live lineage can reach:
  each member's newest finished segment's checkpoints, and the copies referenced by a segment that is not finished
  or is its member's newest and failed (a rollback restarts from it); everything else the driver made goes (never a
  path outside a driver-made trial directory or ``<study>/pbt``).
* **Lost checkpoints.** Before deciding, :meth:`Population.audit` looks at the disk: a member's newest finished
  segment whose end checkpoint is gone or unusable (deleted, a symbolic link) counts as failed, one whose start
  checkpoint is gone cannot restart from it (:func:`~hpo.samplers._pbt.decide`: it exploits a healthy member, retries,
  or stops), one line each. A copy that fails while queueing counts the same and the member decides again at once,
  each time with one checkpoint fewer, so every member ends.
* **Done** when every member's newest segment is finished and :func:`~hpo.samplers._pbt.decide` has nothing left for
  it (it reached the total steps, or ran out of rollbacks with no healthy member to exploit).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.backends import Attempt, backend_of
from hpo.experiment import ROLLBACK_LABELS, Space, SpaceError
from hpo.record import (
    ATTR_RETRY_HISTORY,
    ATTR_RETRY_OF,
    PBT,
    PBT_ACTION,
    PBT_CHECKPOINT,
    PBT_DONOR,
    PBT_END,
    PBT_GEN,
    PBT_INDEX,
    PBT_INTERMEDIATE,
    PBT_MEMBER,
    PBT_PARENT,
    PBT_ROLLBACKS,
    PBT_SCHEDULE,
    PBT_SEQ,
    PBT_SOURCE,
    PBT_START,
    PBT_WHY,
    is_confirm,
    is_finished,
    is_segment,
)
from hpo.samplers import Decision, Segment, decide, initial_population, latest, lineage, ranked, schedule
from hpo.study._checkpoints import (
    CHECKPOINTS,
    TRIAL_MARKER,
    CheckpointUnusable,
    checkpoint_dirs,
    checkpoint_problem,
    clone_tree,
    dir_bytes,
)
from hpo.study._errors import TrialFailed

P = PBT
A_MEMBER, A_SEQ, A_GEN = PBT_MEMBER, PBT_SEQ, PBT_GEN
A_START, A_END, A_ACTION = PBT_START, PBT_END, PBT_ACTION
A_PARENT, A_DONOR, A_SOURCE, A_CHECKPOINT = PBT_PARENT, PBT_DONOR, PBT_SOURCE, PBT_CHECKPOINT
A_ROLLBACKS, A_WHY = PBT_ROLLBACKS, PBT_WHY
A_SCHEDULE, A_INDEX, A_INTERMEDIATE = PBT_SCHEDULE, PBT_INDEX, PBT_INTERMEDIATE  # confirm chains
COPIES = "pbt"  # <study dir>/pbt: the start checkpoints of queued segments
ORPHAN_AGE_S = 600.0  # a copy no trial references yet may be a decision being queued: kept this long
RUN_COPY = "trial-"  # <study>/pbt/<copy>/trial-<number>/global_step_<N>: the one a segment resumes from


class NoHealthyMember(ValueError):
    """No member of a pbt study has a healthy result to report or confirm; ``str(err)`` is one line saying why."""





def step_name(space: Space, step: int) -> str:
    """The name of the trainer's checkpoint at ``step`` in a checkpoints directory (its ``resumable`` layout:
    ``global_step_<N>`` for verl_core and verl); a PBT study's trainer is resumable (:mod:`hpo.backends._check`)."""
    resumable = backend_of(space).resumable
    if resumable is None:
        raise SpaceError(f"{space.source}: study.strategy: pbt needs a trainer that resumes its checkpoints; "
                         f"trial.backend {space.trial.backend} does not")
    return resumable.step_name(step)


def end_checkpoint(space: Space, trials_dir: Path, number: int, step: int) -> tuple[Path, list[str]]:
    """Where trial ``number`` saved its step-``step`` checkpoint, as a root the driver made and the components
    below it that the trial could have replaced (none may be a symbolic link)."""
    return trials_dir, [str(number), CHECKPOINTS, step_name(space, step)]


def copy_problem(checkpoint: str) -> str | None:
    """Why the start checkpoint ``checkpoint`` (a copy under ``<study>/pbt``) cannot be restarted from, or None."""
    path = Path(checkpoint)
    return checkpoint_problem(path.parent, [path.name])


def link_checkpoint(root: Path, parts: list[str], dst: Path) -> None:
    """``dst`` (under ``<study>/pbt``) as a start checkpoint linked from ``root/parts...``, with the driver's
    marker beside it; CheckpointUnusable (nothing left behind) when that checkpoint is gone or holds a link."""
    try:
        clone_tree(root, parts, dst, link=True)
    except CheckpointUnusable:
        shutil.rmtree(dst.parent, ignore_errors=True)
        raise
    (dst.parent / TRIAL_MARKER).write_text(json.dumps({"pbt_copy_of": str(root.joinpath(*parts))}) + "\n")


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
    retried = {t.system_attrs.get(ATTR_RETRY_OF) for t in trials}
    out = []
    for t in trials:
        if not is_segment(t) or is_confirm(t) or t.user_attrs.get("stop_reason") == "surplus":
            continue
        if t.state == TrialState.FAIL and not is_finished(t):
            if t.number in retried:
                continue
            history = t.system_attrs.get(ATTR_RETRY_HISTORY, [])
            exhausted = max_retry is not None and len(history) + 1 > max_retry
            out.append(to_segment(t, finished=exhausted))
            continue
        out.append(to_segment(t))
    return out


class Population:
    """The PBT glue of one driver: schedules next segments, plans a segment's overrides, retains checkpoints."""

    def __init__(self, space: Space, study: optuna.Study, study_dir: Path, total: int,
                 note: Callable[[str], None] | None = None) -> None:
        self.space = space
        self.spec = space.study.pbt
        self.study = study
        self.study_dir = study_dir
        self.trials_dir = study_dir / "trials"
        self.total = total
        self.maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        self._seen_finished: set[int] = set()
        self.notes: list[str] = []  # the lines said (lost checkpoints, stopped members); also to ``note``
        self._note = note
        self._said: set[tuple[str, int]] = set()

    def say(self, key: tuple[str, int], line: str) -> None:
        """One line for the user, once per ``key`` in this driver."""
        if key in self._said:
            return
        self._said.add(key)
        self.notes.append(line)
        if self._note is not None:
            self._note(line)

    # ------------------------------------------------------------------ scheduling
    def schedule(self, trials: list[FrozenTrial]) -> bool:
        """Queue the initial population, and the next segment of every member that needs one; retain checkpoints
        when a segment finished since the last call. True when the population is done."""
        segs = segments_of(trials, self.space.study.max_retry)
        if not segs:
            rng = random.Random(self.spec.seed)  # the seed's design is TPE's / GP's start-up (hpo.samplers._startup)
            self.queue_initial(initial_population(self.space.params, self.spec.population, rng, self.spec.init))
            return False
        segs = self.audit(segs)
        done = True
        for m, seg in sorted(latest(segs).items()):
            if not seg.finished:
                done = False
                continue
            queued, segs = self._next(m, seg, segs)
            done = done and not queued
        finished = {s.number for s in segs if s.finished}
        if finished - self._seen_finished:
            self._seen_finished = finished
            self.retain(trials, segs)
        return done

    def audit(self, segs: list[Segment]) -> list[Segment]:
        """``segs`` as the disk has them (module docstring, lost checkpoints): a member's newest finished segment
        whose end checkpoint is unusable did not reach its end (one before the last step: a final one stays the
        member's result, its checkpoint reported gone); a failed newest segment whose start checkpoint is gone has
        none. One line per lost checkpoint."""
        out = {s.number: s for s in segs}
        for s in latest([s for s in segs if s.finished]).values():
            if not s.reached_end:
                continue
            why = checkpoint_problem(*end_checkpoint(self.space, self.trials_dir, s.number, s.end))
            if why is None:
                continue
            self.say(("end", s.number), f"pbt: member {s.member}: the checkpoint of trial {s.number} (step {s.end}) "
                     f"is lost: {why}" + ("" if s.end < self.total else " (its final segment: kept as its result)"))
            if s.end < self.total:
                out[s.number] = dataclasses.replace(s, reached_end=False)
        for s in latest(segs).values():
            s = out[s.number]
            if s.finished and not s.reached_end and s.checkpoint is not None:
                why = copy_problem(s.checkpoint)
                if why is not None:
                    self.say(("start", s.number), f"pbt: member {s.member}: the start checkpoint of trial "
                             f"{s.number} (step {s.start}) is lost: {why}")
                    out[s.number] = dataclasses.replace(s, checkpoint=None)
        return [out[s.number] for s in segs]

    def _next(self, member: int, seg: Segment, segs: list[Segment]) -> tuple[bool, list[Segment]]:
        """Decide and queue ``member``'s next segment after its finished ``seg``: (queued, the segments as now
        known). A checkpoint found unusable while queueing is lost (a failed source, a missing start checkpoint)
        and the member decides again; each time one checkpoint fewer is left, so this ends."""
        seg = next(s for s in segs if s.number == seg.number)  # as an earlier member's decision left it
        for _ in range(2 * len(segs) + 2):
            d = decide(seg, segs, self.space.params, self.spec, self.total, self.maximize,
                       random.Random(f"pbt:{self.spec.seed}:{seg.number}"))
            if d is None:
                if not (seg.reached_end and seg.end >= self.total):
                    what = f"collapsed:{seg.collapse}" if seg.collapse else "ended without a usable checkpoint"
                    self.say(("stop", member), f"pbt: member {member} stops at step {seg.start}: trial {seg.number} "
                             f"{what} ({seg.rollbacks} failed segment(s) before it) and no rollback, retry or healthy "
                             "member to exploit is left")
                return False, segs
            why = self._queue(member, seg.seq + 1, d, seg)
            if why is None:
                return True, segs
            start = d.checkpoint is not None  # its own start checkpoint (rollback, retry), else the source's end
            lost = seg.number if start or d.source is None else d.source
            self.say(("start" if start else "end", lost), f"pbt: member {member}: the checkpoint of trial {lost} for "
                     f"its {d.action} is lost: {why}")
            segs = [s if s.number != lost else dataclasses.replace(s, checkpoint=None) if start else
                    dataclasses.replace(s, reached_end=False) for s in segs]
            seg = next(s for s in segs if s.number == seg.number)
        return False, segs

    def queue_initial(self, values: list[dict[str, Any]]) -> None:
        """Queue the first segment of members 0..len(values)-1 with these parameters (by name)."""
        for m, v in enumerate(values):
            self._queue(m, 0, Decision("start", 0, min(self.spec.interval_steps, self.total), dict(v)), None)

    def _queue(self, member: int, seq: int, d: Decision, parent: Segment | None) -> str | None:
        """Queue one segment (its start checkpoint linked first); why not, when that checkpoint is unusable."""
        ckpt = d.checkpoint
        if ckpt is not None:  # a rollback or retry restarts from the failed segment's start checkpoint
            why = copy_problem(ckpt)
            if why is not None:
                return why
        elif d.source is not None:
            dst = self.study_dir / COPIES / f"m{member}-s{seq}-{uuid.uuid4().hex[:8]}" / step_name(self.space, d.start)
            try:
                link_checkpoint(*end_checkpoint(self.space, self.trials_dir, d.source, d.start), dst)
            except CheckpointUnusable as err:
                return str(err)
            ckpt = str(dst)
        system: dict[str, Any] = {
            A_MEMBER: member, A_SEQ: seq, A_GEN: d.start // self.spec.interval_steps, A_START: d.start, A_END: d.end,
            A_ACTION: d.action, A_PARENT: None if parent is None else parent.number, A_DONOR: d.donor,
            A_SOURCE: d.source, A_CHECKPOINT: ckpt, A_ROLLBACKS: d.rollbacks, A_WHY: d.why[:500]}
        self.study.add_trial(optuna.trial.create_trial(
            state=TrialState.WAITING, params=d.params,
            distributions={p.name: p.distribution() for p in self.space.params}, system_attrs=system))
        return None

    def is_surplus(self, frozen: FrozenTrial, trials: list[FrozenTrial]) -> bool:
        """A trial this strategy did not queue (a sampler's trial asked when the queue ran dry), or a duplicate
        of an earlier trial's ``(member, seq)`` (two drivers decided at once)."""
        if is_confirm(frozen):
            return False
        if not is_segment(frozen):
            return True
        key = (frozen.system_attrs[A_MEMBER], frozen.system_attrs[A_SEQ])
        mine = set(frozen.system_attrs.get(ATTR_RETRY_HISTORY, []))
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
    def retain(self, trials: list[FrozenTrial], segs: list[Segment] | None = None) -> float:
        """Delete the checkpoints no live lineage can reach (module docstring), and the copies finished segments
        resumed from; ``segs``: the segments as :meth:`audit` found them. Returns the GB freed."""
        segs = segs if segs is not None else segments_of(trials, self.space.study.max_retry)
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
                    for run in entry.glob(RUN_COPY + "*"):  # the copies of finished attempts: nobody resumes them
                        if run.is_dir() and not run.is_symlink() and run.name[len(RUN_COPY):].isdigit() \
                                and int(run.name[len(RUN_COPY):]) not in running:
                            freed += dir_bytes(run)
                            shutil.rmtree(run, ignore_errors=True)
                    continue
                referenced = any(s.checkpoint and Path(s.checkpoint).parent == entry for s in segs)
                if not referenced and now - entry.stat().st_mtime < ORPHAN_AGE_S:
                    continue  # a decision being queued right now
                freed += dir_bytes(entry)
                shutil.rmtree(entry, ignore_errors=True)
        return freed / 2**30


# ----------------------------------------------------------------------------- one segment's launch
def private_copy(start: Path, number: int) -> Path:
    """The checkpoint trial ``number`` resumes from: its own copy of the start checkpoint ``start`` (a reflink where
    the filesystem makes one), in ``trial-<number>/`` beside it. TrialFailed (one line) when ``start`` is
    unusable."""
    dst = start.parent / f"{RUN_COPY}{number}" / start.name
    shutil.rmtree(dst.parent, ignore_errors=True)
    try:
        clone_tree(start.parent, [start.name], dst, link=False)
    except CheckpointUnusable as err:
        raise TrialFailed(f"trial {number}: its start checkpoint is unusable: {err}") from None
    return dst


def segment_overrides(space: Space, system: dict[str, Any], trial: Trial) -> tuple[list[str], Path | None]:
    """A segment's trainer overrides (its last step and a checkpoint there: the backend's ``resumable.segments``)
    and its own copy of its start checkpoint (:func:`private_copy`), which the attempt resumes (``start``); its
    lineage becomes user attrs. TrialFailed, recorded in ``fail_reason`` / ``error``, when the start checkpoint is
    gone."""
    start, end, ckpt = int(system[A_START]), int(system[A_END]), system.get(A_CHECKPOINT)
    for k in (A_MEMBER, A_GEN, A_ACTION, A_PARENT, A_DONOR, A_CHECKPOINT, A_ROLLBACKS):
        trial.set_user_attr("pbt_" + k[len(P):], system.get(k))
    trial.set_user_attr("pbt_step_range", [start, end])
    if ckpt:
        try:
            ckpt = str(private_copy(Path(ckpt), trial.number))
        except TrialFailed as err:
            trial.set_user_attr("fail_reason", "checkpoint")
            trial.set_user_attr("error", str(err))
            raise
    resumable = backend_of(space).resumable
    if resumable is None or resumable.segments is None:
        raise SpaceError(f"{space.source}: study.strategy: pbt needs a trainer that resumes its checkpoints at a new "
                         f"setting; trial.backend {space.trial.backend} does not")
    return resumable.segments(space, end, ckpt or None)


# ----------------------------------------------------------------------------- confirming a schedule
def to_segment_like(t: FrozenTrial) -> bool:
    """A finished chain segment that ran to its end (no stop, no failure, its last step reached)."""
    u = t.user_attrs
    return (t.state == TrialState.COMPLETE and not u.get("stop_reason") and "fail_reason" not in u
            and u.get("last_step") == t.system_attrs.get(A_END))


# ----------------------------------------------------------------------------- reporting
def lineage_of(trials: list[FrozenTrial], number: int) -> list[Segment]:
    return lineage(segments_of(trials), number)


def best_final(study: optuna.Study, total: int | None = None) -> FrozenTrial | None:
    """The best healthy segment (it ran to its end with a value): among those that reached the members' last step
    (``total``, else the furthest end of any segment); while none has, among each member's newest finished
    segment (the population's current results). None when no member is healthy (every member's newest finished
    segment collapsed or failed: :func:`no_healthy_line` says why); a collapsed segment is never the best."""
    trials = study.get_trials(deepcopy=False)
    segs = segments_of(trials)
    if not segs:
        return None
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    end = total if total is not None else max(s.end for s in segs)
    final = [s for s in segs if s.finished and s.reached_end and s.value is not None and s.end >= end]
    final = final or ranked(segs, maximize)
    if not final:
        return None
    sign = -1.0 if maximize else 1.0
    best = min(final, key=lambda s: (sign * float(s.value), s.number))  # type: ignore[arg-type]
    return next(t for t in trials if t.number == best.number)


def no_healthy_line(study: optuna.Study, total: int) -> str:
    """One line: why a pbt study has no healthy result (each member's newest segment and how it ended)."""
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    segs = segments_of(trials)
    if not segs:
        return f"study {study.study_name!r} has no segment yet"
    parts = []
    for m, s in sorted(latest(segs).items()):
        t = by_number[s.number]
        how = (t.user_attrs.get("stop_reason") or t.user_attrs.get("fail_reason")
               or ("running" if not s.finished else "no value" if s.value is None else t.state.name.lower()))
        value = "" if s.value is None else f", value {s.value:.4g}"
        parts.append(f"member {m}: trial {s.number} ({s.action}, steps {s.start}-{s.end}{value}) {how}")
    healthy = ranked(segs, study.directions[0] == optuna.study.StudyDirection.MAXIMIZE)
    what = "no member is healthy" if not healthy else f"no member reached step {total} healthy yet"
    return f"study {study.study_name!r}: {what}; " + "; ".join(parts)


def schedule_of(trials: list[FrozenTrial], number: int) -> list[dict[str, Any]]:
    """The hyperparameter schedule (values by step range) of the lineage ending in trial ``number``."""
    return schedule(lineage_of(trials, number))


def pbt_total(space: Space) -> int:
    """The members' total trainer steps: ``study.pbt.total_steps``, else the config's."""
    if space.study.pbt.total_steps is not None:
        return int(space.study.pbt.total_steps)
    n = backend_of(space).configure(Attempt(space=space, trial_dir=Path("."))).total_steps
    if n is None:
        raise SpaceError(f"{space.source}: study.pbt.total_steps: needed (null), since the trainer's "
                         "trainer.total_training_steps is not among the overrides")
    return int(n)
