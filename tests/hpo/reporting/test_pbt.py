"""A population-based training study as reported (``hpo/reporting/_pbt.py``): on the dashboard (lineage tree,
members' curves, the best schedule, the lineage table), drawn in a real browser like the other pages, and in
``best``'s lineage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from hpo.backends import load_space
from hpo.reporting._page import write_dashboard
from hpo.reporting._pbt import best_lineage, render_pbt_best
from hpo.study._population import Population
from tests.hpo.conftest import write
from tests.hpo.reporting.test_dashboard import _open, browser  # noqa: F401 - the fixture
from tests.hpo.study.test_population import SPACE, run_waiting


def pbt_study(tmp_path: Path) -> optuna.Study:
    """Four members over three segments: member 0 exploits member 3 at step 10, member 2 collapses at step 20 and
    rolls back."""
    space = load_space(str(write(tmp_path / "pbt.yaml", SPACE)), check=False)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="p", storage=f"sqlite:///{tmp_path}/p.db", direction="maximize")
    study.set_user_attr("hpo:space", space.raw)
    pop = Population(space, study, tmp_path / "p", 30)
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.1, 1: 0.5, 2: 0.6, 3: 0.9})
    pop.schedule(study.get_trials())
    run_waiting(study, pop, {0: 0.95, 1: 0.4, 2: 0.1, 3: 0.8}, stop={2: "collapsed:nan"})
    for values in ({0: 0.96, 1: 0.5, 2: 0.7, 3: 0.81}, {0: 0.97, 1: 0.5, 2: 0.72, 3: 0.82},
                   {0: 0.97, 1: 0.5, 2: 0.72, 3: 0.82}):
        pop.schedule(study.get_trials())
        run_waiting(study, pop, values)
    assert pop.schedule(study.get_trials()) is True
    return study


def test_pbt_page_in_browser(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    study = pbt_study(tmp_path)
    out = write_dashboard(study, tmp_path / "p" / "dashboard.html", storage_url=f"sqlite:///{tmp_path}/p.db",
                          studies_dir=tmp_path)
    info = _open(browser, out, "dashboard_pbt.png")
    assert info["errors"] == [] and info["foreign"] == []
    drawn = {s["key"] for s in info["sections"] if s["plot"]}
    assert {"pbt-lineage", "pbt-curves", "pbt-schedule"} <= drawn, info["sections"]
    plots = {p["id"]: p for p in info["plots"]}
    assert all(p["drawn"] > 0 for p in plots.values()), plots
    text = info["text"]
    assert f"PBT lineage ({len(study.trials)} segments)" in text
    for word in ("exploit", "rollback", "collapsed:nan", "continue"):
        assert word in text, word


def test_best_shows_the_winning_lineage_and_schedule(tmp_path: Path) -> None:
    study = pbt_study(tmp_path)
    space = load_space(str(tmp_path / "pbt.yaml"), check=False)
    found = best_lineage(space, study)
    assert found is not None and found["member"] == 0 and found["value"] == 0.96 and found["end"] == 30
    assert [x["action"] for x in found["lineage"]] == ["start", "exploit", "continue"]
    assert found["lineage"][0]["member"] == 3  # the donor's first segment is where member 0's weights come from
    header, out = render_pbt_best(space, found, "overrides")
    assert "schedule (values by step range)" in header and "steps 0-10:" in header
    assert out.startswith("actor_rollout_ref.actor.optim.lr=")
