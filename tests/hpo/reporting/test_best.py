"""What ``verl-hpo best`` prints (``hpo/reporting/_best.py``), on real Optuna studies of the fake experiment: the best
trial's overrides on stdout with its header on stderr (a trial whose trainer dropped rows says so), another trial by
number, nothing to show as :class:`NoBest` with its exit code (2 a bad flag, 1 no trial yet), a pareto study's front,
and after ``confirm`` the best confirmed mean, not the luckiest tuning run."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.backends import load_space
from hpo.experiment import Space
from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from hpo.reporting._best import NoBest, print_best
from tests.hpo.conftest import fake_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
X = {"x": FloatDistribution(0, 1)}


def hint(cmd: str) -> str:
    return f"verl-hpo {cmd} --study s"


def searched(values: list[float], **user: object) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for i, v in enumerate(values):
        study.add_trial(create_trial(value=v, params={"x": v / 10}, distributions=X,
                                     user_attrs=user if i == len(values) - 1 else {}))
    study.add_trial(create_trial(state=TrialState.PRUNED, params={"x": 0.05}, distributions=X))
    return study


@pytest.fixture
def space(tmp_path: Path) -> Space:
    return load_space(str(fake_space(tmp_path)), check=False)


def test_the_best_trial_s_overrides_and_its_header(space: Space, capsys: pytest.CaptureFixture[str]) -> None:
    study = searched([0.2, 0.9, 0.5], dropped_rows=3, dropped_rows_error="TypeError: content is None")
    assert print_best(space, study, "s", "overrides", None, hint) == 0
    out, err = capsys.readouterr()
    assert out == "fake.x=0.09\n"
    assert err.splitlines()[0].startswith("# trial 1 of study s (maximize eval/reward_mean): ")
    assert err.splitlines()[0].endswith("=0.9")
    assert print_best(space, study, "s", "yaml", 2, hint) == 0  # another trial, by number
    out, err = capsys.readouterr()
    assert yaml.safe_load(out) == {"fake": {"x": 0.05}}
    assert "# trial 2 lost 3 row(s) of its data" in err and "(first: TypeError: content is None)" in err


def test_nothing_to_show_is_no_best_with_its_exit_code(space: Space) -> None:
    study = searched([0.2])
    for number in (3, 99):  # a pruned trial, a trial that is not there
        with pytest.raises(NoBest) as err:
            print_best(space, study, "s", "overrides", number, hint)
        assert (str(err.value), err.value.code) == (
            f"--trial {number}: no completed trial with that number in study 's'", 2)
    with pytest.raises(NoBest) as err:
        print_best(space, study, "s", "schedule", None, hint)
    assert err.value.code == 2 and "is not a pbt study" in str(err.value)
    with pytest.raises(NoBest) as err:
        print_best(space, optuna.create_study(direction="maximize"), "s", "overrides", None, hint)
    assert (str(err.value), err.value.code) == ("study 's' has no feasible completed trial with a finite value yet", 1)


def test_after_confirm_the_best_confirmed_mean_wins(space: Space, capsys: pytest.CaptureFixture[str]) -> None:
    study = searched([0.9, 0.8])  # trial 0 was the lucky tuning run
    for of, seed, value in ((0, 1000, 0.5), (0, 1002, 0.55), (1, 1000, 0.79), (1, 1002, 0.81)):
        study.add_trial(create_trial(value=value, params=study.trials[of].params, distributions=X,
                                     system_attrs={ATTR_CONFIRM_OF: of, ATTR_CONFIRM_SEED: seed}))
    assert print_best(space, study, "s", "overrides", None, hint) == 0
    out, err = capsys.readouterr()
    assert out == "fake.x=0.08\n"
    assert err.startswith("# trial 1 of study s (maximize eval/reward_mean): confirmed mean 0.8 +- 0.0141 over 2 "
                          "fresh seed(s) (min 0.79, max 0.81; tuning run 0.8); ranking by confirmed mean:"), err


def test_a_pareto_study_prints_its_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fake_space(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["objective"] = {"mode": "pareto", "objectives": [{"metric": "eval/reward_mean", "direction": "maximize"},
                                                         {"metric": "eval/toxicity_mean", "direction": "minimize"}]}
    path.write_text(yaml.safe_dump(raw))
    space = load_space(str(path), check=False)
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values, x in (([0.9, 0.5], 0.1), ([0.5, 0.1], 0.2), ([0.4, 0.6], 0.3)):  # the third is dominated
        study.add_trial(create_trial(values=values, params={"x": x}, distributions=X))
    assert print_best(space, study, "s", "overrides", None, hint) == 0
    out, err = capsys.readouterr()
    assert err.startswith("# pareto front of study s (") and "verl-hpo best --study s --trial N" in err
    rows = out.strip().splitlines()
    assert len(rows) == 3 and "0.3" not in out  # a header and the two trials of the front
