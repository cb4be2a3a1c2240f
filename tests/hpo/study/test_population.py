"""PBT segments as trials of a real Optuna study (SQLite): queueing, lineage, checkpoint copies, retention and
duplicates, with the trainer's part (a segment's run and its checkpoint) played by the test."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from hpo.backends import load_space
from hpo.experiment._space import Space
from hpo.study._checkpoints import TRIAL_MARKER
from hpo.study._population import (
    A_ACTION,
    A_CHECKPOINT,
    A_DONOR,
    A_END,
    A_MEMBER,
    A_PARENT,
    A_SEQ,
    A_SOURCE,
    Population,
    best_final,
    schedule_of,
    segment_overrides,
)
from hpo.study._schedules import queue_schedule_confirmations
from tests.hpo.conftest import write

SPACE = """\
config: tiny_arith
overrides: {trainer.total_training_steps: 30, trainer.test_freq: 10}
params:
  lr: {key: actor_rollout_ref.actor.optim.lr, type: float, low: 1.0e-6, high: 1.0e-3, log: true}
  kl: {key: algorithm.kl_ctrl.kl_coef, type: float, low: 0.01, high: 1.0, log: true}
objective: {metric: eval/reward_mean, direction: maximize}
study:
  strategy: pbt
  pbt: {population: 4, interval_steps: 10, resample_probability: 0.0}
"""


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Space, optuna.Study, Population]:
    space = load_space(str(write(tmp_path / "pbt.yaml", SPACE)), check=False)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="p", storage=f"sqlite:///{tmp_path}/p.db", direction="maximize")
    pop = Population(space, study, tmp_path / "p", 30)
    return space, study, pop


def run_waiting(study: optuna.Study, pop: Population, values: dict[int, float | None],
                stop: dict[int, str] | None = None, after: Callable[[Path], None] | None = None,
                members: set[int] | None = None) -> list[int]:
    """Run every queued segment as a trainer would: a checkpoint at its end (unless it stopped), its value; then
    ``after(checkpoints dir)`` (for ``members``, default all: a trial turning on its checkpoint)."""
    ran = []
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = study.ask()
        sys_ = study._storage.get_trial(trial._trial_id).system_attrs
        member, end = sys_[A_MEMBER], sys_["pbt:end"]
        for p in pop.space.params:
            trial.suggest_float(p.name, p.low, p.high, log=p.log)  # type: ignore[arg-type]
        d = pop.trials_dir / str(trial.number)
        d.mkdir(parents=True)
        (d / TRIAL_MARKER).write_text("{}\n")
        trial.set_user_attr("trial_dir", str(d))
        why = (stop or {}).get(member)
        if why is None:
            ck = d / "checkpoints" / f"global_step_{end}"
            ck.mkdir(parents=True)
            (ck / "state.pt").write_bytes(b"x" * 4096)
            trial.set_user_attr("last_step", end)
            if after is not None and (members is None or member in members):
                after(ck.parent)
        else:
            trial.set_user_attr("stop_reason", why)
            trial.set_user_attr("last_step", sys_["pbt:start"] + 1)
        v = values.get(member)
        if v is not None:
            trial.report(v, end if why is None else sys_["pbt:start"] + 1)
        study.tell(trial, v if v is not None else float("-inf"))
        ran.append(trial.number)
    return ran


def attrs(study: optuna.Study, number: int) -> dict[str, Any]:
    return study.trials[number].system_attrs


def test_a_population_runs_exploits_and_frees_unreachable_checkpoints(setup: tuple[Space, optuna.Study,
                                                                               Population]) -> None:
    space, study, pop = setup
    assert pop.schedule(study.get_trials()) is False
    assert pop.schedule(study.get_trials()) is False  # nothing new while the first segments wait
    first = study.get_trials()
    assert len(first) == 4 and {t.system_attrs[A_MEMBER] for t in first} == {0, 1, 2, 3}
    assert all(t.state == TrialState.WAITING and t.system_attrs[A_CHECKPOINT] is None for t in first)
    assert len({tuple(sorted(t.params.items())) for t in first}) == 4  # drawn from the space

    run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9})
    assert pop.schedule(study.get_trials()) is False
    second = {t.system_attrs[A_MEMBER]: t for t in study.get_trials() if t.number >= 4}
    assert second[0].system_attrs[A_ACTION] == "exploit" and second[0].system_attrs[A_DONOR] == 3
    assert second[0].system_attrs[A_SOURCE] == 3 and second[0].system_attrs[A_PARENT] == 0
    assert second[0].params != study.trials[3].params
    for m in (1, 2, 3):
        assert second[m].system_attrs[A_ACTION] == "continue" and second[m].params == study.trials[m].params
    copy = Path(second[0].system_attrs[A_CHECKPOINT])
    donor_state = pop.trials_dir / "3" / "checkpoints" / "global_step_10" / "state.pt"
    assert copy.name == "global_step_10" and copy.parent.parent == pop.study_dir / "pbt"
    assert os.stat(copy / "state.pt").st_ino == os.stat(donor_state).st_ino  # a hard link, not a copy

    foreign = pop.trials_dir / "99" / "checkpoints"  # not the driver's: never deleted
    foreign.mkdir(parents=True)
    run_waiting(study, pop, {0: 0.95, 1: 0.4, 2: 0.7, 3: 0.8})
    assert pop.schedule(study.get_trials()) is False
    for n in range(4):  # superseded: gone (the copies hold their own links)
        assert not (pop.trials_dir / str(n) / "checkpoints").exists(), n
    assert all((pop.trials_dir / str(n) / "checkpoints").is_dir() for n in range(4, 8))
    assert not copy.exists()  # its segment reached its end: nobody restarts from it
    assert foreign.is_dir()

    run_waiting(study, pop, {0: 0.97, 1: 0.5, 2: 0.72, 3: 0.81})
    assert pop.schedule(study.get_trials()) is True  # every member at step 30
    best = best_final(study)
    assert best is not None and best.system_attrs[A_MEMBER] == 0 and best.values == [0.97]
    sched = schedule_of(study.get_trials(), best.number)
    assert [(s["start"], s["end"]) for s in sched] == [(0, 10), (10, 30)]
    assert sched[0]["params"] == study.trials[3].params  # member 0's lineage goes through the donor's segment
    left = sorted(int(p.parent.parent.name) for p in pop.study_dir.rglob("global_step_*"))
    assert left == list(range(8, 12))  # only the members' final checkpoints remain


def test_collapse_rolls_back_from_the_copy_it_started_from(setup: tuple[Space, optuna.Study, Population]) -> None:
    _, study, pop = setup
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.8})
    pop.schedule(study.get_trials())
    m3 = next(t for t in study.get_trials() if t.number >= 4 and t.system_attrs[A_MEMBER] == 3)
    run_waiting(study, pop, {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.1}, stop={3: "collapsed:kl_blowup"})
    pop.schedule(study.get_trials())
    back = next(t for t in study.get_trials() if t.system_attrs[A_MEMBER] == 3 and t.system_attrs[A_SEQ] == 2)
    assert back.system_attrs[A_ACTION] == "rollback"
    assert back.system_attrs[A_CHECKPOINT] == m3.system_attrs[A_CHECKPOINT]
    assert (back.system_attrs["pbt:start"], back.system_attrs["pbt:end"]) == (10, 20)
    assert back.params["lr"] == pytest.approx(max(m3.params["lr"] * 0.5, 1e-6))  # clipped to the range
    assert back.params["kl"] == pytest.approx(min(m3.params["kl"] * 2, 1.0))
    assert (Path(back.system_attrs[A_CHECKPOINT]) / "state.pt").is_file()  # kept: the rollback needs it


def test_duplicates_and_foreign_trials_are_surplus(setup: tuple[Space, optuna.Study, Population]) -> None:
    _, study, pop = setup
    pop.schedule(study.get_trials())
    pop.queue_initial([{"lr": 1e-4, "kl": 0.1}])  # a second driver deciding member 0's first segment too
    trials = study.get_trials()
    assert not pop.is_surplus(trials[0], trials)
    assert pop.is_surplus(trials[4], trials)
    study.enqueue_trial({"lr": 1e-4, "kl": 0.1})  # not a segment (a sampler's trial)
    trials = study.get_trials()
    assert pop.is_surplus(trials[5], trials)


def test_clone_tree_links_or_copies_and_leaves_nothing_half_made(tmp_path: Path) -> None:
    from hpo.study._checkpoints import CheckpointUnusable, clone_tree

    src = tmp_path / "a" / "global_step_3"
    (src / "actor").mkdir(parents=True)
    (src / "actor" / "w.bin").write_bytes(b"w")
    for link, name in ((True, "b"), (False, "c")):
        dst = tmp_path / name / "global_step_3"
        clone_tree(tmp_path / "a", ["global_step_3"], dst, link=link)
        assert (dst / "actor" / "w.bin").read_bytes() == b"w"
        same = os.stat(dst / "actor" / "w.bin").st_ino == os.stat(src / "actor" / "w.bin").st_ino
        assert same is link
    with pytest.raises(CheckpointUnusable, match="is gone"):
        clone_tree(tmp_path, ["missing"], tmp_path / "d" / "x", link=True)
    os.mkfifo(src / "actor" / "pipe")  # a special file would hang the copy
    with pytest.raises(CheckpointUnusable, match="pipe is not a regular file"):
        clone_tree(tmp_path / "a", ["global_step_3"], tmp_path / "e" / "global_step_3", link=False)
    assert not list((tmp_path / "e").iterdir()) and not (tmp_path / "d").exists()


def test_confirming_a_schedule_reruns_it_from_scratch_with_fresh_seeds(
        setup: tuple[Space, optuna.Study, Population]) -> None:
    from hpo.study._confirm import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, confirmed
    from hpo.study._population import A_INDEX
    from hpo.study._schedules import queue_schedule_confirmations, schedule_confirms

    space, study, pop = setup
    pop.schedule(study.get_trials())
    for values in ({0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9}, {0: 0.95, 1: 0.4, 2: 0.7, 3: 0.8},
                   {0: 0.97, 1: 0.5, 2: 0.72, 3: 0.81}):
        run_waiting(study, pop, values)
        pop.schedule(study.get_trials())
    best = best_final(study)
    assert best is not None
    sched = schedule_of(study.get_trials(), best.number)
    queued = queue_schedule_confirmations(study, space, top_k=1, n_seeds=2)
    assert [n for n, _ in queued] == [best.number, best.number] and queued[0][1] != queued[1][1]
    assert queue_schedule_confirmations(study, space, top_k=1, n_seeds=2) == []  # already queued: nothing more
    chain0 = [t for t in study.get_trials() if t.system_attrs.get(A_INDEX) == 0]
    assert all(t.params == sched[0]["params"] and t.system_attrs["pbt:checkpoint"] is None for t in chain0)

    def run_confirms(value: float) -> None:
        while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            trial = study.ask()
            s = study._storage.get_trial(trial._trial_id).system_attrs
            d = pop.trials_dir / str(trial.number)
            ck = d / "checkpoints" / f"global_step_{s['pbt:end']}"
            ck.mkdir(parents=True)
            (d / TRIAL_MARKER).write_text("{}\n")
            (ck / "state.pt").write_bytes(b"y")
            trial.set_user_attr("trial_dir", str(d))
            trial.set_user_attr("last_step", s["pbt:end"])
            study.tell(trial, value + s[ATTR_CONFIRM_SEED] / 10_000)
            schedule_confirms(study, space, pop.study_dir, study.get_trials())

    run_confirms(0.9)
    runs = [t for t in study.get_trials() if t.system_attrs.get(ATTR_CONFIRM_OF) == best.number]
    assert len(runs) == 2 * len(sched)
    nexts = [t for t in runs if t.system_attrs[A_INDEX] == 1]
    assert all(t.system_attrs["pbt:start"] == sched[1]["start"] and t.params == sched[1]["params"] for t in nexts)
    assert all(Path(t.system_attrs["pbt:checkpoint"]).name == f"global_step_{sched[0]['end']}" for t in nexts)
    top = confirmed(study)[0]
    assert top.trial.number == best.number and top.n == 2  # the chains' last segments only
    assert not [p for p in pop.trials_dir.glob("*/checkpoints") if int(p.parent.name) in {t.number for t in runs}]


@pytest.mark.parametrize("seed", [0, 7])
def test_the_initial_population_is_the_samplers_start_up_design(setup: tuple[Space, optuna.Study, Population],
                                                                 seed: int) -> None:
    """With init lhs, PBT's first segments take the Latin hypercube TPE and GP start from for the same seed (and
    n_startup_trials = population): a PBT study and a sampler study of one seed start from the same points."""
    import dataclasses

    from hpo.samplers._startup import LatinStartSampler

    space, study, pop = setup
    pop.spec = dataclasses.replace(pop.spec, seed=seed)
    pop.schedule(study.get_trials(deepcopy=False))
    firsts = sorted(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)),
                    key=lambda t: t.system_attrs[A_MEMBER])
    assert [t.system_attrs[A_SEQ] for t in firsts] == [0] * 4
    got = [dict(t.params or t.system_attrs["fixed_params"]) for t in firsts]

    def same(design: list[dict[str, Any]]) -> bool:
        return all(g.keys() == d.keys() and all(g[k] == pytest.approx(d[k]) for k in d) for g, d in zip(got, design))

    assert same(LatinStartSampler(optuna.samplers.RandomSampler(), space.params, 4, seed).design)
    assert not same(LatinStartSampler(optuna.samplers.RandomSampler(), space.params, 4, seed + 1).design)


# ----------------------------------------------------------------------------- hostile trials (issue 34)
def _moved_outside(ck: Path) -> None:
    """``checkpoints/`` becomes a link to a directory of the trial's choosing holding the same checkpoint."""
    outside = ck.parents[3] / "outside" / ck.parent.name
    shutil.move(str(ck), str(outside))
    ck.symlink_to(outside)


TAMPER: dict[str, Callable[[Path], None]] = {
    "deleted": shutil.rmtree,
    "a link to /etc": lambda ck: (shutil.rmtree(ck), ck.symlink_to("/etc")),  # type: ignore[func-returns-value]
    "a link to its own directory": _moved_outside,
    "a link inside": lambda ck: next(ck.iterdir()).joinpath("passwd").symlink_to("/etc/passwd"),
}


def files(root: Path, skip: str = "") -> dict[str, str]:
    """Every file below ``root`` (no link followed; ``skip``: a directory name left out) by its bytes' hash."""
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not (skip and d.startswith(skip))]
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("how", list(TAMPER))
def test_a_lost_checkpoint_is_never_used_and_never_stalls_its_member(
        setup: tuple[Space, optuna.Study, Population], how: str) -> None:
    """Members 1 and 3 lose their step-10 checkpoints after their segment finished: at the next schedule every
    member goes on at once, none from a lost checkpoint (1 and 3 exploit the healthy top member, 0 exploits it as
    the bottom one), one line per lost checkpoint, and nothing of the trial's choosing enters the studies dir."""
    _, study, pop = setup
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9}, after=TAMPER[how], members={1, 3})
    assert pop.schedule(study.get_trials()) is False
    nxt = {t.system_attrs[A_MEMBER]: t for t in study.get_trials() if t.number >= 4}
    assert sorted(nxt) == [0, 1, 2, 3]
    assert {m: (t.system_attrs[A_ACTION], t.system_attrs[A_SOURCE]) for m, t in nxt.items()} == {
        0: ("exploit", 2), 1: ("exploit", 2), 2: ("continue", 2), 3: ("exploit", 2)}
    assert len(pop.notes) == 2 and all("is lost" in n for n in pop.notes), pop.notes
    assert {int(n.split("trial ")[1].split()[0]) for n in pop.notes} == {1, 3}
    assert all(("is gone" if how == "deleted" else "is a symbolic link") in n for n in pop.notes), pop.notes
    assert pop.schedule(study.get_trials()) is False and len(study.get_trials()) == 8 and len(pop.notes) == 2
    copies = [p for p in (pop.study_dir / "pbt").rglob("*")]
    assert copies and not [p for p in copies if p.is_symlink()]
    outside = pop.study_dir.parent / "outside"
    if outside.exists():
        mine = {os.lstat(p).st_ino for p in outside.rglob("*")}
        assert not mine & {os.lstat(p).st_ino for p in copies}


def test_when_every_checkpoint_is_lost_the_population_still_ends(setup: tuple[Space, optuna.Study,
                                                                               Population]) -> None:
    """A trainer that deletes its checkpoint after every segment: each member retries its first interval while
    it has rollbacks left (2), then stops with a line; no more segments than a healthy population runs."""
    _, study, pop = setup
    for _ in range(8):
        if pop.schedule(study.get_trials()):
            break
        run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9}, after=shutil.rmtree)
    else:
        pytest.fail(f"the population never ended: {len(study.get_trials())} segments, notes {pop.notes[-3:]}")
    trials = study.get_trials()
    assert len(trials) == 4 * 3 and all(t.system_attrs["pbt:start"] == 0 for t in trials)
    assert sum("is lost" in n for n in pop.notes) == 12 and sum("stops at step 0" in n for n in pop.notes) == 4


def test_each_segment_resumes_from_a_copy_of_its_own(setup: tuple[Space, optuna.Study, Population]) -> None:
    """A trainer that rewrites the checkpoint it resumed from, in place, changes no other checkpoint (the donor's,
    the other members' start checkpoints, the trials' own), and a rollback restarts from the start checkpoint as
    it was saved."""
    space, study, pop = setup
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9})
    pop.schedule(study.get_trials())
    before = files(pop.study_dir)
    resumed = {}
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = study.ask()
        system = study._storage.get_trial(trial._trial_id).system_attrs
        overrides, path = segment_overrides(space, system, trial)  # its step range; the copy it resumes from
        assert path is not None and f"trainer.total_training_steps={system[A_END]}" in overrides
        for f in path.rglob("*"):
            if f.is_file():
                with open(f, "r+b") as fh:
                    fh.write(b"rewritten")
        resumed[system[A_MEMBER]] = (trial, system, path)
    assert len(resumed) == 4 and files(pop.study_dir, skip="trial-") == before
    for _, system, path in resumed.values():
        assert path != Path(system[A_CHECKPOINT]) and path.name == "global_step_10"
        assert all(os.stat(f).st_nlink == 1 for f in path.rglob("*") if f.is_file())  # a copy, not a link
    for m, (trial, _, _) in resumed.items():  # member 3 collapses; the others run to step 20
        d = pop.trials_dir / str(trial.number)
        (d / "checkpoints" / "global_step_20").mkdir(parents=True)
        (d / "checkpoints" / "global_step_20" / "state.pt").write_bytes(b"y")
        trial.set_user_attr("last_step", 11 if m == 3 else 20)
        if m == 3:
            shutil.rmtree(d / "checkpoints")
            trial.set_user_attr("stop_reason", "collapsed:nan")
        study.tell(trial, 0.5)
    pop.schedule(study.get_trials())
    back = next(t for t in study.get_trials() if t.system_attrs.get(A_ACTION) == "rollback")
    assert back.system_attrs[A_CHECKPOINT] == resumed[3][1][A_CHECKPOINT]
    while (trial := study.ask()).number != back.number:  # the continues queued before it
        pass
    _, path = segment_overrides(space, back.system_attrs, trial)
    assert path is not None and (path / "state.pt").read_bytes() == b"x" * 4096
    assert not (Path(resumed[3][1][A_CHECKPOINT]).parent / f"trial-{resumed[3][0].number}").exists()  # retained


def test_a_segment_whose_start_checkpoint_is_gone_fails_with_one_line(
        setup: tuple[Space, optuna.Study, Population]) -> None:
    from hpo.study._errors import TrialFailed

    space, study, pop = setup
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9})
    pop.schedule(study.get_trials())
    trial = study.ask()
    system = study._storage.get_trial(trial._trial_id).system_attrs
    shutil.rmtree(Path(system[A_CHECKPOINT]))
    with pytest.raises(TrialFailed, match="start checkpoint is unusable: .*global_step_10 is gone"):
        segment_overrides(space, system, trial)
    assert study._storage.get_trial(trial._trial_id).user_attrs["fail_reason"] == "checkpoint"


def test_when_every_member_collapsed_there_is_no_best_and_nothing_to_confirm(
        setup: tuple[Space, optuna.Study, Population]) -> None:
    """Healthy first segments, then every member collapses until no rollback is left: no best (a collapsed
    segment's values are never recommended), one line saying why, and confirm refuses."""
    from hpo.reporting._pbt import best_lineage

    space, study, pop = setup
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9})
    for _ in range(8):
        if pop.schedule(study.get_trials()):
            break
        run_waiting(study, pop, {0: 0.02, 1: 0.01, 2: 0.03, 3: 0.04}, stop={m: "collapsed:nan" for m in range(4)})
    else:
        pytest.fail("the population never ended")
    assert best_final(study, 30) is None and best_final(study) is None and best_lineage(space, study) is None
    from hpo.reporting._pbt import why_no_best
    from hpo.study._population import NoHealthyMember, no_healthy_line

    line = no_healthy_line(study, 30)
    assert line == why_no_best(space, study) and "\n" not in line
    assert "no member is healthy" in line and line.count("collapsed:nan") == 4
    with pytest.raises(NoHealthyMember, match="no member is healthy"):
        queue_schedule_confirmations(study, space, 1, 1)


def test_best_shows_no_checkpoint_a_link_leads_to(setup: tuple[Space, optuna.Study, Population]) -> None:
    from hpo.reporting._pbt import best_lineage, render_pbt_best

    space, study, pop = setup
    pop.schedule(study.get_trials())
    for values in ({0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9}, {0: 0.95, 1: 0.4, 2: 0.7, 3: 0.8},
                   {0: 0.97, 1: 0.5, 2: 0.72, 3: 0.81}):
        run_waiting(study, pop, values)
        pop.schedule(study.get_trials())
    found = best_lineage(space, study)
    assert found is not None and Path(found["checkpoint"]).is_dir()
    _moved_outside(Path(found["checkpoint"]).parent)
    found = best_lineage(space, study)
    assert found is not None and found["checkpoint"] is None and "is a symbolic link" in found["checkpoint_problem"]
    header, command = render_pbt_best(space, found, "command")
    assert "checkpoint none (" in header and "resume_from_path" not in command and "outside" not in command
