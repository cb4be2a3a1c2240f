"""A proxy search's target confirmation that uses the proxy's evidence (``hpo/study/_continuation.py``), driven as a
user runs it (``search``, ``confirm``, ``best``) with a real SQLite study, in-process so that a trainer that continues
runs can be registered: tests/hpo/fake_trainer.py with verl_core's checkpoint layout and resume keys. The promoted runs
train on the race's first seed and save at ``promote_steps``; a held proxy races its best setting alone and that
setting's first seed continues its promoted run from the checkpoint (60 steps, promote_steps 10: the run costs
50/60); a checkpoint that is missing or refused starts the run afresh with one line; a failed check races
``confirm.top_k`` target settings, and those among them whose setting was promoted continue their promoted run in
the same way while the others run from scratch; the promoted runs' checkpoints are held until the race's field is
known and go once no candidate can continue them."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

import hpo.reporting._dashboard as dashboard
from hpo._cli import main
from hpo.backends import Attempt, Command, Resumable, TrialConfig, register, unregister
from hpo.backends.verl_core._backend import VerlCoreCommand
from hpo.backends.verl_core._resume import LAYOUT, resume_overrides, save_overrides
from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_CONTINUES,
    ATTR_FIDELITY,
    ATTR_FIDELITY_CHECK,
    ATTR_PROMOTED_FROM,
    ATTR_RACE,
    TARGET,
    is_confirm,
    is_promoted,
    steps_run,
    study_cost,
)
from hpo.study._confirm import confirm_reserve
from hpo.study._continuation import continued, continued_runs, proxy_field
from tests.hpo.conftest import FAKE_TRAINER, PY, load
from tests.hpo.study.test_proxy_fidelity import argv_of, models, value_in

STEPS, PROMOTE = 60, 10


class _Done:
    """A page process that has already finished."""

    returncode = 0

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        return "", ""


class ResumableFake(VerlCoreCommand):
    """The fake trainer as a trainer that continues runs: checkpoints into the trial directory, verl_core's layout
    (``global_step_N/state.pt``), ``trainer.save_freq`` to save at a step and ``resume_path`` to continue one."""

    name = "fake_resumable"
    resumable = Resumable(LAYOUT, resume_overrides, save_at=save_overrides)

    def configure(self, attempt: Attempt) -> TrialConfig:
        config = super().configure(attempt)
        config.overrides.append(f"trainer.default_local_dir={attempt.trial_dir / 'checkpoints'}")
        return config

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        process = super().command(attempt, config)
        if attempt.resume_from is not None:
            process.argv += resume_overrides(attempt.resume_from)
        return process


@pytest.fixture(autouse=True)
def resumable_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The trainer registered in this process; the dashboard page (a process of its own, ~20 s on a busy host, not
    what these tests check) not written."""
    monkeypatch.setattr(dashboard, "write_page_apart", lambda *args, **kwargs: None)
    monkeypatch.setattr(dashboard, "page_process", lambda *args, **kwargs: _Done())
    register(ResumableFake.name, ResumableFake)
    try:
        yield
    finally:
        unregister(ResumableFake.name)


def experiment(tmp_path: Path, reverse: bool = False, top_k: int = 2, proxy: dict[str, Any] | None = None) -> Path:
    large, small = models(tmp_path)
    space = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": STEPS, "trainer.test_freq": 10, "fake.step_s": 0.001,
                      "actor_rollout_ref.model.path": str(large), "fake.model": "large"},
        "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 3, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3,
                  "confirm": {"race": True, "top_k": top_k, "min_seeds": 2, "seeds": 2,
                              "test_files": "heldout.parquet"},
                  "fidelity": {"proxy": {"overrides": {"actor_rollout_ref.model.path": str(small),
                                                       "fake.model": "small", "fake.small_step_s": 0.0005,
                                                       **({"fake.small_reverse": True} if reverse else {}),
                                                       **(proxy or {})},
                                         "promote": 3, "promote_steps": PROMOTE}}},
        "trial": {"backend": ResumableFake.name, "command": [PY, str(FAKE_TRAINER), "train"], "n_jobs": 2},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    """``verl-hpo ARGS`` in this process from the user's directory; (stdout, stderr)."""
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main([*args, "--studies-dir", str(tmp_path / "studies")])
    finally:
        os.chdir(here)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def checkpoint(t: optuna.trial.FrozenTrial) -> Path:
    return Path(t.user_attrs["trial_dir"]) / "checkpoints" / f"global_step_{PROMOTE}"


def searched(tmp_path: Path, capsys: pytest.CaptureFixture[str], reverse: bool = False, top_k: int = 2,
             proxy: dict[str, Any] | None = None) -> tuple[optuna.Study, list[optuna.trial.FrozenTrial], int]:
    """The proxy search run: the study, its promoted runs and the race's first seed."""
    run(tmp_path, capsys, "search", "--space", str(experiment(tmp_path, reverse, top_k, proxy)))
    study = load(tmp_path / "studies", "proxy")
    promoted = [t for t in study.get_trials(deepcopy=False) if is_promoted(t)]
    assert len(promoted) == 3
    return study, promoted, int(promoted[0].user_attrs["promote_seed"])


def race_of(study: optuna.Study) -> dict[str, Any]:
    return dict(study._storage.get_study_system_attrs(study._study_id)[ATTR_RACE])


def confirmations(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if is_confirm(t) and t.state == TrialState.COMPLETE]


def test_a_held_proxy_races_its_best_setting_alone_and_its_first_seed_continues_the_promoted_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study, promoted, seed = searched(tmp_path, capsys)
    check = study.user_attrs[ATTR_FIDELITY_CHECK]
    assert check["holds"] is True
    # the promoted runs trained on the race's first seed and saved where they stopped; the checkpoints are kept
    for t in promoted:
        argv = argv_of(t)
        assert value_in(argv, "trainer.seed") == str(seed) and value_in(argv, "trainer.save_freq") == str(PROMOTE)
        assert not any(a.startswith("data.test_files=") for a in argv)  # never the held-out split
        assert t.user_attrs["stop_reason"] == "promote_steps" and max(t.intermediate_values) == PROMOTE
        assert json.loads((checkpoint(t) / "state.pt").read_text()) == {"step": PROMOTE}
        assert t.user_attrs.get("checkpoint_kept") is True  # keep_checkpoints 0: held for the race all the same
        saved = {p.name for p in checkpoint(t).parent.iterdir() if p.name.startswith("global_step_")}
        assert saved == {f"global_step_{PROMOTE}"}  # what its trainer saved after the stop reached it is gone
    assert all("trainer.seed" not in " ".join(argv_of(t)) for t in study.get_trials(deepcopy=False)
               if not is_promoted(t))  # the proxy's trials keep the tuning seed

    best = check["pairs"][0][1]  # the proxy's best setting's promoted run
    out, err = run(tmp_path, capsys, "confirm", "--study", "proxy")
    assert "--top" not in err  # not given: nothing to say about it
    said = [line for line in out.splitlines() if "proxy race: the proxy held" in line]
    assert said and said[0].endswith(f"the target race runs its best setting alone (confirm_top 1); seed {seed} "
                                     f"continues its promoted run (trial {best}) from step {PROMOTE}")
    study = load(tmp_path / "studies", "proxy")
    race = race_of(study)
    assert race["candidates"] == [best] and race["proxy"] == {"confirm_top": 1, "field": [best], "continues": [best]}
    runs = confirmations(study)
    assert [(t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs[ATTR_CONFIRM_SEED]) for t in runs] == [
        (best, seed), (best, seed + 1)]
    first, second = runs
    assert first.system_attrs[ATTR_CONTINUES] == best and ATTR_CONTINUES not in second.system_attrs
    assert first.user_attrs["resumed_from_step"] == PROMOTE and first.user_attrs["continued_from"] == {
        "run": best, "step": PROMOTE}
    argv = argv_of(first)
    assert value_in(argv, "trainer.resume_mode") == "resume_path"
    assert value_in(argv, "trainer.resume_from_path") == str(checkpoint(study.trials[best]))
    assert value_in(argv, "trainer.seed") == str(seed) and value_in(argv, "data.test_files") == "heldout.parquet"
    logged = [json.loads(line)["step"] for line in (Path(first.user_attrs["trial_dir"]) / "metrics.jsonl").open()]
    assert logged[0] == PROMOTE + 1 and logged[-1] == STEPS  # the trainer ran steps 11..60 only
    assert sorted(first.intermediate_values) == list(range(0, STEPS + 1, 10))  # 0 and 10 replayed from the run
    assert first.intermediate_values[PROMOTE] == study.trials[best].intermediate_values[PROMOTE]
    assert first.values == second.values and "test_value" in first.user_attrs  # the same run as from scratch
    # the cost: 50 of 60 steps for the continued seed, a full run for the next
    assert steps_run(first) == STEPS - PROMOTE and steps_run(second) == STEPS
    assert study_cost(study.get_trials(deepcopy=False)).confirm_runs == pytest.approx((50 + 60) / 60)
    # the race used the checkpoints: none is left
    assert not any(checkpoint(t).exists() for t in promoted)

    _, err = run(tmp_path, capsys, "best", "--study", "proxy")
    assert (f"seed {seed} continued its promoted run (trial {best}) from step {PROMOTE}" in err
            and "its best setting alone (confirm_top 1)" in err)


def test_a_catch_up_the_proxy_never_measured_races_the_target_s_best_against_the_pick(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The small model scores every x alike up to step 10 (fake.small_blind_until) and then ranks x by its distance
    to 0.8, the large one by its distance to 0.3 all along (build C's study seed 2 in small: benchmarks/RESULTS.md).
    The proxy's pick is the x nearest 0.8; at the promotion step the proxy has it level with every other promoted
    setting while the target has the x nearest 0.3 ahead: the check holds (the proxy claims nothing there) but says
    in one line that the pick's catch-up on the target was never measured, and the race takes both, although
    confirm_top is 1; the target's full-length runs then recommend the target's best, and each first seed continues
    its own promoted run."""
    study, promoted, seed = searched(tmp_path, capsys, proxy={"fake.small_blind_until": PROMOTE, "fake.small_x0": 0.8})
    check = study.user_attrs[ATTR_FIDELITY_CHECK]
    by_run = {t.number: t for t in promoted}
    pick, other = check["pairs"][0][1], check["unmeasured"]["run"]
    assert check["holds"] is True and len({p[2] for p in check["pairs"]}) == 1  # the proxy level at step 10
    assert pick == min(by_run, key=lambda n: abs(by_run[n].params["x"] - 0.8))  # the proxy's full-length best
    assert other == min(by_run, key=lambda n: abs(by_run[n].params["x"] - 0.3)) != pick  # the target's best at 10
    out, _ = run(tmp_path, capsys, "confirm", "--study", "proxy")
    said = [line for line in out.splitlines() if "proxy race: the proxy held" in line]
    assert said and (f"the target race runs its best setting and trial {other}, the target's best at the "
                     "promotion step, further ahead of the pick there on the target than on the proxy (confirm_top "
                     "1)") in said[0]
    study = load(tmp_path / "studies", "proxy")
    race = race_of(study)
    assert race["candidates"] == [pick, other] and race["proxy"]["continues"] == [pick, other]
    runs = confirmations(study)
    assert sorted((t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs[ATTR_CONFIRM_SEED]) for t in runs) == sorted(
        (c, s) for c in (pick, other) for s in (seed, seed + 1))
    assert {t.system_attrs[ATTR_CONFIRM_OF] for t in runs if ATTR_CONTINUES in t.system_attrs} == {pick, other}
    _, err = run(tmp_path, capsys, "best", "--study", "proxy")
    assert f"# trial {other} " in err, err  # the target's best at full length, not the proxy's pick
    assert (f"its pick, trial {check['pairs'][0][0]} (target run {pick}), was level with trial "
            f"{check['unmeasured']['trial']} (target run {other}) on the proxy") in err
    assert "a catch-up it never measured, so the race took both" in err


def test_confirm_top_with_a_held_proxy_says_in_one_line_that_the_proxy_s_field_is_raced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--top`` chooses the field of a race the proxy did not choose; a held proxy races its own field (at most
    ``confirm_top`` promoted settings): ``--top`` is not used, and one line on stderr says so and why."""
    study, _, _ = searched(tmp_path, capsys)
    assert study.user_attrs[ATTR_FIDELITY_CHECK]["holds"] is True
    best = study.user_attrs[ATTR_FIDELITY_CHECK]["pairs"][0][1]
    _, err = run(tmp_path, capsys, "confirm", "--study", "proxy", "--top", "3")
    said = [line for line in err.splitlines() if "--top" in line]
    assert len(said) == 1, err
    assert said[0] == ("note: --top 3 is not used: the proxy's check held, so the race takes the proxy's field (the "
                       "promoted settings it cannot tell apart: within the check's resolution of its best, in its "
                       "order, at most study.fidelity.proxy.confirm_top = 1): 1 setting(s)"), said
    assert race_of(load(tmp_path / "studies", "proxy"))["candidates"] == [best]


@pytest.mark.parametrize("damage", ["missing", "symlink"])
def test_a_missing_or_refused_checkpoint_starts_the_run_afresh_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    study, promoted, seed = searched(tmp_path, capsys)
    for t in promoted:
        if damage == "missing":
            shutil.rmtree(checkpoint(t).parent)
        else:  # a trial's file swapped for a link to a file of its choosing: never read through
            outside = tmp_path / f"elsewhere-{t.number}.pt"
            outside.write_text(json.dumps({"step": 50}))
            (checkpoint(t) / "state.pt").unlink()
            (checkpoint(t) / "state.pt").symlink_to(outside)
    out, _ = run(tmp_path, capsys, "confirm", "--study", "proxy")
    said = [line for line in out.splitlines() if "starts afresh instead of continuing its promoted run" in line]
    assert len(said) == 1
    why = "left no checkpoint" if damage == "missing" else "symbolic link"
    assert why in said[0] and "the retry" not in said[0]
    first = confirmations(load(tmp_path / "studies", "proxy"))[0]
    assert first.system_attrs[ATTR_CONFIRM_SEED] == seed and why in first.user_attrs["continue_refused"]
    assert "resumed_from_step" not in first.user_attrs and steps_run(first) == STEPS
    assert "trainer.resume_mode=resume_path" not in argv_of(first)
    assert f"seed {seed} started afresh: " in out


def test_a_failed_check_races_the_top_k_target_settings_from_scratch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study, promoted, _ = searched(tmp_path, capsys, reverse=True)
    assert study.user_attrs[ATTR_FIDELITY_CHECK]["holds"] is False
    assert all(checkpoint(t).exists() for t in promoted)  # held: the target search may rank any in its top_k
    out, err = run(tmp_path, capsys, "confirm", "--study", "proxy", "--top", "2")
    assert "--top" not in err  # the race's field is the top --top target settings: nothing to say
    assert ("proxy race: the proxy did not hold: the target race runs the top 2 target setting(s) from scratch "
            "(study.confirm.top_k)") in out
    study = load(tmp_path / "studies", "proxy")
    assert len(race_of(study)["candidates"]) == 2 and "proxy" not in race_of(study)
    assert not any(is_promoted(study.trials[c]) for c in race_of(study)["candidates"])  # the full target runs
    runs = confirmations(study)
    assert len(runs) == 4 and all(ATTR_CONTINUES not in t.system_attrs and "resumed_from_step" not in t.user_attrs
                                  and steps_run(t) == STEPS for t in runs)
    assert not any(checkpoint(t).exists() for t in promoted)  # no candidate continues them: gone once it was known


def test_a_failed_check_s_candidates_of_promoted_settings_continue_their_promoted_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """top_k 5 of 7 target runs: the 3 target search trials (full runs, ~0.5-1.0), a target trial that sampled a
    promoted setting again (planted: a float search samples none) and the best promoted run (its value at step 10,
    <= 0.18: ranked below every full run); the other promoted runs are not in the field."""
    study, promoted, seed = searched(tmp_path, capsys, reverse=True, top_k=5)
    assert study.user_attrs[ATTR_FIDELITY_CHECK]["holds"] is False
    assert all(checkpoint(t).exists() for t in promoted)  # held until the race's field is known
    best, out_of_field, resampled = sorted(promoted, key=lambda t: -float(t.values[0]))
    study.add_trial(optuna.trial.create_trial(value=1.5, params=resampled.params,
                                              distributions=resampled.distributions,
                                              system_attrs={ATTR_FIDELITY: TARGET}))
    again = study.trials[-1].number
    search = [t.number for t in study.trials if t.system_attrs.get(ATTR_FIDELITY) == TARGET
              and ATTR_PROMOTED_FROM not in t.system_attrs and t.number != again]
    assert len(search) == 3

    out, _ = run(tmp_path, capsys, "confirm", "--study", "proxy")
    said = [line for line in out.splitlines() if line.startswith("proxy race: ")]
    assert said[0] == (f"proxy race: the proxy did not hold: the target race runs the top 5 target setting(s) "
                       f"(study.confirm.top_k); seed {seed} of trial {again} continues its setting's promoted run "
                       f"(trial {resampled.number}) from step {PROMOTE}; seed {seed} of trial {best.number} continues "
                       f"its promoted run (trial {best.number}) from step {PROMOTE}")  # as the race starts
    assert said[-1] == said[0].replace("continues", "continued")  # and at its end
    study = load(tmp_path / "studies", "proxy")
    race = race_of(study)
    assert race["candidates"][0] == again and sorted(race["candidates"][1:4]) == search
    assert race["candidates"][4] == best.number
    assert race["proxy"] == {"continues": [[again, resampled.number], best.number]}
    runs = confirmations(study)
    assert len(runs) == 10
    firsts = {t.system_attrs[ATTR_CONFIRM_OF]: t for t in runs if t.system_attrs[ATTR_CONFIRM_SEED] == seed}
    for number, source in ((again, resampled), (best.number, best)):
        first = firsts[number]
        assert first.system_attrs[ATTR_CONTINUES] == source.number
        assert first.user_attrs["resumed_from_step"] == PROMOTE and first.user_attrs["continued_from"] == {
            "run": source.number, "step": PROMOTE}
        argv = argv_of(first)
        assert value_in(argv, "trainer.resume_from_path") == str(checkpoint(source))
        assert value_in(argv, "trainer.seed") == str(seed) and value_in(argv, "data.test_files") == "heldout.parquet"
        assert first.intermediate_values[PROMOTE] == source.intermediate_values[PROMOTE]  # replayed from the run
        assert steps_run(first) == STEPS - PROMOTE
    assert all(ATTR_CONTINUES not in t.system_attrs and "resumed_from_step" not in t.user_attrs
               and steps_run(t) == STEPS for t in runs if t is not firsts[again] and t is not firsts[best.number])
    assert study_cost(study.get_trials(deepcopy=False)).confirm_runs == pytest.approx((2 * 50 + 8 * 60) / 60)
    # the continued runs' checkpoints went after their continuation, the one not in the field once it was known
    assert not any(checkpoint(t).exists() for t in promoted) and out_of_field.number not in race["candidates"]

    _, err = run(tmp_path, capsys, "best", "--study", "proxy")
    assert (f"seed {seed} of trial {again} continued its setting's promoted run (trial {resampled.number}) from step "
            f"{PROMOTE}; seed {seed} of trial {best.number} continued its promoted run" in err)


def test_the_field_is_the_proxy_s_best_settings_it_cannot_tell_apart_whatever_their_short_target_runs_say(
        tmp_path: Path) -> None:
    """The race's field when the proxy held: the proxy's full-length order, those whose proxy value is within the
    resolution (0.01) of the proxy's best, at most confirm_top. The promoted runs' 10-step target values choose no one
    (they rank learning speed: a slow starter at 0.318 there was the target's best at 60 steps)."""
    from hpo.experiment import read_space

    def space(top: int) -> Any:
        path = tmp_path / f"p{top}.yaml"
        path.write_text(yaml.safe_dump({
            "config": "tiny_arith", "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
            "study": {"n_trials": 4, "confirm": {"race": True, "min_seeds": 2},
                      "fidelity": {"proxy": {"overrides": {"m": "small"}, "promote": 4, "confirm_top": top}}}}))
        return read_space(str(path))[0]

    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for i, v in enumerate((0.938, 0.932, 0.929, 0.90)):  # proxy trials 0..3: final values (0.929 is 0.009 below)
        study.add_trial(optuna.trial.create_trial(value=v, params={"x": i / 10}, distributions=dist))
    for i, v in enumerate((0.318, 0.413, 0.407, 0.45)):  # their promoted target runs 4..7 at promote_steps
        study.add_trial(optuna.trial.create_trial(value=v, params={"x": i / 10}, distributions=dist))
    check = {"holds": True, "resolution": 0.01,
             "pairs": [[0, 4, 0.70, 0.318], [1, 5, 0.92, 0.413], [2, 6, 0.90, 0.407], [3, 7, 0.93, 0.45]]}
    assert proxy_field(study, space(1), check) == [4]  # the proxy's best alone, the slowest at step 10
    assert proxy_field(study, space(2), check) == [4, 5]
    assert proxy_field(study, space(4), check) == [4, 5, 6]  # 0.90 is 0.038 below the proxy's best: told apart
    # a proxy that separates its best races it alone, whatever confirm_top allows
    separated = {**check, "resolution": 0.005}
    assert proxy_field(study, space(4), separated) == [4]
    # a setting the proxy could not tell from its pick at the promotion step, which the target had ahead there (the
    # check's unmeasured catch-up): it joins the field beyond confirm_top, once, and the confirmation's reserve
    # counts it
    found = {"trial": 3, "run": 7, "of": 0, "proxy_gap": 0.23, "target_gap": 0.132}
    unmeasured_ = {**check, "unmeasured": found}
    assert proxy_field(study, space(1), unmeasured_) == [4, 7]
    assert proxy_field(study, space(4), {**check, "unmeasured": {**found, "run": 5, "trial": 1}}) == [4, 5, 6]
    assert proxy_field(study, space(1), {**check, "unmeasured": {**found, "run": None}}) == [4]
    trials = study.get_trials(deepcopy=False)
    assert confirm_reserve(space(1), None, trials, check) == 2.0  # 1 setting on 2 seeds
    assert confirm_reserve(space(1), None, trials, unmeasured_) == 4.0


def test_a_candidate_continues_its_own_promoted_run_or_one_with_exactly_its_params(tmp_path: Path) -> None:
    from hpo.experiment import read_space

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "config": "tiny_arith", "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "study": {"n_trials": 4, "confirm": {"race": True},
                  "fidelity": {"proxy": {"overrides": {"m": "small"}, "promote": 2}}},
        "trial": {"backend": ResumableFake.name, "command": [PY, str(FAKE_TRAINER), "train"]}}))
    space = read_space(str(path))[0]
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    study = optuna.create_study(direction="maximize")

    def add(x: float, promoted: bool, state: TrialState = TrialState.COMPLETE) -> int:
        study.add_trial(optuna.trial.create_trial(
            state=state, value=0.5 if state == TrialState.COMPLETE else None, params={"x": x}, distributions=dist,
            system_attrs={ATTR_FIDELITY: TARGET, **({ATTR_PROMOTED_FROM: 0} if promoted else {})}))
        return study.trials[-1].number

    p1, p2 = add(0.1, True), add(0.2, True)
    add(0.3, True, TrialState.FAIL)
    same, other, after_failed = add(0.2, False), add(0.4, False), add(0.3, False)
    # a promoted candidate: itself; a target trial with a promoted run's exact params: that run; a promoted run that
    # failed (no checkpoint at its step) or other params: none
    assert continued_runs(study, space, [same, p1, other, after_failed, 99]) == {same: p2, p1: p1}
    # the study's record read back, never trusted
    assert continued({"continues": [p1, [same, p2], [True, 1], "x", [1, 2, 3], None]}) == {p1: p1, same: p2}
    assert continued({"continues": "all"}) == {} and continued(None) == {}
