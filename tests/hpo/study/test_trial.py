"""One trial to its outcome (``hpo/study/_trial``), run the way a driver runs it: a :class:`TrialRunner` on a real
Optuna study, the fake trainer as its process (``tests/hpo/fake_trainer.py``), a recording progress. A run to its end
is COMPLETE with the objective's value and its files in the trial's directory; a crash is the worst value with its
reason and the trainer's last words, or FAIL with ``on_failure: fail``; the driver's stop interrupts the trial."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from hpo.backends import load_space
from hpo.execution._devices import DevicePool
from hpo.execution._identity import driver_identity
from hpo.study import TrialInterrupted
from hpo.study._trial import TrialRunner
from tests.hpo.conftest import ROOT, fake_space


class Recorded:
    """A :class:`hpo.study.Progress` that keeps what the study loop told it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def note(self, text: str) -> None:
        self.calls.append(("note", text))

    def trial_started(self, number: int, params: dict[str, Any], retry_of: int | None) -> None:
        self.calls.append(("started", number, dict(params), retry_of))

    def trial_eval(self, number: int, step: int, total: int | None, value: float, mem_gb: float) -> None:
        self.calls.append(("eval", number, step, total, value))

    def trial_tick(self, number: int, step: int | None, total: int | None, mem_gb: float) -> None:
        pass  # twice a second: how many depends on the host's speed

    def trial_finished(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, finished: int) -> None:
        self.calls.append(("finished", trial.number, finished))


def runner_of(tmp_path: Path, x: float, stop: threading.Event | None = None,
              **sections: Any) -> tuple[optuna.Study, optuna.trial.Trial, TrialRunner, Recorded]:
    """A new study of the fake experiment (``sections`` as :func:`fake_space` takes them), its trial 0 asked with
    ``x``, and the TrialRunner a driver would run it with."""
    space = load_space(str(fake_space(tmp_path, **sections)), check=False)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    study.enqueue_trial({"x": x})
    trial = study.ask()
    progress = Recorded()
    runner = TrialRunner(space, study, tmp_path / "trials", progress, stop or threading.Event(), str(ROOT),
                         driver_identity(), DevicePool([], 0))
    return study, trial, runner, progress


def run_one(tmp_path: Path, x: float, **sections: Any) -> tuple[optuna.trial.FrozenTrial, Recorded, TrialState]:
    """Trial 0 run to the state its driver tells (told, unless FAIL: the driver's part): the stored trial, the
    progress, the state."""
    study, trial, runner, progress = runner_of(tmp_path, x, **sections)
    state, values = runner.run(trial, threading.Event())
    if state != TrialState.FAIL:
        study.tell(trial, values, state=state)
    return study.trials[0], progress, state


def test_a_run_to_its_end_is_its_objective_value_and_its_files_are_in_its_directory(tmp_path: Path) -> None:
    trial, progress, state = run_one(tmp_path, 0.5)
    assert state == TrialState.COMPLETE and trial.value == pytest.approx(1 - (0.5 - 0.3) ** 2)
    assert trial.user_attrs["last_step"] == 10 and trial.user_attrs["exit_code"] == 0
    trial_dir = Path(trial.user_attrs["trial_dir"])
    assert trial_dir.parent == tmp_path / "trials"
    argv = json.loads((trial_dir / "command.json").read_text())["argv"]
    assert "fake.x=0.5" in argv and (trial_dir / "metrics.jsonl").is_file()
    assert progress.calls[0] == ("started", 0, {"x": 0.5}, None)
    evals = [c for c in progress.calls if c[0] == "eval"]
    assert [c[2] for c in evals] == [0, 2, 4, 6, 8, 10]  # every evaluation (test_freq 2, one before training)
    assert evals[-1][4] == pytest.approx(trial.value)


def test_a_crash_is_the_worst_value_with_its_reason_and_the_trainer_s_last_words(tmp_path: Path) -> None:
    trial, _, state = run_one(tmp_path, 0.3, overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 2,
                                                        "fake.crash_at": 5})
    assert state == TrialState.COMPLETE and trial.value == float("-inf")  # maximize: the worst there is
    assert trial.user_attrs["fail_reason"] == "crash" and trial.user_attrs["last_step"] == 4
    assert "RuntimeError" in trial.user_attrs["stderr_tail"]


def test_on_failure_fail_records_fail(tmp_path: Path) -> None:
    trial, _, state = run_one(tmp_path, 0.3, overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 2,
                                                        "fake.crash_at": 3},
                              trial={"on_failure": "fail"})
    assert state == TrialState.FAIL and trial.user_attrs["fail_reason"] == "crash"


def test_the_driver_s_stop_interrupts_the_trial_and_queues_its_parameters_again(tmp_path: Path) -> None:
    stop = threading.Event()
    study, trial, runner, progress = runner_of(tmp_path, 0.7, stop=stop)
    stop.set()  # asked to stop before the trial's process started
    with pytest.raises(TrialInterrupted):
        runner.run(trial, threading.Event())
    first, again = study.trials[0], study.trials[1]
    assert first.user_attrs["stop_reason"] == "interrupted" and first.state == TrialState.RUNNING  # the driver fails it
    assert again.state == TrialState.WAITING and again.params == {"x": 0.7}  # resume runs it first
    assert not (tmp_path / "trials").exists() or not any((tmp_path / "trials").iterdir())  # nothing was launched
