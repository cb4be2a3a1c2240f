"""A proxy search's target confirmation that uses the proxy's evidence (``study.fidelity.proxy``).

* **Promoted runs on the race's seed** (:func:`promoted_setup`): a promoted setting's short target run trains on the
  race's first confirmation seed (every seed key: :func:`hpo.study._confirm.seed_overrides`; not the held-out split,
  not the baseline; user attr ``promote_seed``) and, where the trainer can continue a run
  (``Backend.resumable.save_at``), also saves a checkpoint at ``promote_steps`` (verl_core ``trainer.save_freq``),
  which changes neither the run's length nor its math.
* **The race's field** (:func:`proxy_field`): when the proxy's check holds, at most ``study.fidelity.proxy.confirm_top``
  promoted settings in the proxy's order, those the proxy cannot tell apart: their proxy trials' final values within
  the check's resolution of the proxy's best (the target decides among them at full length; a proxy that separates
  its best races it alone), and beyond ``confirm_top`` the target's best at the promotion step when the target has
  the pick further behind it there than the proxy had (the check's ``unmeasured``: a catch-up the proxy never
  measured). When it does not hold, the race takes the top
  ``confirm.top_k`` target runs (:func:`top_k_race`), as a study without a proxy does.
* **Which candidates continue** (:func:`continued_runs`, the one rule for both fields): a candidate's first seed
  continues a promoted run when the candidate is that run, or (a failed check's field) has exactly its parameters
  (the target search sampled a promoted setting again). The race keeps them in its :data:`PROXY_RACE` entry
  (``continues``: a candidate that is its own promoted run as its number, another as ``[candidate, run]``;
  :func:`continued` reads it).
* **The continuation** (:func:`continue_setup`): such a first-seed run carries :data:`~hpo.record.ATTR_CONTINUES`
  (its promoted run) and continues that run's checkpoint through the backend's own resume path
  (``resume_overrides``, the earlier curve replayed as a retry's: the walk of
  :func:`hpo.backends._replay.resume_point`, which refuses links and special files and passes over a lost
  checkpoint), with the confirmation's own extras (the held-out split, no early stop). Its cost is then
  ``(full - step) / full`` of a run (:func:`hpo.record.steps_run` subtracts ``resumed_from_step``). Anything unusable
  (no checkpoint, a lost or refused file, another seed, a trainer that cannot continue) starts the run afresh with
  one line saying why (user attr ``continue_refused``).
* **Keeping the checkpoints** (:func:`held_checkpoints`): a promoted run's checkpoint at its stop stays (those its
  trainer saved after the stop reached it go: :func:`trim_promoted`) while a racing confirmation may still continue
  it (until the race's field is known: every promoted run after a failed check, the proxy's field after one that
  holds; then the runs its candidates continue, until their continuation finished), whatever
  ``trial.keep_checkpoints`` says, and go at the next trial's end once they cannot be used.
* **The budget** (:func:`hpo.study._confirm.confirm_reserve`): a held check's reserve counts the first seeds' shorter
  runs; a failed check's counts ``top_k`` full runs per seed, not knowing which candidates will continue (a
  continuation only costs less: the reserve stays on the safe side).
* :func:`proxy_race_line`: what happened, in one line, for ``confirm`` and ``best``; :func:`unused_top_line`: why
  ``confirm --top`` did not choose a held proxy's field.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.backends import Backend, ResumePointLike, backend_of, lost_checkpoints
from hpo.experiment import Space, SpaceError
from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_CONTINUES,
    ATTR_FIDELITY_CHECK,
    ATTR_RACE,
    is_confirm,
    is_promoted,
)
from hpo.samplers import proxy_value, unmeasured_setting
from hpo.study._checkpoints import chain, checkpoint_dirs
from hpo.study._confirm import confirm_seeds, seed_overrides, top_trials

PROXY_RACE = "proxy"  # ATTR_RACE's entry: {confirm_top, field, continues} (the proxy held), {continues} (not)


def can_continue(backend: Backend) -> bool:
    """The trainer saves at a given step and continues a run from a checkpoint."""
    return backend.resumable is not None and backend.resumable.save_at is not None


def first_seed(space: Space) -> int | None:
    """The race's first confirmation seed (None: the study has no fresh seed to give, e.g. no seed key)."""
    try:
        return confirm_seeds(space, 1)[0]
    except (SpaceError, ValueError):
        return None


def promoted_setup(trial: Trial, space: Space, backend: Backend, stop_at: int) -> tuple[dict[str, Any], list[str]]:
    """A promoted run's extras (the race's first seed on every seed key) and tail (the trainer's overrides that save
    a checkpoint at ``stop_at``; none where it cannot continue a run)."""
    seed = first_seed(space)
    extra: dict[str, Any] = {} if seed is None else dict(seed_overrides(space, seed))
    if seed is not None:
        trial.set_user_attr("promote_seed", seed)
    resumable = backend.resumable
    tail = list(resumable.save_at(stop_at)) if resumable is not None and resumable.save_at is not None else []
    return extra, tail


# ----------------------------------------------------------------------------- the race's field
def _sign(study: optuna.Study) -> float:
    return 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0


def proxy_field(study: optuna.Study, space: Space, check: dict[str, Any]) -> list[int]:
    """The promoted runs the race takes when the proxy held: the proxy's full-length order (the check's ``pairs``:
    proxy trial, target run, proxy value at the promotion step, target value there), those whose proxy trial's final
    value (its mean over the proxy's seeds where it had tie runs: :func:`~hpo.samplers.proxy_value`) is within the
    check's resolution of the proxy's best (settings the proxy cannot tell apart: the target
    decides among them at full length), at most ``confirm_top``; only runs still COMPLETE with a finite value. The
    promoted runs' short target values choose no one: they rank learning speed, which the check compared; except one
    the proxy could not vouch for (the check's ``unmeasured``: the target's best at the promotion step, ahead of the
    pick there by more on the target than on the proxy): the pick's catch-up on the target is not measured, so that
    setting joins the field, beyond ``confirm_top``, and the target decides."""
    proxy = space.study.fidelity.proxy
    pairs, res = check.get("pairs"), check.get("resolution")
    if proxy is None or not isinstance(pairs, list) or not isinstance(res, (int, float)):
        return []
    sign = _sign(study)
    all_trials = study.get_trials(deepcopy=False)
    trials = {t.number: t for t in all_trials}
    runs = {n for n, t in trials.items() if t.state == TrialState.COMPLETE}
    rows = []
    for p in pairs:
        if not (isinstance(p, list) and len(p) == 4 and all(isinstance(n, int) and not isinstance(n, bool)
                                                             for n in p[:2])
                and isinstance(p[3], (int, float)) and math.isfinite(p[3]) and p[1] in runs):
            continue
        source = trials.get(p[0])
        final = proxy_value(source, all_trials, sign) if source is not None and source.values else None
        if isinstance(final, (int, float)) and math.isfinite(final):
            rows.append((p[1], sign * float(final)))
    if not rows:
        return []
    best = max(v for _, v in rows)
    field = [n for n, v in rows if best - v <= float(res) + 1e-12][:proxy.confirm_top]
    found = unmeasured_setting(check)
    if found is not None and found["run"] in runs and found["run"] not in field:
        field.append(found["run"])
    return field


def continued_runs(study: optuna.Study, space: Space, candidates: Sequence[int]) -> dict[int, int]:
    """The promoted run each race candidate's first seed continues (candidate -> promoted run, the candidates' order):
    the candidate itself when it is a promoted run, else a promoted run with exactly its parameters; only promoted runs
    still COMPLETE, none where the trainer cannot continue a run. The run's seed and checkpoint are checked when the
    continuation starts (:func:`continuation`: a refusal starts the run afresh with one line)."""
    if not can_continue(backend_of(space)):
        return {}
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    promoted = sorted((t for t in trials.values() if is_promoted(t) and t.state == TrialState.COMPLETE),
                      key=lambda t: t.number)
    numbers = {t.number for t in promoted}
    out: dict[int, int] = {}
    for c in candidates:
        t = trials.get(c)
        run = None if t is None else c if c in numbers else next(
            (p.number for p in promoted if p.params == t.params), None)
        if run is not None:
            out[c] = run
    return out


def continued(entry: Any) -> dict[int, int]:
    """The race's :data:`PROXY_RACE` entry's ``continues`` as candidate -> promoted run ({} for anything else: the
    study's record is read, never trusted)."""
    found = entry.get("continues") if isinstance(entry, dict) else None
    out: dict[int, int] = {}
    for item in found if isinstance(found, list) else []:
        pair = [item, item] if not isinstance(item, list) else item
        if len(pair) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in pair):
            out[pair[0]] = pair[1]
    return out


def _continues(runs: dict[int, int]) -> list[Any]:
    """:func:`continued`'s stored form."""
    return [c if r == c else [c, r] for c, r in runs.items()]


def proxy_race(study: optuna.Study, space: Space) -> dict[str, Any] | None:
    """The race's field when the proxy held (``{confirm_top, field, continues}``: continues, the candidates whose
    first seed continues their promoted run), None otherwise (no proxy, no check yet, a failed check)."""
    check = study.user_attrs.get(ATTR_FIDELITY_CHECK)
    proxy = space.study.fidelity.proxy
    if proxy is None or not isinstance(check, dict) or check.get("holds") is not True:
        return None
    field = proxy_field(study, space, check)
    if not field:
        return None
    return {"confirm_top": proxy.confirm_top, "field": field,
            "continues": _continues(continued_runs(study, space, field))}


def top_k_race(study: optuna.Study, space: Space, top_k: int) -> tuple[list[int], dict[str, Any] | None]:
    """A race the proxy did not choose (a failed check's fallback, or a study without a proxy): its field, the top
    ``top_k`` target runs, and for a proxy search whose field holds promoted settings (:func:`continued_runs`) its
    :data:`PROXY_RACE` entry (``{continues}``; None when none continues: every seed runs from scratch)."""
    field = [t.number for t in top_trials(study, top_k)]
    runs = continued_runs(study, space, field) if space.study.fidelity.proxy is not None else {}
    return field, ({"continues": _continues(runs)} if runs else None)


# ----------------------------------------------------------------------------- the continuation
def _promoted_run(study: optuna.Study, number: Any) -> FrozenTrial | None:
    if not isinstance(number, int) or isinstance(number, bool):
        return None
    return next((t for t in study.get_trials(deepcopy=False) if t.number == number and is_promoted(t)), None)


def continuation(study: optuna.Study, trials_dir: Path, backend: Backend, system: dict[str, Any]
                 ) -> tuple[ResumePointLike | None, str | None]:
    """Where a confirmation run that continues a promoted run (``system``: its system attrs) starts: (the promoted
    run's checkpoint and the curve up to it, None) or (None, why it starts afresh)."""
    number = system.get(ATTR_CONTINUES)
    resumable = backend.resumable
    if resumable is None or resumable.save_at is None:
        return None, f"trial.backend {backend.name} cannot continue a run from a checkpoint"
    run = _promoted_run(study, number)
    if run is None:
        return None, f"promoted run {number!r} is not in the study"
    seed, ran = system.get(ATTR_CONFIRM_SEED), run.user_attrs.get("promote_seed")
    if ran != seed:
        return None, f"promoted run {run.number} ran on seed {ran}, not {seed}"
    with lost_checkpoints() as lost:
        point = resumable.resume_point(trials_dir, chain(run), backend.metrics_path)
    if point is None:
        why = lost[0].rsplit("; the retry ", 1)[0] if lost else f"promoted run {run.number} left no checkpoint"
        return None, why
    if point.step <= 0:
        return None, f"promoted run {run.number}'s checkpoint is at step {point.step}"
    return point, None


def continue_setup(trial: Trial, study: optuna.Study, trials_dir: Path, backend: Backend, system: dict[str, Any],
                   note: Callable[[str], None]) -> ResumePointLike | None:
    """A confirmation run's continuation of its promoted run (:func:`continuation`), recorded on the trial (user attr
    ``continued_from``, or ``continue_refused`` and one line); None when it starts afresh."""
    if ATTR_CONTINUES not in system:
        return None
    point, why = continuation(study, trials_dir, backend, system)
    if point is not None:
        trial.set_user_attr("continued_from", {"run": system[ATTR_CONTINUES], "step": point.step})
        return point
    trial.set_user_attr("continue_refused", why)
    note(f"trial {trial.number}: seed {system.get(ATTR_CONFIRM_SEED)} of trial {system.get(ATTR_CONFIRM_OF)} starts "
         f"afresh instead of continuing its promoted run: {why}")
    return None


# ----------------------------------------------------------------------------- keeping the checkpoints
def trim_promoted(run: FrozenTrial, trials_dir: Path, backend: Backend) -> None:
    """A promoted run's checkpoints after the step it stopped at go (its trainer went on training, and saving at each
    multiple of ``promote_steps``, until the stop reached it): the race continues the run where it was measured, the
    newest checkpoint at or before its last reported evaluation. Only inside a trial directory the driver made; a
    symbolic link is removed, never followed."""
    resumable = backend.resumable
    if resumable is None or not run.intermediate_values:
        return
    stop = max(run.intermediate_values)
    for ckpts in checkpoint_dirs(trials_dir, chain(run)):
        try:
            entries = list(os.scandir(ckpts))
        except OSError:
            continue
        for entry in entries:
            step = resumable.layout.step_of(Path(entry.path))
            if step is None or step <= stop:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def held_checkpoints(study: optuna.Study, space: Space, trials: Sequence[FrozenTrial], finishing: int
                     ) -> tuple[set[int], list[FrozenTrial]]:
    """(trial numbers whose checkpoints stay: the promoted runs a racing confirmation may still continue, with their
    retry chains; the promoted runs whose checkpoints may go now). Until the race's field is known: the proxy's field
    after a check that holds, every promoted run before the check and after one that fails (a target search may rank
    any promoted setting in its top ``top_k``); then the runs its candidates continue, until their continuation
    finished. ``finishing``: the trial about to be told (its state is still RUNNING in the storage)."""
    promoted = [t for t in trials if is_promoted(t)]
    if space.study.fidelity.proxy is None or not promoted:
        return set(), []
    if not can_continue(backend_of(space)) or not space.study.confirm.race:  # nothing will continue them
        return set(), promoted
    check = study.user_attrs.get(ATTR_FIDELITY_CHECK)
    race = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    if isinstance(race, dict):  # the field is known: the promoted runs its first seeds continue
        wanted = set(continued(race.get(PROXY_RACE)).values())
    elif isinstance(check, dict) and check.get("holds") is True:  # the proxy's field, to be raced
        wanted = set(proxy_field(study, space, check))
    else:  # before the check, or a failed check's target search: any of them may be in the field
        wanted = {t.number for t in promoted}
    wanted -= {t.system_attrs.get(ATTR_CONTINUES) for t in trials if is_confirm(t) and (
        t.number == finishing or t.state in (TrialState.COMPLETE, TrialState.PRUNED))}
    held = [t for t in promoted if t.number in wanted]
    return {n for t in held for n in chain(t)}, [t for t in promoted if t.number not in wanted]


# ----------------------------------------------------------------------------- what happened, in one line
def unused_top_line(study: optuna.Study, top: int) -> str | None:
    """Why ``confirm --top TOP`` is not used, one line: the race is the held proxy's (:func:`proxy_race`), whose field
    ``study.fidelity.proxy.confirm_top`` bounds; None when the race took ``--top`` (or there is no race)."""
    race = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    entry = race.get(PROXY_RACE) if isinstance(race, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("field"), list) or not entry["field"]:
        return None
    field = entry["field"]
    return (f"--top {top} is not used: the proxy's check held, so the race takes the proxy's field (the promoted "
            "settings it cannot tell apart: within the check's resolution of its best, in its order, at most "
            f"study.fidelity.proxy.confirm_top = {entry.get('confirm_top')}): {len(field)} setting(s)")


def proxy_race_line(study: optuna.Study, space: Space) -> str | None:
    """How the proxy shaped the race, one line (None: no proxy, or no race yet): the field (the proxy's, or a failed
    check's top ``top_k``) and what became of each first seed that continues a promoted run."""
    if space.study.fidelity.proxy is None:
        return None
    race = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    if not isinstance(race, dict):
        return None
    entry = race.get(PROXY_RACE)
    entry = entry if isinstance(entry, dict) else {}
    runs = continued(entry)
    field = entry.get("field")
    if not isinstance(field, list) or not field:  # a failed check: the top_k target settings
        field = race.get("candidates")
        field = field if isinstance(field, list) else []
        out = (f"proxy race: the proxy did not hold: the target race runs the top {len(field)} target setting(s)"
               f"{'' if runs else ' from scratch'} (study.confirm.top_k)")
    else:
        found = unmeasured_setting(study.user_attrs.get(ATTR_FIDELITY_CHECK))
        top = entry.get("confirm_top")
        # appended by proxy_field beyond confirm_top, not one of the settings the proxy could not tell apart
        extra = found["run"] if found is not None and field[-1] == found["run"] and isinstance(top, int) \
            and len(field) > top else None
        tied = len(field) - (extra is not None)
        who = ("its best setting" + ("" if extra is not None else " alone")) if tied == 1 else \
            f"{tied} promoted settings it cannot tell apart (within the resolution of its best)"
        if extra is not None:
            who += (f" and trial {extra}, the target's best at the promotion step, further ahead of the pick there "
                    "on the target than on the proxy")
        out = f"proxy race: the proxy held: the target race runs {who} (confirm_top {entry.get('confirm_top')})"
        if not runs:
            out += f"; every seed runs in full (trial.backend {space.trial.backend} cannot continue a run)"
    firsts = {t.system_attrs.get(ATTR_CONFIRM_OF): t for t in sorted(study.get_trials(deepcopy=False),
                                                                      key=lambda t: t.number)
              if is_confirm(t) and ATTR_CONTINUES in t.system_attrs}
    seed = first_seed(space)
    for c, n in runs.items():
        run = firsts.get(c)
        who = "" if len(field) == 1 else f" of trial {c}"
        done = run.user_attrs.get("continued_from") if run is not None else None
        refused = run.user_attrs.get("continue_refused") if run is not None else None
        if isinstance(refused, str):
            out += f"; seed {seed}{who} started afresh: {refused}"
        else:
            step = done.get("step") if isinstance(done, dict) else study.user_attrs.get(ATTR_FIDELITY_CHECK, {}).get(
                "steps")
            verb = "continues" if run is None or run.state in (TrialState.WAITING, TrialState.RUNNING) else "continued"
            whose = "its" if n == c else "its setting's"
            out += f"; seed {seed}{who} {verb} {whose} promoted run (trial {n}) from step {step}"
    return out
