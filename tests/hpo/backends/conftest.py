"""Fixtures the backend tests share: the real-verl study that runs once per session (``make test-slow``)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def verl_study(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Four real verl trials (:func:`tests.hpo.backends.verl.test_real.shared_study`), started by the first test that
    asks for them and read by every other: ``verl/test_real.py``'s and the contract suite's ``best``."""
    from tests.hpo.backends.verl.test_real import shared_study

    return shared_study(tmp_path_factory)
