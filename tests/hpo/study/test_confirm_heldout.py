"""Confirmation measures the setting: full-budget runs (no plateau stop), the held-out test split only in
confirmation runs (a search never sees it), ``study.baseline`` confirmed on the same seeds, and ``confirm``/``best``
reporting the test value and the improvement over the baseline with its interval. Real CLI, real SQLite study, the
fake trainer."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest
from optuna.trial import TrialState

from hpo.study._compare import welch
from tests.hpo.conftest import fake_space, load, run_cli

NOISE = 0.02
TEST_OFFSET = -0.05  # the fake trainer's test/reward_mean = its final value + this


def final_value(x: float, seed: int) -> float:
    return 1.0 - (x - 0.3) ** 2 + NOISE * random.Random(seed).uniform(-1, 1)


@pytest.mark.slow  # make test-slow (CI runs it): two CLI runs, 9 fake trainer processes
def test_confirm_runs_the_full_budget_on_the_test_split_and_against_the_baseline(tmp_path: Path,
                                                                                 studies: Path) -> None:
    space = fake_space(
        tmp_path,
        overrides={"trainer.total_training_steps": 20, "trainer.test_freq": 2, "fake.step_s": 0.25,
                   "trainer.seed": 1000, "fake.seed_noise": NOISE, "fake.peak_at": 2},
        # the value stops rising at step 2: the plateau rule stops a search trial at step 6 (of 20)
        early_stopping={"enabled": True, "metric": "eval/reward_std", "threshold": 0.0, "patience": 3,
                        "plateau_evals": 2, "plateau_min_delta": 0.001},
        study={"n_trials": 3, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3,
               "baseline": {"fake.x": 0.95}, "confirm": {"test_files": "heldout.parquet"}},
        trial={"n_jobs": 2})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    search = load(studies, "fake").trials
    assert len(search) == 3
    # (a busy machine may let a trial finish before its stop lands: at least one must have been stopped)
    assert any(t.user_attrs.get("stop_reason") == "plateau" and t.user_attrs["last_step"] < 20 for t in search)
    for t in search:  # the search never sees the held-out split
        trial_dir = Path(t.user_attrs["trial_dir"])
        assert "data.test_files" not in (trial_dir / "command.json").read_text()
        assert "test/" not in (trial_dir / "metrics.jsonl").read_text()
        assert "test_value" not in t.user_attrs

    res = run_cli(["confirm", "--study", "fake", "--top", "2", "--seeds", "2"], studies)
    assert res.returncode == 0, res.stderr
    assert "6 run(s) queued" in res.stdout  # 2 settings x 2 seeds + the baseline on the same 2 seeds
    study = load(studies, "fake")
    runs = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert len(runs) == 6 and all(t.state == TrialState.COMPLETE for t in runs)
    tests: dict[object, list[float]] = {}
    for t in runs:
        assert t.user_attrs["last_step"] == 20 and "stop_reason" not in t.user_attrs  # full budget
        command = (Path(t.user_attrs["trial_dir"]) / "command.json").read_text()
        assert "data.test_files=heldout.parquet" in command
        x = 0.95 if t.user_attrs["confirm_of"] == "baseline" else t.params["x"]
        assert t.user_attrs["test_value"] == pytest.approx(final_value(x, t.user_attrs["confirm_seed"]) + TEST_OFFSET)
        tests.setdefault(t.user_attrs["confirm_of"], []).append(t.user_attrs["test_value"])
    baseline = [t for t in runs if t.user_attrs["confirm_of"] == "baseline"]
    assert len(baseline) == 2 and all(t.params == {} for t in baseline)
    assert all("fake.x=0.95" in (Path(t.user_attrs["trial_dir"]) / "command.json").read_text() for t in baseline)
    seeds = sorted(t.user_attrs["confirm_seed"] for t in baseline)
    assert seeds == sorted({t.user_attrs["confirm_seed"] for t in runs if t not in baseline}) == [1001, 1002]
    out = res.stdout
    assert "test mean" in out and "baseline" in out
    assert "held-out: confirmation runs also evaluate the held-out test split heldout.parquet" in out
    assert "improvement of trial" in out and "(Welch 95%)" in out

    best = run_cli(["best", "--study", "fake"], studies)
    assert best.returncode == 0, best.stderr
    pick = int(best.stderr.split("# trial ", 1)[1].split()[0])
    diff = welch(tests[pick], tests["baseline"])
    assert diff is not None
    assert f"held-out test {diff.text()}" in best.stderr
    assert f"held-out test {statistics.fmean(tests[pick]):.4g}" in best.stderr
    line = next(ln for ln in best.stderr.splitlines() if "improvement of trial" in ln)
    word = "the search pays" if diff.low > 0 else "baseline is better" if diff.high < 0 else "cannot be told apart"
    assert word in line, line


def test_a_search_trial_of_the_default_trainer_never_evaluates_the_test_split(tmp_path: Path) -> None:
    """Whatever the trainer config says, a search trial runs with data.test_files=null; a confirmation run gets the
    built-in task's test split."""
    from hpo.backends import Attempt, backend_of, load_space
    from hpo.study._confirm import confirm_overrides, heldout_metric_of

    space = load_space("kl_lr")
    values = {"kl_coef": 0.05, "actor_lr": 1e-5}
    search = backend_of(space).configure(Attempt(space=space, values=values, trial_dir=tmp_path)).overrides
    assert search[-1] == "data.test_files=null"
    confirm = backend_of(space).configure(Attempt(space=space, values=values, trial_dir=tmp_path,
                                                  extra=confirm_overrides(space, 1000))).overrides
    assert "data.test_files=builtin:arith" in confirm and "data.test_files=null" not in confirm
    assert heldout_metric_of(space) == "test/reward_mean"
    base = confirm_overrides(space, 1000, baseline=True)
    assert base["actor_rollout_ref.actor.optim.lr"] == 1e-6 and base["algorithm.kl_ctrl.kl_coef"] == 0.001
    assert base["trainer.seed"] == 1000


@pytest.mark.parametrize("section, value, needle", [
    ("overrides", {"data.test_files": "x.parquet"}, "overrides.data.test_files: the held-out test split is for "
                                                    "verl-hpo confirm only"),
    ("objective", {"metric": "test/reward_mean", "direction": "maximize"},
     "objective.metric: 'test/reward_mean' is measured on the held-out test split"),
    ("study", {"baseline": {"fake.x": {"a": 1}}}, "study.baseline.fake.x: expected a value, got a mapping"),
    ("study", {"baseline": []}, "study.baseline: expected a non-empty mapping"),
])
def test_the_search_cannot_be_pointed_at_the_test_split(tmp_path: Path, section: str, value: object,
                                                         needle: str) -> None:
    from hpo.backends import load_space
    from hpo.experiment._space import SpaceError

    space = fake_space(tmp_path, **{section: value})
    with pytest.raises(SpaceError) as err:
        load_space(str(space), check=False)
    assert str(err.value) == f"{space}: {needle}" or str(err.value).startswith(f"{space}: {needle}"), err.value


def test_a_search_on_the_test_split_is_one_line_and_makes_no_study(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"data.test_files": "x.parquet"})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 2 and "overrides.data.test_files: the held-out test split" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (studies / "fake.db").exists()


def test_a_baseline_key_the_trainer_does_not_know_is_one_line(tmp_path: Path) -> None:
    from hpo.backends import load_space
    from hpo.experiment._space import SpaceError

    bad = tmp_path / "kl_lr.yaml"
    text = (Path(__file__).resolve().parents[3] / "search_spaces" / "kl_lr.yaml").read_text()
    bad.write_text(text.replace("    actor_rollout_ref.actor.optim.lr: 1.0e-6", "    actor.lr: 1.0e-6"))
    with pytest.raises(SpaceError, match=r"study\.baseline\.actor\.lr: unknown trainer key \(value 1e-06\)"):
        load_space(str(bad))


def test_a_verl_confirmation_run_validates_on_its_own_test_file(tmp_path: Path) -> None:
    """verl: study.confirm.test_files replaces data.val_files in confirmation runs (never in search trials); their
    objective metric is then the held-out value, and confirm says so."""
    from hpo.backends import Attempt, backend_of
    from hpo.study._confirm import confirm_overrides, heldout_metric_of, heldout_note
    from tests.hpo.backends.verl.conftest import SPACE_FILE, load_verl_space

    plain = load_verl_space(SPACE_FILE)
    assert heldout_metric_of(plain) is None and heldout_note(plain) == ""
    assert "data.val_files" not in confirm_overrides(plain, 1000)
    space = load_verl_space(SPACE_FILE, study={**plain.raw["study"], "confirm": {"test_files": "/data/test.parquet"}})
    values = {p.name: p.low if p.low is not None else (p.choices or [None])[0] for p in space.params}
    search = backend_of(space).configure(Attempt(space=space, values=values, trial_dir=tmp_path)).overrides
    confirm = backend_of(space).configure(Attempt(space=space, values=values, trial_dir=tmp_path,
                                                  extra=confirm_overrides(space, 1000))).overrides
    assert not any("/data/test.parquet" in o for o in search)
    assert [o for o in confirm if o.startswith("data.val_files=")] == ["data.val_files=/data/test.parquet"]
    assert heldout_metric_of(space) == space.objective.primary_metric
    assert heldout_note(space).startswith("confirmation runs validate on the test file /data/test.parquet "
                                          "(data.val_files swapped)")


def test_a_verl_test_metric_keeps_the_comparison_on_validation_data(tmp_path: Path) -> None:
    """verl with study.confirm.test_metric: confirmation runs validate on data.val_files and the test files together
    (verl logs each data source apart); the objective stays the validation metric, the held-out value is read from
    test_metric, and confirm says so."""
    from hpo.backends import Attempt, backend_of
    from hpo.study._confirm import confirm_overrides, heldout_metric_of, heldout_note
    from tests.hpo.backends.verl.conftest import SPACE_FILE, load_verl_space

    plain = load_verl_space(SPACE_FILE)
    test_metric = "val-core/heldout/reward/mean@1"
    space = load_verl_space(SPACE_FILE, study={**plain.raw["study"], "confirm": {
        "test_files": "/data/test.parquet", "test_metric": test_metric}})
    val = space.overrides["data.val_files"]
    values = {p.name: p.low if p.low is not None else (p.choices or [None])[0] for p in space.params}
    search = backend_of(space).configure(Attempt(space=space, values=values, trial_dir=tmp_path)).overrides
    confirm = backend_of(space).configure(Attempt(space=space, values=values, trial_dir=tmp_path,
                                                  extra=confirm_overrides(space, 1000))).overrides
    quoted = f"'{val}'"  # hydra would read ${...} bare as an interpolation of the whole value: quoted, as verl gets it
    assert [o for o in search if o.startswith("data.val_files=")] == [f"data.val_files={quoted}"]
    assert [o for o in confirm if o.startswith("data.val_files=")] == [
        f"data.val_files=[{quoted},/data/test.parquet]"]
    assert heldout_metric_of(space) == test_metric != space.objective.primary_metric
    assert heldout_note(space).startswith("confirmation runs validate on the test file /data/test.parquet beside "
                                          "data.val_files: they are compared on the validation metric")


@pytest.mark.parametrize("confirm, needle", [
    ({"test_files": "/t.parquet", "test_metric": "val-core/openai/gsm8k/acc/mean@1"},
     "study.confirm.test_metric: 'val-core/openai/gsm8k/acc/mean@1': must name the held-out metric, not the "
     "objective's"),
    ({"test_metric": "val-core/heldout/acc/mean@1"},
     "study.confirm.test_metric: 'val-core/heldout/acc/mean@1' needs held-out data for confirmation runs"),
])
def test_a_test_metric_that_cannot_be_read_apart_is_one_line(confirm: dict[str, str], needle: str) -> None:
    from hpo.backends import load_space
    from hpo.experiment._space import SpaceError
    from tests.hpo.backends.verl.conftest import SPACE_FILE

    with pytest.raises(SpaceError) as err:
        load_space(str(SPACE_FILE), overrides=[f"study.confirm.{k}={v}" for k, v in confirm.items()])
    assert needle in str(err.value) and "\n" not in str(err.value), err.value  # names the --override that set it


def test_confirm_prepares_the_held_out_data_the_search_never_named(tmp_path: Path, studies: Path) -> None:
    """The prepare step runs before the search with the experiment's overrides, and before the confirmation with
    the held-out ones too (a generated test file exists only if someone asks for it)."""
    log = tmp_path / "prepare.log"
    prep = f"import json, sys; open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')"
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2,
                                            "fake.step_s": 0.01, "trainer.seed": 1000},
                       study={"n_trials": 2, "pruner": {"type": "none"},
                              "confirm": {"top_k": 1, "seeds": 1, "test_files": "heldout.parquet"}},
                       trial={"prepare_command": ["python", "-c", prep]})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    assert run_cli(["confirm", "--study", "fake"], studies).returncode == 0
    search, confirm = (line for line in log.read_text().splitlines())
    assert "data.test_files=heldout.parquet" not in search
    assert "data.test_files=heldout.parquet" in confirm
