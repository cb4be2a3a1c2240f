"""``verl-hpo track`` (``hpo/commands/_track.py``) through the real CLI: a study that has no tracking section and no
``--tracking`` flag has nothing to log (one line naming how to name a tracker), and neither has a study that is not
there. What the tracking process logs: ``tests/hpo/tracking/``."""

from __future__ import annotations

from pathlib import Path

from tests.hpo.conftest import run_cli


def test_a_study_without_a_tracker_is_one_line_naming_the_flag(searched: Path) -> None:
    res = run_cli(["track", "--study", "fake"], searched)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr.strip().splitlines() == ["error: study 'fake' has no tracking section; name a tracker with "
                                               "--tracking mlflow=URI or --tracking wandb"]


def test_a_study_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    res = run_cli(["track", "--study", "nope"], tmp_path / "studies")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no study 'nope'" in res.stderr
