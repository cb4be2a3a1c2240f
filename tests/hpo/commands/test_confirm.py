"""``verl-hpo confirm`` (``hpo/commands/_confirm.py``): the top configurations re-run with fresh seeds as tagged trials
of the same study, and ``best`` ranking by the confirmed mean; its input errors one line. Real CLI, real SQLite study,
the fake trainer (whose final value moves with ``trainer.seed`` by up to ``fake.seed_noise``). Which seeds:
``tests/hpo/study/confirm/test_seeds.py``."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.hpo.conftest import fake_space, load, run_cli

NOISE = 0.3


def fake_value(x: float, seed: int) -> float:
    return 1.0 - (x - 0.3) ** 2 + NOISE * random.Random(seed).uniform(-1, 1)


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
