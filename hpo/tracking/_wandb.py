"""Weights & Biases: one run per trial chain in ``tracking.wandb.project``, ``group=<study>``, ``job_type`` tune,
confirm or what the trial's ``hpo:job_type`` system attr says (pbt), id ``<study key>-t<root>`` (so every attempt of
a chain, on any host, resumes the same run with ``resume="allow"``); and the study's own run (``job_type=study``,
id ``<study key>-study``) whose summary holds the best value so far, its trial and parameters, the importances,
and whose files hold the dashboard page.

A trial run's config holds the parameters (and ``verl_hpo``: study, chain, attempts), its history every metric of
the trial's metrics file by step (W&B wants increasing steps: the chain's cursor keeps them so), its summary and
tags the outcome. ``mode: offline`` writes run directories under ``tracking.wandb.dir`` (default
``<studies-dir>/<study>/tracking/wandb``) to ``wandb sync`` later; W&B's own service process buffers and retries
an online run's uploads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import wandb

from hpo.tracking._content import ChainInfo, Finished, StudyUpdate
from hpo.tracking._sink import Cursors, Rows


class WandbSink:
    name = "wandb"

    def __init__(self, project: str, entity: str | None, mode: str, directory: Path, study_name: str, study_key: str,
                 cursors: Cursors) -> None:
        self.project, self.entity, self.mode = project, entity, mode
        self.directory = directory
        self.study_name, self.study_key = study_name, study_key
        self.cursors = cursors
        self.label = f"W&B project {project} ({mode})"
        self._runs: dict[int, Any] = {}
        self._study: Any = None
        self._page_saved = False
        directory.mkdir(parents=True, exist_ok=True)

    def transient(self, err: BaseException) -> bool:
        return isinstance(err, (wandb.errors.CommError, ConnectionError, TimeoutError))

    def _init(self, run_id: str, name: str, job_type: str, config: dict[str, Any]) -> Any:
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_save_requirements=False,
                                  disable_git=True, save_code=False)
        return wandb.init(project=self.project, entity=self.entity, group=self.study_name, job_type=job_type,
                          id=run_id, name=name, config=config, resume="allow", dir=str(self.directory),
                          mode=self.mode, reinit="create_new", settings=settings)  # type: ignore[arg-type]

    def open_run(self, chain: ChainInfo) -> None:
        old = self._runs.pop(chain.root, None)
        if old is not None:
            old.finish(exit_code=1)
        config = {**chain.params, "verl_hpo": {"study": self.study_name, "chain": chain.root,
                                               "attempts": list(chain.attempts), "job_type": chain.job_type}}
        run = self._init(f"{self.study_key}-t{chain.root}", f"{self.study_name} #{chain.root}", chain.job_type, config)
        if run.resumed and run.starting_step > 0:  # online: the server knows where the run got to
            self.cursors.advance(chain.root, run.starting_step - 1)
        self.cursors.chain(chain.root)["run"] = run.id
        run.summary.update({"verl_hpo/trial": chain.trial, "verl_hpo/worker": chain.worker})
        self._runs[chain.root] = run

    def log_steps(self, root: int, rows: Rows) -> None:
        last = self.cursors.step(root)
        new = [(step, data) for step, data, _ in rows if step > last]
        if not new:  # a retry's first steps, or a replay by verl-hpo track
            return
        run = self._runs[root]
        for step, data in new:
            run.log(data, step=step)
        self.cursors.advance(root, new[-1][0])

    def finish_run(self, root: int, fin: Finished) -> None:
        run = self._runs.pop(root, None)
        if run is None:
            return
        run.summary.update({**fin.numbers, **{f"verl_hpo/{k}": v for k, v in fin.words.items()}})
        run.tags = tuple(t for t in (fin.words.get("outcome"), fin.words.get("diagnosis")) if t)
        run.finish(exit_code=0 if fin.status == "FINISHED" else 1)

    def _study_run(self) -> Any:
        if self._study is None:
            self._study = self._init(f"{self.study_key}-study", self.study_name, "study",
                                     {"verl_hpo": {"study": self.study_name, "kind": "study"}})
        return self._study

    def update_study(self, upd: StudyUpdate) -> None:
        run = self._study_run()
        summary: dict[str, Any] = {"n_finished": upd.n_finished}
        if upd.n_trials is not None:
            summary["n_trials"] = upd.n_trials
        if upd.best_value is not None:
            summary.update(best_value=upd.best_value, best_trial=upd.best_trial,
                           **{f"best/{k}": v for k, v in upd.best_params.items()})
        summary.update({f"importance/{k}": v for k, v in upd.importances.items()})
        run.summary.update(summary)

    def upload_page(self, page: Path) -> None:
        if not self._page_saved:  # "live": W&B uploads it again whenever the driver rewrites it
            self._study_run().save(str(page), base_path=str(page.parent), policy="live")
            self._page_saved = True

    def close(self) -> None:
        for run in self._runs.values():  # chains still running elsewhere or interrupted: continued by a retry
            run.finish(exit_code=1)
        self._runs.clear()
        if self._study is not None:
            self._study.finish()
            self._study = None
