"""The study page itself (``hpo/reporting/_page.py``; drawn in a browser: ``test_dashboard.py``): written whole or not
at all at a path that is new or a regular file (a FIFO put there is left alone and nothing half-written stays), the
seed-confirmed ranking only once a confirmation run finished, and a trial's text shown as text."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.analysis import OutputRefused
from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from hpo.reporting._page import build_html, confirmed_html, write_dashboard

optuna.logging.set_verbosity(optuna.logging.WARNING)
X = {"x": FloatDistribution(0, 1)}
XSS = "<script>window.__xss=1</script>"


def study_of(tmp_path: Path) -> optuna.Study:
    study = optuna.create_study(study_name="page", storage=f"sqlite:///{tmp_path / 'page.db'}", direction="maximize")
    study.add_trial(create_trial(value=0.9, params={"x": 0.3}, distributions=X))
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=float("-inf"), params={"x": 0.9}, distributions=X,
                                 user_attrs={"fail_reason": "crash", "error": XSS}))
    return study


def test_the_page_is_written_whole_at_a_new_path_or_over_a_regular_file(tmp_path: Path) -> None:
    study = study_of(tmp_path)
    out = write_dashboard(study, tmp_path / "site" / "page.html", storage_url="sqlite:///page.db")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert XSS not in text and "&lt;script&gt;window.__xss=1&lt;/script&gt;" in text  # the trial's text as text
    out.write_text("an older page")
    again = write_dashboard(study, out, storage_url="sqlite:///page.db").read_text()
    assert again.startswith("<!DOCTYPE html>") and "an older page" not in again  # replaced whole (its time is new)
    fifo = tmp_path / "site" / "fifo.html"
    os.mkfifo(fifo)
    with pytest.raises(OutputRefused):
        write_dashboard(study, fifo, storage_url="sqlite:///page.db")
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["fifo.html", "page.html"]  # no .tmp left


def test_the_confirmed_ranking_shows_once_a_confirmation_run_finished(tmp_path: Path) -> None:
    study = study_of(tmp_path)
    assert confirmed_html(study) == "" and 'id="confirmed"' not in build_html(
        study, storage_url="sqlite:///page.db", out_dir=tmp_path)
    for seed, value in ((1000, 0.8), (1001, 0.85)):
        study.add_trial(create_trial(value=value, params={"x": 0.3}, distributions=X,
                                     system_attrs={ATTR_CONFIRM_OF: 0, ATTR_CONFIRM_SEED: seed}))
    table = confirmed_html(study)
    assert 'id="confirmed"' in table and '<tr data-confirmed="0"><td>0</td><td>0.9</td><td>0.825</td>' in table
    assert "<td>1000, 1001</td>" in table
