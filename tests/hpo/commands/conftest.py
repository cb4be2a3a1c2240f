"""Shared by the subcommands' tests: a finished study of the fake trainer (``tests/hpo/fake_trainer.py``), searched
once per session through the real CLI, and a copy of it for a test that changes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.hpo.conftest import fake_space, run_cli


@pytest.fixture(scope="session")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A studies directory holding study ``fake``: three finished trials of the fake experiment (``fake.yaml``
    beside it), searched with ``verl-hpo search``. Read it; copy it (:func:`searched_copy`) to change it."""
    root = tmp_path_factory.mktemp("searched")
    space = fake_space(root, overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2,
                                        "fake.step_s": 0.01})
    res = run_cli(["search", "--space", str(space)], root / "studies")
    assert res.returncode == 0, res.stderr
    return root / "studies"


@pytest.fixture
def searched_copy(searched: Path, tmp_path: Path) -> Path:
    """A studies directory of this test's own holding a copy of :func:`searched`'s study."""
    studies = tmp_path / "studies"
    shutil.copytree(searched, studies, ignore=shutil.ignore_patterns("*.lock"))
    return studies
