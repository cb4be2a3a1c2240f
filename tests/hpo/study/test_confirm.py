"""``verl-hpo confirm``: the top configurations re-run with fresh seeds as tagged trials of the same study, and
``best`` ranking by the confirmed mean. Real CLI, real SQLite study, the fake trainer (whose final value moves
with ``trainer.seed`` by up to ``fake.seed_noise``)."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from optuna.trial import TrialState

from hpo.backends import load_space
from hpo.study._confirm import confirm_seeds, tuning_seeds
from tests.hpo.conftest import fake_space, load, run_cli

NOISE = 0.3


def fake_value(x: float, seed: int) -> float:
    return 1.0 - (x - 0.3) ** 2 + NOISE * random.Random(seed).uniform(-1, 1)


def test_confirmation_seeds_never_overlap_tuning_seeds(tmp_path: Path) -> None:
    fixed = load_space(str(fake_space(tmp_path, overrides={"trainer.seed": 1001})), check=False)
    assert tuning_seeds(fixed) == {1001}
    assert confirm_seeds(fixed, 3) == [1000, 1002, 1003]
    tuned = load_space(str(fake_space(tmp_path, name="tuned", params={
        "x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0},
        "seed": {"key": "trainer.seed", "type": "int", "low": 998, "high": 1004}})), check=False)
    assert confirm_seeds(tuned, 2) == [1005, 1006]
    other = load_space(str(fake_space(tmp_path, name="other", overrides={"run.seed": 1000},
                                      study={"confirm": {"seed_key": "run.seed", "seed_base": 7}})), check=False)
    assert confirm_seeds(other, 2) == [7, 8]


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_confirm_reruns_the_top_trials_with_fresh_seeds_and_best_ranks_by_the_mean(tmp_path: Path,
                                                                                    studies: Path) -> None:
    log = tmp_path / "runs.jsonl"
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 2,
                                            "fake.step_s": 0.02, "trainer.seed": 1000, "fake.seed_noise": NOISE,
                                            "fake.log_file": str(log)},
                       study={"n_trials": 5, "pruner": {"type": "median", "n_startup_trials": 1}},
                       trial={"n_jobs": 2})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    before = load(studies, "fake").trials
    search = [t for t in before if t.state == TrialState.COMPLETE]
    top2 = sorted(search, key=lambda t: -t.value)[:2]

    res = run_cli(["confirm", "--study", "fake", "--top", "2", "--seeds", "3"], studies)
    assert res.returncode == 0, res.stderr
    assert "6 run(s) queued" in res.stdout and "confirmed mean" in res.stdout
    study = load(studies, "fake")
    runs = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert len(runs) == 6
    by_of: dict[int, list[float]] = {}
    for t in runs:
        assert t.state == TrialState.COMPLETE  # never pruned, though seeds can drop a run below the median
        assert t.user_attrs["last_step"] == 10, (t.number, t.value, sorted(t.intermediate_values),
                                                 (Path(t.user_attrs["trial_dir"]) / "metrics.jsonl").read_text()[-300:])
        of, seed = t.user_attrs["confirm_of"], t.user_attrs["confirm_seed"]
        assert seed in (1001, 1002, 1003)  # 1000 was the tuning seed
        original = next(o for o in before if o.number == of)
        assert t.params == original.params
        assert t.value == pytest.approx(fake_value(t.params["x"], seed))
        by_of.setdefault(of, []).append(t.value)
    assert sorted(by_of) == sorted(t.number for t in top2)
    seeds_run = [json.loads(line)["seed"] for line in log.read_text().splitlines()]
    # (a pruned search run may finish before its kill: it counts as a tuning run too)
    assert seeds_run.count(1000) >= len(search), log.read_text()
    # each confirmation run ran exactly once (a queued trial claimed by two jobs would show twice here)
    assert sorted(s for s in seeds_run if s != 1000) == [1001, 1001, 1002, 1002, 1003, 1003], log.read_text()
    # the search's target is untouched: resume has nothing to do, and the table tags the runs
    again = run_cli(["resume", "--study", "fake"], studies)
    assert again.returncode == 0 and "already has 5 finished trials" in again.stdout
    assert "confirms" in again.stdout
    # confirm again: nothing missing, nothing queued
    res2 = run_cli(["confirm", "--study", "fake", "--top", "2", "--seeds", "3"], studies)
    assert res2.returncode == 0 and "0 run(s) queued" in res2.stdout
    assert len([t for t in load(studies, "fake").trials if "confirm_of" in t.user_attrs]) == 6

    page = (studies / "fake" / "dashboard.html").read_text()  # rewritten by confirm: the ranking and the tags
    assert 'id="confirmed"' in page and all(f'data-confirmed="{n}"' in page for n in by_of)
    assert page.count('class="confirm"') == 6 and 'class="diagnosis"' in page

    best = run_cli(["best", "--study", "fake"], studies)
    assert best.returncode == 0, best.stderr
    winner = max(by_of, key=lambda n: statistics.fmean(by_of[n]))
    mean = statistics.fmean(by_of[winner])
    assert f"# trial {winner} of study fake" in best.stderr and f"confirmed mean {mean:.4g}" in best.stderr
    x = next(t for t in before if t.number == winner).params["x"]
    assert best.stdout.strip() == f"fake.x={x!r}"


def test_confirm_input_errors_are_one_line(tmp_path: Path, studies: Path) -> None:
    res = run_cli(["confirm", "--study", "nope"], studies)
    assert res.returncode == 2 and "no study 'nope'" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = run_cli(["confirm", "--study", "fake", "--seeds", "0"], studies)
    assert res.returncode == 2 and "--seeds 0: must be positive" in res.stderr


def test_a_verl_confirmation_run_varies_every_seed_of_the_run() -> None:
    """verl has several seeds (data sampler, vLLM, actor/critic mini-batch shuffling); confirm sets them all, and
    skips every seed a tuning run used, verl's defaults (42) included."""
    from hpo.study._confirm import seed_key, seed_keys, seed_overrides
    from tests.hpo.backends.test_verl import SPACE_FILE, load_verl_space

    space = load_verl_space(SPACE_FILE)
    assert space.overrides["data.seed"] == 42  # the shipped space pins the sampler (verl's default: unseeded)
    keys = ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed",
            "critic.data_loader_seed")
    assert seed_keys(space) == keys and seed_key(space) == "data.seed"
    assert seed_overrides(space, 1003) == dict.fromkeys(keys, 1003)
    assert tuning_seeds(space) == {42}
    unpinned = load_verl_space(SPACE_FILE, overrides={k: v for k, v in space.overrides.items() if k != "data.seed"},
                               study={**space.raw["study"], "confirm": {"seed_base": 41}})
    assert tuning_seeds(unpinned) == {42} and confirm_seeds(unpinned, 2) == [41, 43]  # rollout.seed's default
    one = load_verl_space(SPACE_FILE, study={**space.raw["study"], "confirm": {"seed_key": "data.seed"}})
    assert seed_overrides(one, 7) == {"data.seed": 7}
