"""A space of hundreds of parameters: the page draws the most important :data:`MAX_PLOT_PARAMS` of them in Optuna's
plots (whose cost grows with the square of the parameters drawn: 1,000 parameters took 58 s, 7,500 over the
page's 300 s), says so in a caption, and keeps every parameter in the trials table."""

from __future__ import annotations

import random
import warnings

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from hpo.reporting._figures import MAX_CONTOUR_PARAMS, MAX_PLOT_PARAMS, build_panels
from hpo.reporting._page import build_html
from hpo.study._optuna import ATTR_SPACE

N_PARAMS = 400
KEY = "p237"  # the objective is this parameter alone: the most important one


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    names = [f"p{i}" for i in range(N_PARAMS)]
    study.set_user_attr(ATTR_SPACE, {"params": {n: {"key": f"fake.{n}", "type": "float", "low": 0.0, "high": 1.0}
                                                for n in names}, "objective": {"metric": "eval/reward_mean"}})
    dists = {n: FloatDistribution(0.0, 1.0) for n in names}
    rng = random.Random(0)
    for _ in range(40):
        params = {n: rng.random() for n in names}
        study.add_trial(create_trial(params=params, distributions=dists, value=params[KEY],
                                     intermediate_values={0: 0.0, 2: params[KEY]}))
    return study


def test_a_large_space_draws_its_most_important_parameters(tmp_path: object) -> None:
    """What keeps the page's cost bounded: the plots draw MAX_PLOT_PARAMS parameters, not the 400 (the plots' time
    is a benchmark's matter)."""
    study = _study()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        panels = {p.key: p for p in build_panels(study)}
    importances = panels["importances"].figure
    assert importances is not None, panels["importances"].reason
    shown = list(importances.data[0].y)
    assert len(shown) == MAX_PLOT_PARAMS and KEY in shown
    axes = panels["parallel"].figure.layout.xaxis.ticktext  # the objective's axis, then the parameters'
    assert len(axes) == MAX_PLOT_PARAMS + 1 and KEY in axes
    slice_ = panels["slice"].figure
    assert len({t.xaxis for t in slice_.data}) == MAX_PLOT_PARAMS
    for key in ("importances", "parallel", "slice"):
        assert f"most important of {N_PARAMS} parameters" in panels[key].caption
    contour = panels["contour"].figure.layout.to_plotly_json()  # every pair: MAX_CONTOUR_PARAMS^2 panels, not 400^2
    assert len([k for k in contour if k.startswith("xaxis")]) == MAX_CONTOUR_PARAMS ** 2


def test_a_small_space_draws_every_parameter() -> None:
    study = optuna.create_study(direction="minimize")
    for v in (0.1, 0.5, 0.9):
        study.add_trial(create_trial(params={"a": v, "b": 1 - v}, value=v,
                                     distributions={"a": FloatDistribution(0, 1), "b": FloatDistribution(0, 1)}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        panels = {p.key: p for p in build_panels(study)}
    assert sorted(panels["importances"].figure.data[0].y) == ["a", "b"] and not panels["slice"].caption


def test_the_table_keeps_every_parameter(tmp_path: object) -> None:
    page = build_html(_study(), storage_url="sqlite:///x.db", out_dir=tmp_path)  # type: ignore[arg-type]
    assert f">p{N_PARAMS - 1}<" in page
