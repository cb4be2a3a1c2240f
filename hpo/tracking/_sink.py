"""The interface every tracker implements inside the tracking process (:mod:`._mlflow`, :mod:`._wandb`), and the
cursors it keeps: per chain, its run id and the last step logged (a step at or below it is never logged again)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from hpo.tracking._content import ChainInfo, Finished, StudyUpdate

Rows = list[tuple[int, dict[str, float], int]]  # (step, {metric: value}, timestamp ms)


class Registry(Protocol):
    """Run ids kept in the study's storage, so a retry on another host continues its chain's run."""

    def run_id(self, root: int, tracker: str) -> str | None: ...

    def set_run_id(self, root: int, tracker: str, run_id: str) -> None: ...


class Sink(Protocol):
    name: str  # "mlflow" | "wandb"
    label: str  # for messages, no secret

    def transient(self, err: BaseException) -> bool:
        """Whether ``err`` means "the server is not there now" (retry later) rather than "this cannot be logged"."""

    def open_run(self, chain: ChainInfo) -> None:
        """Create the chain's run, or continue it (an earlier attempt's, found by id)."""

    def log_steps(self, root: int, rows: Rows) -> None:
        """Log the rows whose step is past the chain's cursor, then move the cursor."""

    def finish_run(self, root: int, fin: Finished) -> None: ...

    def update_study(self, upd: StudyUpdate) -> None: ...

    def upload_page(self, page: Path) -> None: ...

    def close(self) -> None: ...


class Cursors:
    """One tracker's part of the tracking process's state file: ``{"chains": {root: {"run": id, "step": n}},
    "study_run": id}``."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        raw.setdefault("chains", {})

    def chain(self, root: int) -> dict[str, Any]:
        chains: dict[str, dict[str, Any]] = self.raw["chains"]
        return chains.setdefault(str(root), {})

    def step(self, root: int) -> int:
        return int(self.chain(root).get("step", -1))

    def advance(self, root: int, step: int) -> None:
        c = self.chain(root)
        c["step"] = max(int(c.get("step", -1)), step)
