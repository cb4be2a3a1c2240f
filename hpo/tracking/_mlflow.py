"""MLflow, through ``MlflowClient`` (no fluent global run): in the experiment ``tracking.mlflow.experiment``, one
parent run per study (tags ``verl_hpo.kind=study``, ``verl_hpo.study``, ``verl_hpo.study_key``) and one nested run
per trial chain (``mlflow.parentRunId``; ``verl_hpo.chain`` = the root trial's number).

A trial run holds the parameters (params), every metric of the trial's metrics file as a curve by step (names
made MLflow-safe by :func:`hpo.tracking._content.metric_key`), and at the end the outcome as tags (``outcome``,
``stop_reason``, ``fail_reason``, ``diagnosis``, ``diagnosis_evidence``, ...) and numbers as metrics
(``objective/<name>``, ``peak_memory_gb``, ``wall_time_s``, ...), its status FINISHED, FAILED (a ``fail_reason``)
or KILLED (interrupted: its retry sets it RUNNING again and continues it). Each batch of steps carries tag
``verl_hpo.last_step``: a process that continues the run (a retry elsewhere, ``verl-hpo track``) starts after it.

Errors: the client's own HTTP retries are off (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``, 10 s timeout): the tracking
process retries with its own backoff, never blocking on one server. A resent batch is not duplicated (MLflow drops
a metric identical in key, step, timestamp and value; tags and params are upserts)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hpo.tracking._content import ChainInfo, Finished, StudyUpdate, metric_key
from hpo.tracking._sink import Cursors, Registry, Rows

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

from mlflow import MlflowClient  # noqa: E402 - after its retry settings
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException, RestException  # noqa: E402
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode  # noqa: E402

TAG = "verl_hpo."
BATCH = 900  # MLflow takes 1000 metrics per batch


class MlflowSink:
    name = "mlflow"

    def __init__(self, uri: str, label: str, experiment: str, study_name: str, study_key: str,
                 cursors: Cursors, registry: Registry, artifacts: Path | None = None) -> None:
        self.client = MlflowClient(tracking_uri=uri)
        self.label = label
        self.experiment = experiment
        self.study_name = study_name
        self.study_key = study_key
        self.cursors = cursors
        self.registry = registry
        self.artifacts = artifacts  # where an experiment this sink creates keeps its artifacts (None: the store's)
        self._experiment_id: str | None = None

    # ------------------------------------------------------------------------- errors
    def transient(self, err: BaseException) -> bool:
        if isinstance(err, RestException):
            code = getattr(err, "error_code", "")
            return code in ("TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED") or \
                (getattr(err, "get_http_status_code", lambda: 500)() >= 500)
        if isinstance(err, MlflowException):
            return "API request to" in str(err) or "failed with exception" in str(err)
        return isinstance(err, (OSError, ConnectionError, TimeoutError))

    # ------------------------------------------------------------------------- runs
    def _experiment(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                try:
                    self._experiment_id = self.client.create_experiment(
                        self.experiment, artifact_location=None if self.artifacts is None else str(self.artifacts))
                except MlflowException as err:
                    if err.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                        raise
                    exp = self.client.get_experiment_by_name(self.experiment)  # another process made it
            if self._experiment_id is None:
                assert exp is not None
                self._experiment_id = exp.experiment_id
            where = self.client.get_experiment(self._experiment_id).artifact_location
            print(f"{time.strftime('%H:%M:%S')} MLflow experiment {self.experiment}: artifacts in {where}", flush=True)
        return self._experiment_id

    def _find(self, **tags: str) -> list[Any]:
        where = " and ".join(f"tags.`{TAG}{k}` = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self._experiment()], filter_string=where, max_results=50)
        return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def study_run(self) -> str:
        """The study's parent run: found by tag, else made. Two workers that make one at once both keep the
        earliest and the other's is deleted (so the study has one parent run)."""
        raw = self.cursors.raw
        if raw.get("study_run"):
            return str(raw["study_run"])
        found = self._find(kind="study", study_key=self.study_key)
        if not found:
            mine = self.client.create_run(self._experiment(), run_name=self.study_name, tags={
                f"{TAG}kind": "study", f"{TAG}study": self.study_name, f"{TAG}study_key": self.study_key,
                "mlflow.note.content": f"verl-hpo study {self.study_name}: one nested run per trial"})
            found = self._find(kind="study", study_key=self.study_key) or [mine]
            if found[0].info.run_id != mine.info.run_id:
                self.client.delete_run(mine.info.run_id)
        raw["study_run"] = found[0].info.run_id
        return str(raw["study_run"])

    def open_run(self, chain: ChainInfo) -> None:
        parent = self.study_run()
        cur = self.cursors.chain(chain.root)
        run_id = cur.get("run") or self.registry.run_id(chain.root, self.name)
        if run_id is None:
            found = self._find(kind="trial", study_key=self.study_key, chain=str(chain.root))
            run_id = found[0].info.run_id if found else None
        if run_id is None:
            run = self.client.create_run(self._experiment(), start_time=chain.start_ms or None,
                                         run_name=f"{self.study_name} #{chain.root}", tags={
                "mlflow.parentRunId": parent, f"{TAG}kind": "trial", f"{TAG}study": self.study_name,
                f"{TAG}study_key": self.study_key, f"{TAG}chain": str(chain.root), f"{TAG}job_type": chain.job_type})
            run_id = run.info.run_id
            self.registry.set_run_id(chain.root, self.name, run_id)
        else:
            run = self.client.get_run(run_id)
            self.cursors.advance(chain.root, int(run.data.tags.get(f"{TAG}last_step", -1)))
            if run.info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
        cur["run"] = run_id
        self.client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(chain.params.items())],
                              tags=[RunTag(f"{TAG}trial", str(chain.trial)),
                                    RunTag(f"{TAG}attempts", ",".join(map(str, chain.attempts))),
                                    RunTag(f"{TAG}worker", chain.worker)])

    def _run(self, root: int) -> str:
        run_id = self.cursors.chain(root).get("run")
        if not run_id:
            raise RuntimeError(f"chain {root} has no MLflow run")
        return str(run_id)

    def log_steps(self, root: int, rows: Rows) -> None:
        last = self.cursors.step(root)
        new = [r for r in rows if r[0] > last]
        if not new:
            return
        run_id = self._run(root)
        metrics: list[Metric] = []
        for step, data, ts in new:
            metrics += [Metric(metric_key(k), v, ts, step) for k, v in data.items()]
        for i in range(0, len(metrics), BATCH):  # the cursor moves with the last batch only
            chunk = metrics[i:i + BATCH]
            done = i + BATCH >= len(metrics)
            tags = [RunTag(f"{TAG}last_step", str(new[-1][0]))] if done else []
            self.client.log_batch(run_id, metrics=chunk, tags=tags)
        self.cursors.advance(root, new[-1][0])

    def finish_run(self, root: int, fin: Finished) -> None:
        run_id = self._run(root)
        step = max(self.cursors.step(root), 0)
        self.client.log_batch(
            run_id, metrics=[Metric(metric_key(k), v, fin.end_ms, step) for k, v in sorted(fin.numbers.items())],
            tags=[RunTag(f"{TAG}{k}", v[:8000]) for k, v in sorted(fin.words.items())])
        self.client.set_terminated(run_id, status=fin.status, end_time=fin.end_ms or None)

    def update_study(self, upd: StudyUpdate) -> None:
        run_id, ts = self.study_run(), _now_ms()
        metrics = [Metric("n_finished", upd.n_finished, ts, upd.n_finished)]
        if upd.best_value is not None:
            metrics.append(Metric("best_value", upd.best_value, ts, upd.n_finished))
        metrics += [Metric(metric_key(f"importance/{k}"), v, ts, upd.n_finished) for k, v in upd.importances.items()]
        tags = [RunTag(f"{TAG}n_finished", str(upd.n_finished))]
        if upd.n_trials is not None:
            tags.append(RunTag(f"{TAG}n_trials", str(upd.n_trials)))
        if upd.best_trial is not None:
            tags.append(RunTag(f"{TAG}best_trial", str(upd.best_trial)))
            tags += [RunTag(f"{TAG}best.{metric_key(k)}", str(v)[:8000]) for k, v in sorted(upd.best_params.items())]
        self.client.log_batch(run_id, metrics=metrics, tags=tags[:100])
        if upd.final:  # KILLED: stopped short of its target (resume or another worker sets it RUNNING again)
            self.client.set_terminated(run_id, status="FINISHED" if upd.complete else "KILLED")
        elif not upd.final and self.client.get_run(run_id).info.status != "RUNNING":  # resumed or more trials
            self.client.update_run(run_id, status="RUNNING")

    def upload_page(self, page: Path) -> None:
        self.client.log_artifact(self.study_run(), str(page))

    def close(self) -> None:
        pass


def _now_ms() -> int:
    return int(time.time() * 1000)
