"""Progress lines without and with a TTY, the final table, and ``best`` rendering."""

from __future__ import annotations

import io
import math

import optuna
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.experiment._space import Objective, Param, Space
from hpo.reporting._report import Reporter, outcome, render_best, top_table
from hpo.reporting._summary import summary


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _study() -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dist = {"kl_coef": FloatDistribution(0.01, 0.2)}
    for v, attrs, state in [(0.5, {}, TrialState.COMPLETE), (0.7, {"stop_reason": "converged"}, TrialState.COMPLETE),
                            (-math.inf, {"fail_reason": "oom"}, TrialState.COMPLETE), (None, {}, TrialState.FAIL),
                            (0.1, {"stop_reason": "pruned"}, TrialState.PRUNED)]:
        study.add_trial(create_trial(state=state, value=v if state == TrialState.COMPLETE else None,
                                     params={"kl_coef": 0.05}, distributions=dist, user_attrs=attrs,
                                     intermediate_values={2: 0.1} if state == TrialState.PRUNED else None))
    return study


def test_table_orders_best_first_and_names_outcomes() -> None:
    study = _study()
    lines = top_table(study).splitlines()
    assert lines[0].split()[:3] == ["trial", "value", "outcome"]
    assert [ln.split()[0] for ln in lines[1:3]] == ["1", "0"]
    assert [outcome(t) for t in study.trials] == ["ok", "converged", "oom", "interrupted", "pruned"]


def test_a_surplus_trial_is_never_shown_as_interrupted() -> None:
    """A surplus ask (FAIL, never run, no params) is no trial of the study: not in the table, not in the counts;
    an interrupted trial and one the driver could not launch are named as what they are."""
    study = _study()
    for attrs in ({"stop_reason": "surplus"}, {"stop_reason": "surplus"}, {"stop_reason": "driver_error"}):
        study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=attrs))
    assert [outcome(t) for t in study.trials][3:] == ["interrupted", "pruned", "surplus", "surplus", "driver_error"]
    table = top_table(study)
    assert "surplus" not in table and len(table.splitlines()) == 1 + 6
    counts = next(ln for ln in summary(study, "sqlite:///x.db", "trials").splitlines() if ln.startswith("trials:"))
    assert "1 interrupted" in counts and "1 driver_error" in counts and "surplus" not in counts


def test_progress_without_and_with_tty() -> None:
    study = _study()
    plain = io.StringIO()
    rep = Reporter(plain, target=5)
    rep.trial_eval(3, 10, 60, 0.5, 0.4)
    rep.trial_tick(3, 11, 60, 0.4)  # no TTY: only evaluations are printed
    rep.trial_finished(study, study.trials[1], 2)
    text = plain.getvalue()
    assert "trial 3 step 10/60 objective 0.5 mem 0.40 GB" in text and "step 11" not in text
    assert "2/5 | best 0.7 (trial 1)" in text and "\r" not in text
    tty = _Tty()
    rep = Reporter(tty, target=5)
    rep.trial_tick(3, 11, 60, 0.4)
    assert "\r" in tty.getvalue() and "step 11/60" in tty.getvalue()


def test_render_best() -> None:
    space = Space(name="s", source="s.yaml", config="tiny_arith", overrides={"trainer.total_training_steps": 5},
                  params=(Param("kl_coef", "algorithm.kl_ctrl.kl_coef", "float", 0.01, 0.2),),
                  objective=Objective())
    trial = _study().trials[1]
    assert render_best(space, trial, "overrides") == "algorithm.kl_ctrl.kl_coef=0.05"
    assert yaml.safe_load(render_best(space, trial, "yaml")) == {"algorithm": {"kl_ctrl": {"kl_coef": 0.05}}}
    cmd = render_best(space, trial, "command")
    assert "--config tiny_arith trainer.total_training_steps=5 algorithm.kl_ctrl.kl_coef=0.05" in cmd
