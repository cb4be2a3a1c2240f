"""One curve from the metrics files of a retry chain's attempts (any backend's): what a retry replays into its
pruner, aggregate and diagnosis before its process logs anything (``ResumePoint.records``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpo.execution._metrics import MetricsTail


def replay_records(files: Sequence[Path], upto_step: int,
                   starts: Sequence[int | None] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The steps attempts logged, as one curve up to ``upto_step`` (the checkpoint a retry resumes from).

    ``files``: one lineage, oldest first: each attempt continued from a checkpoint of the one before it
    (:attr:`ResumePoint.lineage`). ``starts[k]``: the step attempt k resumed from (None: a fresh start; not
    given: the step of its first record). An attempt's records replace the earlier ones after its start; at
    the start step itself both are merged, the later winning (the earlier attempt's training metrics of that
    step, the later one's validation of the checkpoint)."""
    merged: dict[int, dict[str, Any]] = {}
    for k, path in enumerate(files):
        records = MetricsTail(path).read()
        start = starts[k] if starts is not None and k < len(starts) else (records[0][0] if records else None)
        if starts is not None and start is None:
            merged = {}  # a fresh start: nothing before it belongs to this curve
        elif start is not None:
            merged = {s: d for s, d in merged.items() if s <= start}
        for step, data in records:
            merged[step] = {**merged.get(step, {}), **data}
    return sorted((s, d) for s, d in merged.items() if s <= upto_step)
