"""What ``confirm`` and ``best`` say under the confirmed table: ties at the confirmed spread and the preferred setting,
no tie for clearly different settings, the better mean kept (and said) when two are not separated but more than the
resolution apart, and the improvement over the baseline with its interval."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna

from hpo.backends import load_space
from hpo.record import ATTR_RACE, ATTR_SPACE
from hpo.reporting._report import confirmed_table
from hpo.reporting._verdict import verdict_lines
from hpo.study._compare import RULE, welch
from hpo.study._confirm import confirm_seeds
from tests.hpo.conftest import PY, cli_env, fake_space
from tests.hpo.study.compare.test_ties import FAST, SLOW, _study, seed0_study


def test_overlapping_settings_are_reported_as_tied_with_the_preferred_one(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path)), check=False)
    study = _study({1e-3: [(0.965, SLOW), (0.950, SLOW), (0.962, SLOW)],
                    1e-5: [(0.960, FAST), (0.952, FAST), (0.958, FAST)]})
    lines = verdict_lines(study, space)
    assert "trial 0 vs trial 4: confirmed difference" in lines[0] and "(paired 95% on 3 shared seeds)" in lines[0]
    assert lines[0].endswith("cannot be told apart, within the resolution 0.00959 of it")
    assert lines[1].startswith("trials 0, 4 are not separated after 3 seeds and within the resolution 0.00959 of the "
                               f"best mean; preferring trial 4 by the rule {RULE}")
    assert "trial 4: 0 bad run(s), 10 steps to plateau" in lines[1] and "trial 0: 0 bad run(s), 30 steps" in lines[1]


def test_clearly_different_settings_are_not_reported_as_tied(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path)), check=False)
    study = _study({1e-3: [(0.97, SLOW), (0.968, SLOW), (0.972, SLOW)],
                    1e-5: [(0.90, FAST), (0.905, FAST), (0.895, FAST)]})
    lines = verdict_lines(study, space)
    assert lines[0].endswith("trial 0 is better")
    assert lines[1] == "trial 0 is better than every other confirmed setting (paired 95% intervals exclude 0)"
    assert not any("cannot be told apart" in line for line in lines)


def test_the_improvement_over_the_baseline_and_its_interval(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path, study={"baseline": {"fake.x": 0.9}})), check=False)
    pick, base = [0.96, 0.95, 0.97], [0.80, 0.78, 0.85]
    study = _study({1e-5: [(v, FAST) for v in pick]}, baseline=tuple(base))
    line = verdict_lines(study, space)[-1]
    d = welch(pick, base)
    assert d is not None and d.low > 0
    assert line.startswith("improvement of trial 0 over the baseline (fake.x=0.9; mean 0.81 +- 0.036")
    assert f"on seeds 1000, 1001, 1002: validation {d.text()} (Welch 95%): the search pays" in line
    table = confirmed_table(study, space).splitlines()
    assert table[-1].split()[:3] == ["baseline", "-", "0.81"] and table[-1].split()[-1] == "(config)"  # no lr in it
    close = _study({1e-5: [(0.82, FAST), (0.79, FAST), (0.84, FAST)]}, baseline=tuple(base))
    assert verdict_lines(close, space)[-1].endswith("cannot be told apart from the baseline at this spread")


def _race(study: optuna.Study, candidates: list[int], seeds: int, resolution: float | None = None) -> None:
    """The race's settings as ``confirm`` stores them (:func:`hpo.study._compare.start_race`)."""
    study._storage.set_study_system_attr(study._study_id, ATTR_RACE, {
        "candidates": candidates, "max_seeds": seeds, "min_seeds": 2, "resolution": resolution})


def test_not_separated_and_more_than_the_resolution_apart_the_better_mean_is_recommended(tmp_path: Path) -> None:
    """Seed 0 of the search_cost re-run: before, 'trials 2, 4 cannot be told apart ...; preferring trial 4'."""
    space = load_space(str(fake_space(tmp_path, study={"confirm": {"race": True, "seeds": 2}})), check=False)
    a, b = confirm_seeds(space, 2)
    study = seed0_study((a, b))
    _race(study, [2, 4], 2)
    lines = verdict_lines(study, space)
    assert lines[0] == "racing confirmation ended at the seed cap (2): the candidates left are not separated after " \
                       "2 seed(s); leader trial 2"
    assert "trial 2 vs trial 4: confirmed difference +0.0895" in lines[2] and "(paired 95% on 2 shared seeds)" in \
        lines[2] and lines[2].endswith("not separated, but more than the resolution 0.00976 below trial 2")
    assert lines[3] == "not separated after 2 seeds: the recommendation is the better mean, trial 2 0.976 vs trial 4 " \
                       "0.8865 (more than the resolution 0.00976 apart: bad runs and steps to plateau decide only " \
                       "within it)"
    assert not any("preferring" in line for line in lines)
    wide = load_space(str(fake_space(tmp_path, study={"confirm": {"race": True, "seeds": 2, "resolution": 0.1}})),
                      check=False)
    _race(study, [2, 4], 2, 0.1)
    lines = verdict_lines(study, wide)
    assert any(line.startswith("trials 2, 4 are not separated after 2 seeds and within the resolution 0.1 of the best "
                               f"mean; preferring trial 4 by the rule {RULE}") for line in lines), lines


def test_best_recommends_the_better_mean_of_two_not_separated(tmp_path: Path) -> None:
    """As a user runs it: ``best`` on a SQLite study confirmed like seed 0 prints trial 2's overrides and says why."""
    from hpo.study._optuna import ATTR_SOURCE, _jsonable

    path = fake_space(tmp_path, study={"confirm": {"race": True, "seeds": 2}})
    space = load_space(str(path), check=False)
    studies = tmp_path / "studies"
    studies.mkdir()
    a, b = confirm_seeds(space, 2)
    study = seed0_study((a, b), storage=f"sqlite:///{studies / 'fake.db'}", name="fake")
    study.set_user_attr(ATTR_SPACE, _jsonable(space.raw))
    study.set_user_attr(ATTR_SOURCE, str(path))
    _race(study, [2, 4], 2)
    res = subprocess.run([PY, "-m", "hpo", "best", "--study", "fake", "--studies-dir", str(studies)], cwd=tmp_path,
                         env=cli_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["fake.x=0.2"] and res.stderr.startswith("# trial 2 of study fake")
    assert "# not separated after 2 seeds: the recommendation is the better mean, trial 2 0.976 vs trial 4 0.8865" \
        in res.stderr
