"""The tracking process (:mod:`hpo.tracking._sync`) without a tracker server: a recording sink stands in for MLflow /
W&B (the thing under test is what the process sends it, and in which order). A tracker that is down holds its queue
and loses nothing; one operation it refuses is dropped with one line; spool events, a trial's metrics file and the
storage become open / steps / end / study operations on a real SQLite study; run ids and the study key live in the
storage; credentials never reach the process's output."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.record import ATTR_SPACE
from hpo.tracking import _sync
from hpo.tracking._content import ChainInfo, Finished, StudyUpdate
from hpo.tracking._sync import Queue, StudyRegistry, Tracker, _Scrubbed, strip_credentials, study_key


class Recorder:
    """A sink that records each operation; ``down`` makes the next calls fail as an unreachable server does."""

    name, label = "rec", "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.down = 0  # this many next calls raise ConnectionError (transient)
        self.refuse: set[str] = set()  # operations that raise ValueError (not transient)

    def transient(self, err: BaseException) -> bool:
        return isinstance(err, ConnectionError)

    def _call(self, op: str, arg: Any) -> None:
        if self.down:
            self.down -= 1
            raise ConnectionError("server is down")
        if op in self.refuse:
            raise ValueError(f"cannot log {op}")
        self.calls.append((op, arg))

    def open_run(self, chain: ChainInfo) -> None:
        self._call("open", chain.root)

    def log_steps(self, root: int, rows: list[tuple[int, dict[str, float], int]]) -> None:
        self._call("steps", (root, [(step, data) for step, data, _ in rows]))

    def finish_run(self, root: int, fin: Finished) -> None:
        self._call("finish", (root, fin.status))

    def update_study(self, upd: StudyUpdate) -> None:
        self._call("study", (upd.n_finished, upd.best_value, upd.final))

    def upload_page(self, page: Path) -> None:
        self._call("page", page.name)

    def close(self) -> None:
        self._call("close", None)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sync, "BACKOFF_S", (0.0, 0.0))  # the queue retries at once: the tests count calls


def _drain(q: Queue, tries: int = 20) -> None:
    for _ in range(tries):
        q.pump(time.monotonic() + 5)
        if not q.ops:
            return


def test_a_tracker_that_is_down_holds_its_queue_and_loses_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    sink = Recorder()
    q = Queue(sink)
    for i in range(3):
        q.put(f"op {i}", lambda i=i: sink._call("op", i))  # type: ignore[misc]
    sink.down = 2
    q.pump(time.monotonic() + 5)
    assert sink.calls == [] and len(q.ops) == 3 and q.down_since is not None  # held at the first, nothing dropped
    _drain(q)
    assert sink.calls == [("op", 0), ("op", 1), ("op", 2)] and q.down_since is None
    out = capsys.readouterr().out
    assert out.count("recorder: unreachable (ConnectionError: server is down); retrying, 3 pending") == 1
    assert "recorder: back after" in out


def test_an_operation_the_tracker_refuses_is_dropped_with_one_line_and_the_rest_goes_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    sink = Recorder()
    sink.refuse = {"bad"}
    q = Queue(sink)
    q.put("trial 1: steps", lambda: sink._call("bad", 1))
    q.put("trial 2: open", lambda: sink._call("open", 2))
    _drain(q)
    assert sink.calls == [("open", 2)] and not q.ops
    assert "recorder: trial 1: steps not logged: ValueError: cannot log bad" in capsys.readouterr().out


def test_a_queue_never_runs_past_its_deadline() -> None:
    sink = Recorder()
    q = Queue(sink)
    q.put("op", lambda: sink._call("op", 0))
    q.pump(time.monotonic() - 1)
    assert sink.calls == [] and len(q.ops) == 1


def _study(tmp_path: Path) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    study.set_user_attr(ATTR_SPACE, {"trial": {"backend": "verl_core"}})  # its metrics file: <trial_dir>/metrics.jsonl
    return study


def _trial(study: optuna.Study, trial_dir: Path) -> optuna.Trial:
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("trial_dir", str(trial_dir))
    trial_dir.mkdir(parents=True)
    return trial


def _lines(path: Path, *steps: int) -> None:
    with path.open("a") as fh:
        for s in steps:
            fh.write(json.dumps({"step": s, "data": {"eval/reward_mean": s / 10}}) + "\n")


def test_spool_events_and_a_metrics_file_become_each_run_s_operations_in_order(tmp_path: Path) -> None:
    study = _study(tmp_path)
    t0 = _trial(study, tmp_path / "trials" / "0")
    sink = Recorder()
    q = Queue(sink)
    tracker = Tracker(study, [q], tmp_path)
    tracker.handle({"ev": "start", "trial": 0})
    _lines(tmp_path / "trials" / "0" / "metrics.jsonl", 0, 1)
    tracker.poll()
    tracker.poll()  # nothing new: nothing sent twice
    _lines(tmp_path / "trials" / "0" / "metrics.jsonl", 2)
    study.tell(t0, 0.2)
    tracker.handle({"ev": "finish", "trial": 0})  # the last lines first, then the end
    tracker.handle({"ev": "finish", "trial": 0})  # told twice: ended once
    assert tracker.pending() == 5
    _drain(q)
    assert sink.calls == [("open", 0), ("steps", (0, [(0, {"eval/reward_mean": 0.0}), (1, {"eval/reward_mean": 0.1})])),
                          ("steps", (0, [(2, {"eval/reward_mean": 0.2})])), ("finish", (0, "FINISHED")),
                          ("study", (1, 0.2, False))]
    assert not tracker.ended
    tracker.handle({"ev": "end"})
    assert tracker.ended


def test_at_the_end_a_finished_trial_is_closed_and_a_running_one_left_for_its_retry(tmp_path: Path) -> None:
    study = _study(tmp_path)
    done, running = _trial(study, tmp_path / "t0"), _trial(study, tmp_path / "t1")
    sink = Recorder()
    q = Queue(sink)
    tracker = Tracker(study, [q], tmp_path)
    tracker.handle({"ev": "start", "trial": 0})
    tracker.handle({"ev": "start", "trial": 1})
    study.tell(done, 0.5)  # told, but the driver died before its finish line
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "dashboard.html").write_text("<html></html>")
    tracker.end()
    _drain(q)
    assert sink.calls == [("open", 0), ("open", 1), ("finish", (0, "FINISHED")), ("study", (1, 0.5, False)),
                          ("study", (1, 0.5, True)), ("page", "dashboard.html")]
    assert not tracker.active and running.number == 1


def test_run_ids_and_the_study_key_live_in_the_storage(tmp_path: Path) -> None:
    study = _study(tmp_path)
    key = study_key(study)
    again = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    assert study_key(again) == key and len(key) == 8  # another host, the same key
    registry = StudyRegistry(study)
    assert registry.run_id(3, "mlflow") is None
    registry.set_run_id(3, "mlflow", "run-a")
    registry.set_run_id(3, "wandb", "run-b")
    assert StudyRegistry(again).run_id(3, "mlflow") == "run-a" and StudyRegistry(again).run_id(3, "wandb") == "run-b"
    other = optuna.create_study(study_name="s2", storage=f"sqlite:///{tmp_path / 's.db'}")
    assert study_key(other) != key  # a study made again under another name never continues these runs


def test_a_uri_s_credentials_move_to_mlflow_s_variables_and_never_reach_the_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    assert strip_credentials("http://h:5000") == "http://h:5000" and "MLFLOW_TRACKING_USERNAME" not in os.environ
    assert strip_credentials("https://al%40x:p%2Fw@h:5000/p") == "https://h:5000/p"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "al@x" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "p/w"
    out = io.StringIO()
    stream = _Scrubbed(out, ["p/w", "p%2Fw", ""])
    stream.write("GET https://al%40x:p%2Fw@h:5000 failed (password p/w)\n")
    assert out.getvalue() == "GET https://al%40x:***@h:5000 failed (password ***)\n"
    assert stream.getvalue() == out.getvalue()  # everything else is the stream's own
