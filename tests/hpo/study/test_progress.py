"""What the study loop tells a person while it runs (``hpo/study/_progress.py``: the :class:`Progress` protocol the loop
holds, so that it never imports the reporting layer). Each implementation answers every call of the protocol with its
parameters (the console's :class:`hpo.reporting.Reporter`, the tracked one that also writes the tracking spool), and
the console prints what a trial's run tells it."""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import optuna
import pytest

from hpo.reporting import Reporter
from hpo.study import Progress
from hpo.tracking._feed import _TrackedProgress
from tests.hpo.study.test_trial import run_one

CALLS = [name for name, _ in inspect.getmembers(Progress, inspect.isfunction) if not name.startswith("_")]


def test_the_protocol_is_what_the_loop_calls() -> None:
    assert CALLS == ["note", "trial_eval", "trial_finished", "trial_started", "trial_tick"]


@pytest.mark.parametrize("implementation", [Reporter, _TrackedProgress])
def test_each_implementation_takes_every_call_with_its_parameters(implementation: type) -> None:
    for name in CALLS:
        want = list(inspect.signature(getattr(Progress, name)).parameters)
        got = list(inspect.signature(getattr(implementation, name)).parameters)
        assert got == want, (implementation.__name__, name, got)


def test_the_console_prints_what_a_trial_s_run_tells_it(tmp_path: Path) -> None:
    """A trial run to its end as the driver runs it (:func:`run_one` records the calls); the same calls replayed to
    the console: the start with its values, each evaluation, no tick without a TTY, the finished trial."""
    trial, recorded, _ = run_one(tmp_path, 0.5)
    out = io.StringIO()
    console = Reporter(out, target=1)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    for call, *args in recorded.calls:
        if call == "started":
            console.trial_started(*args)
        elif call == "eval":
            console.trial_eval(*args, 0.0)
        console.trial_tick(0, 3, 10, 0.0)
    console.trial_finished(study, trial, 1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  trial 0 started: x=0.5"
    assert [ln.split(" objective")[0] for ln in lines[1:7]] == [f"  trial 0 step {s}/10" for s in range(0, 11, 2)]
    assert "1/1" in lines[-1] and "best 0.96 (trial 0)" in lines[-1] and len(lines) == 8
