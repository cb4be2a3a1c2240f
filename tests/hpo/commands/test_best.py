"""``verl-hpo best`` (``hpo/commands/_best.py``) through the real CLI on a finished study: the best trial's overrides
on stdout (its header on stderr), each format, another trial by number, and each refusal one line with its exit code
(2 a bad flag or study, 1 nothing to show). What it prints in each kind of study: ``tests/hpo/reporting/``."""

from __future__ import annotations

from pathlib import Path

import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import load, run_cli


def test_best_prints_the_best_trial_s_overrides_and_its_header(searched: Path) -> None:
    trials = [t for t in load(searched, "fake").trials if t.state == TrialState.COMPLETE]
    best = max(trials, key=lambda t: t.value)
    res = run_cli(["best", "--study", "fake"], searched)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"fake.x={best.params['x']!r}\n"
    assert res.stderr.startswith(f"# trial {best.number} of study fake (maximize eval/reward_mean): ")
    as_yaml = run_cli(["best", "--study", "fake", "--format", "yaml"], searched)
    assert yaml.safe_load(as_yaml.stdout) == {"fake": {"x": best.params["x"]}}
    worst = min(trials, key=lambda t: t.value)
    other = run_cli(["best", "--study", "fake", "--trial", str(worst.number)], searched)
    assert other.returncode == 0 and other.stdout == f"fake.x={worst.params['x']!r}\n"


def test_each_refusal_is_one_line_with_its_exit_code(searched: Path, tmp_path: Path) -> None:
    for args, code, line in (
            (["--study", "fake", "--trial", "99"], 2, "error: --trial 99: no completed trial with that number in "
                                                      "study 'fake'"),
            (["--study", "fake", "--format", "schedule"], 2, "error: --format schedule: study 'fake' is not a pbt "
                                                             "study (study.strategy: pbt)"),
            (["--study", "nope"], 2, None)):
        res = run_cli(["best", *args], searched)
        assert (res.returncode, res.stdout) == (code, ""), res.stderr
        (said,) = res.stderr.strip().splitlines()
        assert said == line if line else "no study 'nope'" in said, said
