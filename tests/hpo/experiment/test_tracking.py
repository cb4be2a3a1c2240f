"""The ``tracking:`` section of an experiment file and ``--tracking`` (:mod:`hpo.experiment._tracking`): defaults,
bad input as one line naming the file (or flag), key and value, a credential in a stored URI refused and never shown,
the flags replacing the section. Whether the trackers can be used is ``tests/hpo/tracking/test_check.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpo.backends import load_space
from hpo.experiment._space import SpaceError
from hpo.experiment._tracking import (
    MlflowSpec,
    TrackingSpec,
    WandbSpec,
    apply_flags,
    parse_tracking,
    redact_uri,
    uri_password,
)
from tests.hpo.conftest import fake_space

SECRET = "s3cr3t-pw"


def _load(tmp_path: Path, tracking: Any) -> TrackingSpec:
    return load_space(str(fake_space(tmp_path, tracking=tracking)), check=False).tracking


def test_the_section_parses_with_defaults(tmp_path: Path) -> None:
    assert _load(tmp_path, None) == TrackingSpec() and not TrackingSpec().enabled
    spec = _load(tmp_path, {"mlflow": {"uri": "http://h:5000"}, "wandb": {}})
    assert spec.mlflow == MlflowSpec(uri="http://h:5000", experiment="verl-hpo")
    assert spec.wandb == WandbSpec(project="verl-hpo", entity=None, mode="online", dir=None)
    assert spec.flush_s == 60.0


@pytest.mark.parametrize(("tracking", "where", "shown"), [
    ({"mlflow": {"uri": "ftp://h"}}, "tracking.mlflow.uri", "'ftp://h'"),
    ({"mlflow": {"uri": f"http://me:{SECRET}@h:5000"}}, "tracking.mlflow.uri", "MLFLOW_TRACKING_PASSWORD"),
    ({"mlflow": {"experiment": ""}}, "tracking.mlflow.experiment", "''"),
    ({"mlflow": {"url": "http://h"}}, "tracking.mlflow.url", "unknown field"),
    ({"wandb": {"mode": "dryrun"}}, "tracking.wandb.mode", "'dryrun'"),
    ({"wandb": {"project": "a b/c"}}, "tracking.wandb.project", "'a b/c'"),
    ({"wandb": "yes"}, "tracking.wandb", "'yes'"),
    ({"flush_s": -1}, "tracking.flush_s", "-1"),
    ({"neptune": {}}, "tracking.neptune", "unknown field"),
])
def test_bad_sections_are_one_line_naming_file_key_value(tmp_path: Path, tracking: Any, where: str,
                                                         shown: str) -> None:
    with pytest.raises(SpaceError) as info:
        _load(tmp_path, tracking)
    msg = str(info.value)
    assert msg.count("\n") == 0 and msg.startswith(str(tmp_path / "fake.yaml")) and where in msg and shown in msg
    assert SECRET not in msg


def test_flags_replace_the_section() -> None:
    base = TrackingSpec(mlflow=MlflowSpec(uri="http://a:1", experiment="e"), flush_s=5)
    spec = apply_flags(base, ["mlflow=http://u:pw@b:2", "wandb=offline"], SpaceError)
    assert spec.mlflow == MlflowSpec(uri="http://u:pw@b:2", experiment="e") and spec.wandb is not None
    assert spec.wandb.mode == "offline" and spec.flush_s == 5
    assert apply_flags(spec, ["off"], SpaceError) == TrackingSpec(flush_s=5)
    with pytest.raises(SpaceError, match="expected mlflow"):
        apply_flags(base, ["neptune"], SpaceError)
    with pytest.raises(SpaceError) as info:
        apply_flags(base, [f"mlflow=gopher://u:{SECRET}@h"], SpaceError)
    assert SECRET not in str(info.value) and "u:***@h" in str(info.value)
    assert redact_uri(f"https://u:{SECRET}@h:1/p") == "https://u:***@h:1/p"


def _error(where: str, msg: str) -> SpaceError:
    return SpaceError(f"{where}: {msg}")


def test_a_stored_uri_with_a_query_token_is_refused_and_a_flag_uri_with_one_is_taken() -> None:
    """The section is stored with the study: a credential anywhere in its URI (here ``?token=``) is refused, its value
    never in the line; the same URI through ``--tracking`` is never stored, so it is taken as it is."""
    uri = f"https://mlflow.example/api?token={SECRET}"
    with pytest.raises(SpaceError) as info:
        parse_tracking({"mlflow": {"uri": uri}}, _error)
    assert str(info.value).startswith("tracking.mlflow.uri: ") and SECRET not in str(info.value)
    assert "token=***" in str(info.value)
    assert apply_flags(TrackingSpec(), [f"mlflow={uri}"], SpaceError).mlflow == MlflowSpec(uri=uri)
    assert uri_password(uri) == SECRET and uri_password("http://h:5000") is None


def test_a_uri_that_is_not_text_is_refused_without_showing_it() -> None:
    with pytest.raises(SpaceError, match=r"^tracking.mlflow.uri: expected a non-empty string, got a list$"):
        parse_tracking({"mlflow": {"uri": ["http://u:pw@h"]}}, _error)


def test_the_spec_round_trips_through_json_for_the_tracking_process() -> None:
    spec = parse_tracking({"mlflow": {"uri": "sqlite:///m.db", "experiment": "exp.1"},
                           "wandb": {"project": "p", "entity": "team", "mode": "offline", "dir": "/tmp/wb"},
                           "flush_s": 0}, _error)
    assert spec.enabled and spec.flush_s == 0.0
    assert TrackingSpec.from_json(spec.to_json()) == spec
    assert TrackingSpec.from_json({}) == TrackingSpec()
