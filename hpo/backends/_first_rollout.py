"""The environment by which the driver asks a trainer to record its first training step's rollout or to replay a
recorded one (``hpo.study._confirm._first_rollout``: a throughput study's strict same-math check). A trainer that
honours it (verl: ``hpo/backends/verl/in_verl/verl_hpo_first_rollout.py``) writes what it did into the report
directory; one that does not leaves it empty."""

from __future__ import annotations

from collections.abc import Mapping

RECORD_ENV = "VERL_HPO_FIRST_ROLLOUT_RECORD"  # a directory to record the first step's rollout into
REPLAY_ENV = "VERL_HPO_FIRST_ROLLOUT_REPLAY"  # a finished run's record to replay
REPORT_ENV = "VERL_HPO_FIRST_ROLLOUT_REPORT"  # where each process of the trainer says what it did


def first_rollout_asked(env: Mapping[str, str]) -> bool:
    """The driver asked this attempt to record or to replay its first rollout."""
    return bool(env.get(RECORD_ENV) or env.get(REPLAY_ENV))
