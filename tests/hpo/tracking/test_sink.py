"""The trackers' common interface (:mod:`hpo.tracking._sink`): every tracker offers each operation of :class:`Sink`,
and the :class:`Cursors` a tracker keeps per chain (its run id, the last step logged) only ever move forward and live
in the state dict they were given (what the tracking process saves as ``<spool>.state.json``)."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

from hpo.tracking._sink import Cursors, Sink

SINK_METHODS = [name for name, member in vars(Sink).items()
                if not name.startswith("_") and inspect.isfunction(member)]


def test_a_chain_s_cursor_starts_before_step_0_and_never_moves_back() -> None:
    cursors = Cursors({})
    assert cursors.step(3) == -1  # nothing logged: step 0 is past it
    cursors.advance(3, 5)
    cursors.advance(3, 2)  # a retry's earlier steps: never logged twice
    assert cursors.step(3) == 5 and cursors.step(4) == -1
    cursors.chain(4)["run"] = "abc"
    cursors.advance(4, 0)
    assert cursors.chain(4) == {"run": "abc", "step": 0}


def test_cursors_write_into_the_state_they_were_given_and_survive_a_json_round_trip() -> None:
    state: dict[str, object] = {}
    first = Cursors(state)
    first.advance(7, 12)
    first.raw["study_run"] = "r-1"
    again = Cursors(json.loads(json.dumps(state)))  # the tracking process's next start reads its state file
    assert again.step(7) == 12 and again.raw["study_run"] == "r-1"
    again.advance(7, 13)
    assert again.raw["chains"] == {"7": {"step": 13}}


@pytest.mark.parametrize(("module", "cls"), [("hpo.tracking._mlflow", "MlflowSink"),
                                             ("hpo.tracking._wandb", "WandbSink")])
def test_every_tracker_offers_every_operation_of_the_interface(module: str, cls: str) -> None:
    pytest.importorskip(module.rsplit("_", 1)[-1])  # mlflow / wandb: the [tracking] extra
    sink = getattr(importlib.import_module(module), cls)
    assert {"open_run", "log_steps", "finish_run", "update_study", "upload_page", "close", "transient"} <= set(
        SINK_METHODS)
    for name in SINK_METHODS:
        ours, theirs = inspect.signature(getattr(Sink, name)), inspect.signature(getattr(sink, name))
        assert list(theirs.parameters) == list(ours.parameters), (cls, name)
    assert isinstance(sink.name, str) and sink.name in module
