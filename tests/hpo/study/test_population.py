"""PBT segments as trials of a real Optuna study (SQLite): queueing, lineage, checkpoint copies, retention and
duplicates, with the trainer's part (a segment's run and its checkpoint) played by the test."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from hpo.experiment._space import Space, load_space
from hpo.study._checkpoints import TRIAL_MARKER
from hpo.study._population import (
    A_ACTION,
    A_CHECKPOINT,
    A_DONOR,
    A_MEMBER,
    A_PARENT,
    A_SEQ,
    A_SOURCE,
    Population,
    best_final,
    link_tree,
    schedule_of,
)
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
                stop: dict[int, str] | None = None) -> list[int]:
    """Run every queued segment as a trainer would: a checkpoint at its end (unless it stopped), its value."""
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
        why = (stop or {}).get(member)
        if why is None:
            ck = d / "checkpoints" / f"global_step_{end}"
            ck.mkdir(parents=True)
            (ck / "state.pt").write_bytes(b"x" * 4096)
            trial.set_user_attr("last_step", end)
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


def test_link_tree_copies_when_links_fail(tmp_path: Path) -> None:
    src = tmp_path / "a" / "global_step_3"
    (src / "actor").mkdir(parents=True)
    (src / "actor" / "w.bin").write_bytes(b"w")
    dst = tmp_path / "b" / "global_step_3"
    link_tree(src, dst)
    assert (dst / "actor" / "w.bin").read_bytes() == b"w"
    with pytest.raises(FileNotFoundError):
        link_tree(tmp_path / "missing", tmp_path / "c")
    assert not list((tmp_path / "b").glob(".*tmp*"))


def test_confirming_a_schedule_reruns_it_from_scratch_with_fresh_seeds(
        setup: tuple[Space, optuna.Study, Population]) -> None:
    from hpo.study._confirm import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, confirmed
    from hpo.study._population import A_INDEX, queue_schedule_confirmations, schedule_confirms

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

    from hpo.study._startup import LatinStartSampler

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
