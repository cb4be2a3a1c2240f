"""The environment by which the driver asks a trainer to record or replay its first training step's rollout
(``hpo/backends/_first_rollout.py``): asked when either variable is set, and named as the module loaded inside verl's
processes reads them (that module imports nothing of the project, so only this test holds the two together)."""

from __future__ import annotations

import importlib.util

from hpo.backends._first_rollout import RECORD_ENV, REPLAY_ENV, REPORT_ENV, first_rollout_asked
from tests.hpo.conftest import ROOT

IN_VERL = ROOT / "hpo" / "backends" / "verl" / "in_verl" / "verl_hpo_first_rollout.py"


def test_asked_when_a_record_or_a_replay_is_named() -> None:
    assert not first_rollout_asked({}) and not first_rollout_asked({RECORD_ENV: "", REPORT_ENV: "/r"})
    assert first_rollout_asked({RECORD_ENV: "/rec"}) and first_rollout_asked({REPLAY_ENV: "/rec"})


def test_the_names_are_those_the_module_in_verl_reads() -> None:
    spec = importlib.util.spec_from_file_location("verl_hpo_first_rollout_names", IN_VERL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # neither variable set here: it patches nothing
    assert (module.RECORD_ENV, module.REPLAY_ENV, module.REPORT_ENV) == (RECORD_ENV, REPLAY_ENV, REPORT_ENV)
