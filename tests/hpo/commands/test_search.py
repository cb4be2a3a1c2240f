"""``verl-hpo search`` (``hpo/commands/_search.py``) through the real CLI: the study's name and storage are checked
before anything is made (one line, exit 2, no studies directory left behind), and ``--study`` and ``--n-trials``
name the study and its target (a second search of the study continues it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.hpo.conftest import fake_space, load, run_cli


@pytest.mark.parametrize(("flags", "line"), [
    (["--study", "a/b"], "error: --study 'a/b': a study name is 1-100 letters, digits, '.', '_' or '-', starting "
                         "with a letter or digit"),
    (["--storage", "nosuch://x"], "error: --storage nosuch://x: not a usable database URL (Can't load plugin: "
                                  "sqlalchemy.dialects:nosuch)"),
    (["--n-trials", "0"], "error: --n-trials 0: must be positive"),
])
def test_a_bad_name_storage_or_target_is_one_line_and_nothing_is_made(tmp_path: Path, studies: Path,
                                                                      flags: list[str], line: str) -> None:
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), *flags], studies)
    assert (res.returncode, res.stdout, res.stderr.strip().splitlines()) == (2, "", [line])
    assert not studies.exists()


def test_the_study_is_named_and_sized_by_the_flags_and_a_second_search_continues_it(tmp_path: Path,
                                                                                   studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2,
                                            "fake.step_s": 0.01}, study={"n_trials": 5})
    res = run_cli(["search", "--space", str(space), "--study", "mine", "--n-trials", "1"], studies)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"study mine: 0/1 finished trials; storage sqlite:///{studies / 'mine.db'}")
    assert [t.state for t in load(studies, "mine").trials] == [TrialState.COMPLETE]
    again = run_cli(["search", "--space", str(space), "--study", "mine", "--n-trials", "2"], studies)
    assert again.returncode == 0 and again.stdout.startswith("study mine: 1/2 finished trials"), again.stdout
    assert len(load(studies, "mine").trials) == 2 and not (studies / "fake.db").exists()
