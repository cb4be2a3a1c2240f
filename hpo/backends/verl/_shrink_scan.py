"""Every training row read once for the rehearsal's shrunk experiment (``_shrink.py``, its neighbour, in verl's
interpreter): the rows with the longest prompts, which replace the first rows so that the real
``data.max_prompt_length`` is exercised, and the rows with the most unusual ground truths, which the reward check
scores (:func:`scan_rows`); then the rows picked written to a parquet file in the order picked (:func:`write_rows`).
Every file is read a batch at a time, a column at a time where it can be, so that a file of millions of rows is never
loaded whole.

Like ``_compose.py`` this imports nothing of the project but its neighbour ``_compose_data`` (on ``sys.path`` when
``_shrink.py`` runs as a script).
"""

from __future__ import annotations

import os
from typing import Any

if __package__:
    from ._compose_data import column_or_nulls, iter_batches
else:  # run in verl's interpreter: the neighbour beside it
    from _compose_data import column_or_nulls, iter_batches  # type: ignore[no-redef]


def _prompt_size(prompt: Any) -> int:
    """A prompt's size in UTF-8 bytes of its text (a chat: its messages' contents), to rank rows by length."""
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "replace"))
    if isinstance(prompt, list):
        return sum(len(str(m.get("content") if isinstance(m, dict) else m).encode("utf-8", "replace"))
                   for m in prompt)
    return 0


UNUSUAL_TRUTHS = 8  # training rows whose ground truth is the least like the others, scored by the reward check


def scan_rows(paths: list[str], rows: int, prompt_key: str, batch_rows: int = 65_536) -> dict[str, Any]:
    """One columnar pass over every row of ``paths`` (the prompt and ``reward_model`` columns, ``batch_rows`` at a
    time): the ``rows`` rows with the longest prompts (``longest``: ``[[file index, row], ...]`` in file order) and
    up to :data:`UNUSUAL_TRUTHS` rows with the most unusual ground truths (``unusual``: the first row of each type
    that is not the most common one, then the longest and the shortest), and ``total``: rows read."""
    import heapq
    from collections import Counter

    heap: list[tuple[int, int, int]] = []  # (size, -file, -row): the smallest size leaves first; ties keep the first
    types: Counter[str] = Counter()
    first_of: dict[str, tuple[int, int]] = {}
    long_truth: list[tuple[int, int, int]] = []
    short_truth: list[tuple[int, int, int]] = []
    total = 0
    for f, path in enumerate(paths):
        row = 0
        for batch in iter_batches(path, [prompt_key, "reward_model"], batch_rows):
            prompts = column_or_nulls(batch, prompt_key).to_pylist()
            truths = column_or_nulls(batch, "reward_model").to_pylist()
            for prompt, rm in zip(prompts, truths, strict=True):
                item = (_prompt_size(prompt), -f, -row)
                if len(heap) < rows:
                    heapq.heappush(heap, item)
                elif item > heap[0]:
                    heapq.heapreplace(heap, item)
                truth = rm.get("ground_truth") if isinstance(rm, dict) else None
                kind = type(truth).__name__
                types[kind] += 1
                first_of.setdefault(kind, (f, row))
                size = len(str(truth))
                for keep, key in ((long_truth, size), (short_truth, -size)):
                    entry = (key, -f, -row)
                    if len(keep) < 2:
                        heapq.heappush(keep, entry)
                    elif entry > keep[0]:
                        heapq.heapreplace(keep, entry)
                row += 1
        total += row
    common = types.most_common(1)[0][0] if types else None
    unusual = [first_of[k] for k, _ in types.most_common() if k != common]
    unusual += [(-f, -r) for _, f, r in sorted(long_truth, reverse=True)]
    unusual += [(-f, -r) for _, f, r in sorted(short_truth, reverse=True)]
    return {"longest": sorted((-f, -r) for _, f, r in heap), "unusual": list(dict.fromkeys(unusual))[:UNUSUAL_TRUTHS],
            "total": total}


def write_rows(paths: list[str], picks: list[tuple[int, int]], out: str, label: bool = False,
               batch_rows: int = 65_536) -> int:
    """The rows ``picks`` (``(file index, row)``) of ``paths`` written to ``out`` in that order, read a batch at a time;
    ``label``: a column ``__row`` keeps each row's ``"file:row"`` for the lines that name it. The number written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted: dict[int, dict[int, int]] = {}
    for i, (f, r) in enumerate(picks):
        wanted.setdefault(f, {})[r] = i
    found: dict[int, dict[str, Any]] = {}
    for f, rows in wanted.items():
        start = 0
        for batch in iter_batches(paths[f], batch_rows=batch_rows):
            inside = [r for r in rows if start <= r < start + batch.num_rows]
            if inside:
                for r in inside:
                    found[rows[r]] = {**batch.slice(r - start, 1).to_pylist()[0],
                                      **({"__row": f"{os.path.basename(paths[f])}:{r}"} if label else {})}
            start += batch.num_rows
            if start > max(rows):
                break
    table = pa.Table.from_pylist([found[i] for i in sorted(found)])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    pq.write_table(table, out)
    return table.num_rows
