"""Metric sinks in verl's formats: console ``step:N - key:value`` and the JSONL ``file`` logger.

The file logger writes one line per step, ``{"step": N, "data": {...}}``, and flushes
it at once: the HPO driver tails this file live. The path is ``--metrics-file``, else
``$VERL_FILE_LOGGER_PATH``, else ``${VERL_FILE_LOGGER_ROOT:-.}/{project}/{experiment}.jsonl``
(verl's rule).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, TextIO


def default_metrics_path(project: str, experiment: str) -> Path:
    explicit = os.environ.get("VERL_FILE_LOGGER_PATH")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("VERL_FILE_LOGGER_ROOT", ".")) / project / f"{experiment}.jsonl"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class Tracking:
    def __init__(self, loggers: list[str], metrics_file: Path | None, append: bool = False) -> None:
        self.console = "console" in loggers
        self.file: TextIO | None = None
        if "file" in loggers and metrics_file is not None:
            metrics_file.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(metrics_file, "a" if append else "w", buffering=1)

    def log(self, data: dict[str, Any], step: int) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"step": step, "data": {k: _clean(v) for k, v in data.items()}}) + "\n")
            self.file.flush()
        if self.console:
            parts = " - ".join(f"{k}:{v:.4g}" if isinstance(v, float) else f"{k}:{v}" for k, v in data.items())
            print(f"step:{step} - {parts}", file=sys.stdout, flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
