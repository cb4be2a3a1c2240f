"""``verl-hpo dashboard`` (``hpo/commands/_dashboard.py``) through the real CLI: the study's page written at its
default path or at ``--out`` (a new path, or a regular file replaced), and a study that is not there is one line that
writes nothing. Paths that are not a regular file: ``test_output_paths.py``; the page itself:
``tests/hpo/reporting/test_dashboard.py``."""

from __future__ import annotations

from pathlib import Path

from tests.hpo.conftest import run_cli


def test_the_page_is_written_at_its_default_path_or_at_out(searched_copy: Path, tmp_path: Path) -> None:
    page = searched_copy / "fake" / "dashboard.html"
    page.unlink()
    res = run_cli(["dashboard", "--study", "fake"], searched_copy)
    assert res.returncode == 0, res.stderr
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "fake" in text and "</html>" in text
    mine = tmp_path / "mine.html"
    mine.write_text("an older page")
    res = run_cli(["dashboard", "--study", "fake", "--out", str(mine)], searched_copy)
    assert res.returncode == 0 and mine.read_text().startswith("<!DOCTYPE html>"), res.stderr


def test_a_study_that_is_not_there_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    res = run_cli(["dashboard", "--study", "nope", "--out", str(out)], tmp_path / "studies")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no study 'nope'" in res.stderr
    assert not out.exists()
