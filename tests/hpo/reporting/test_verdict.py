"""What ``confirm`` and ``best`` say under the confirmed table: ties at the confirmed spread and the preferred setting,
no tie for clearly different settings, and the improvement over the baseline with its interval."""

from __future__ import annotations

from pathlib import Path

from hpo.backends import load_space
from hpo.reporting._report import confirmed_table
from hpo.reporting._verdict import verdict_lines
from hpo.study._compare import RULE, welch
from tests.hpo.conftest import fake_space
from tests.hpo.study.test_compare import FAST, SLOW, _study


def test_overlapping_settings_are_reported_as_tied_with_the_preferred_one(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path)), check=False)
    study = _study({1e-3: [(0.965, SLOW), (0.950, SLOW), (0.962, SLOW)],
                    1e-5: [(0.960, FAST), (0.952, FAST), (0.958, FAST)]})
    lines = verdict_lines(study, space)
    assert "trial 0 vs trial 4: confirmed difference" in lines[0] and lines[0].endswith("cannot be told apart")
    assert lines[1].startswith("trials 0, 4 cannot be told apart at the confirmed spread; preferring trial 4 by "
                               f"the rule {RULE}")
    assert "trial 4: 0 bad run(s), 10 steps to plateau" in lines[1] and "trial 0: 0 bad run(s), 30 steps" in lines[1]


def test_clearly_different_settings_are_not_reported_as_tied(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path)), check=False)
    study = _study({1e-3: [(0.97, SLOW), (0.968, SLOW), (0.972, SLOW)],
                    1e-5: [(0.90, FAST), (0.905, FAST), (0.895, FAST)]})
    lines = verdict_lines(study, space)
    assert lines[0].endswith("trial 0 is better")
    assert lines[1] == "trial 0 is better than every other confirmed setting (Welch 95% intervals exclude 0)"
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
