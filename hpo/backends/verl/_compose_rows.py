"""Every row of a verl experiment's data files read once, by columns, in verl's interpreter (for
``_compose_datapath.check_rows``): :class:`SplitScan` reads each train or val file in batches of bounded size (parquet,
json and jsonl as ``RLHFDataset`` reads them: ``_compose_data.iter_batches``) and records

* each row's **message shape** (its roles in order and which fields of each message are null: :func:`shapes`), with
  the first :data:`SHAPE_ROWS` rows of each;
* the **rows for verl's own data path**: each shape's first rows, the first :data:`HEAD_ROWS` rows, then every row of
  a split of at most :data:`ALL_ROWS` rows, else a seeded uniform random sample of :data:`SAMPLE_ROWS`
  (:meth:`SplitScan.ordered_picks`, the most telling first);
* each **distinct ground truth** (up to :data:`MAX_TRUTHS` a split) with its first and last row, how many rows hold
  it and its first row's ``data_source`` and ``extra_info``, for the reward check; the ``data_source`` values.

Imports nothing of the project (runs in verl's interpreter beside ``_compose_data``).
"""

from __future__ import annotations

import json
import os
from typing import Any

if __package__:
    from ._compose_data import chat_rows, column_or_nulls, iter_batches, row_keys
else:  # run in verl's interpreter: the neighbour is on sys.path
    from _compose_data import chat_rows, column_or_nulls, iter_batches, row_keys  # type: ignore[no-redef]

HEAD_ROWS = 64  # the first rows of each split, through verl's data path
SHAPE_ROWS = 2  # the first rows of each message shape
MAX_SHAPES = 256  # message shapes recorded per split (more are counted)
ALL_ROWS = 20_000  # a split of at most this many rows goes through verl's data path whole
SAMPLE_ROWS = 16_384  # else a seeded uniform sample of its rows (as many as the time limit allows)
MAX_TRUTHS = 1_000  # distinct ground truths recorded per split for the reward (then the sample's)
MAX_SOURCES = 1_000


# ----------------------------------------------------------------------------- every row, by columns
def shapes(column: Any) -> Any:
    """Each row's message shape as a string: its roles in order, each with the fields that are null
    (``user|-content``); ``<null>``, ``<text>`` (a plain string prompt), ``<no messages>``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chats = chat_rows(column)
    if chats is None:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            return pc.if_else(pc.is_null(column), "<null>", "<text>")
        return pa.array([_py_shape(v) for v in column.to_pylist()], pa.string())
    messages = chats["messages"]
    flags = [pc.if_else(pc.is_null(pc.struct_field(messages, f.name)), f"|-{f.name}", "")
             for f in messages.type if f.name != "role"]
    token = pc.binary_join_element_wise(chats["roles"], *flags, "") if flags else chats["roles"]
    token = pc.if_else(pc.is_null(messages), "<null message>", token)
    joined = row_keys(token, chats["offsets"], " ")
    return pc.if_else(pc.is_null(column), "<null>", pc.if_else(pc.equal(joined, ""), "<no messages>", joined))


def _py_shape(value: Any) -> str:
    if value is None:
        return "<null>"
    if isinstance(value, str):
        return "<text>"
    if isinstance(value, list):
        parts = [f"{m.get('role')}" + "".join(f"|-{k}" for k, v in m.items() if v is None and k != "role")
                 if isinstance(m, dict) else f"<{type(m).__name__} message>" for m in value]
        return " ".join(parts) or "<no messages>"
    return f"<{type(value).__name__}>"


def _firsts(codes: Any, k: int) -> list[tuple[int, list[int], int]]:
    """For the dictionary codes of a batch: (code, its first ``k`` positions, its count) per distinct code."""
    import numpy as np

    uniq, first, counts = np.unique(codes, return_index=True, return_counts=True)
    rows = {int(c): [int(i)] for c, i in zip(uniq, first, strict=True)}
    rest = np.ones(len(codes), bool)
    rest[first] = False
    for _ in range(k - 1):
        left = np.flatnonzero(rest)
        if not len(left):
            break
        u, pos = np.unique(codes[left], return_index=True)
        for c, i in zip(u, left[pos], strict=True):
            rows[int(c)].append(int(i))
        rest[left[pos]] = False
    return [(int(c), rows[int(c)], int(n)) for c, n in zip(uniq, counts, strict=True)]


class SplitScan:
    """One split's files, every row read once (see the module docstring)."""

    def __init__(self, split: str, files: list[str], prompt_key: str, seed: int) -> None:
        import numpy as np

        self.split, self.files, self.prompt_key = split, files, prompt_key
        self.rows = 0
        self.shapes: dict[str, list[Any]] = {}  # shape -> [count, [(file, row), ...]]
        self.more_shapes = 0
        self.truths: dict[str, dict[str, Any]] = {}  # repr -> {truth, first, last, count, data_source, extra_info}
        self.untracked_truth_rows = 0
        self.known: dict[str, dict[Any, str]] = {}  # the ground truths' type -> value -> key in truths
        self.sources: dict[str, int] = {}
        self.picks: dict[tuple[int, int], dict[str, Any]] = {}  # (file, row) -> the row, for verl's data path
        self.sampled: set[tuple[int, int]] = set()  # those of the random sample
        total = sum(_row_count(f) for f in files)  # a JSON list's is a guess: a drawn row past its end is none
        self.whole = total <= ALL_ROWS
        self.sample = np.array([], np.int64) if self.whole else np.sort(
            np.random.default_rng(seed).choice(total, size=min(SAMPLE_ROWS, total), replace=False))

    def scan(self) -> None:
        for f, path in enumerate(self.files):
            row = 0
            for batch in iter_batches(path):
                self._batch(f, row, batch)
                row += batch.num_rows
            self.rows += row

    def _batch(self, f: int, start: int, batch: Any) -> None:
        import numpy as np
        import pyarrow as pa

        n = batch.num_rows
        if self.whole and self.rows + start + n > ALL_ROWS:  # a JSON list's count was a guess: no longer whole
            self.whole = False
        keep = set(range(n)) if self.whole else {i for i in range(max(0, min(n, HEAD_ROWS - self.rows - start)))}
        if self.prompt_key in batch.schema.names:
            encoded = shapes(batch.column(self.prompt_key)).dictionary_encode()
            names = encoded.dictionary.to_pylist()
            for code, first, count in _firsts(np.asarray(encoded.indices), SHAPE_ROWS):
                entry = self.shapes.get(names[code])
                if entry is None and len(self.shapes) >= MAX_SHAPES:
                    self.more_shapes += count
                    continue
                entry = self.shapes.setdefault(names[code], [0, []])
                entry[0] += count
                for i in first[:SHAPE_ROWS - len(entry[1])]:
                    entry[1].append((f, start + i))
                    keep.add(i)
        self._sources(batch)
        self._truths(f, start, batch)
        at = self.rows + start  # the split's index of the batch's first row
        drawn = self.sample[np.searchsorted(self.sample, at):np.searchsorted(self.sample, at + n)] - at
        keep.update(drawn.tolist())
        if keep:
            order = sorted(keep)
            for i, row in zip(order, batch.take(pa.array(order, pa.int64())).to_pylist(), strict=True):
                self.picks[(f, start + i)] = row
            self.sampled.update((f, start + int(i)) for i in drawn)

    def _sources(self, batch: Any) -> None:
        import pyarrow.compute as pc

        counts = pc.value_counts(column_or_nulls(batch, "data_source"))
        for value, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
            key = str(value)
            if key in self.sources or len(self.sources) < MAX_SOURCES:
                self.sources[key] = self.sources.get(key, 0) + int(count)

    def _truths(self, f: int, start: int, batch: Any) -> None:
        """Each distinct ground truth of the batch: a value already recorded adds its rows, a new one is recorded
        while there is room (in the order rows hold them), the rows of the others are counted. Vectorized: only the
        recorded values (at most :data:`MAX_TRUTHS`) and the new ones are looked at one by one."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        rm = column_or_nulls(batch, "reward_model")
        if not pa.types.is_struct(rm.type) or rm.type.get_field_index("ground_truth") < 0:
            return  # the driver's column check names it
        truth = pc.struct_field(rm, "ground_truth")
        nested = pa.types.is_nested(truth.type)
        if nested:  # lists, structs: compared by their JSON
            truth = pa.array([None if v is None else json.dumps(v, sort_keys=True, default=str)
                              for v in truth.to_pylist()], pa.string())
        kind = f"{'json' if nested else truth.type}"
        encoded = truth.dictionary_encode()
        codes = np.asarray(pc.fill_null(encoded.indices, -1))
        values = encoded.dictionary
        if not len(values):
            return  # every ground truth null: the driver's row check names it
        counts = np.bincount(codes[codes >= 0], minlength=len(values))
        first, last = np.full(len(values), -1), np.full(len(values), -1)
        uniq, at = np.unique(codes, return_index=True)
        first[uniq[uniq >= 0]] = at[uniq >= 0]
        uniq, at = np.unique(codes[::-1], return_index=True)
        last[uniq[uniq >= 0]] = len(codes) - 1 - at[uniq >= 0]
        known = self.known.setdefault(kind, {})
        seen = np.asarray(pc.is_in(values, value_set=pa.array(list(known), values.type))) if known else \
            np.zeros(len(values), bool)
        new = np.flatnonzero(~seen)
        room = max(0, MAX_TRUTHS - len(self.truths))
        self.untracked_truth_rows += int(counts[new[room:]].sum())
        for code in [*np.flatnonzero(seen).tolist(), *new[:room].tolist()]:
            value = values[code].as_py()
            entry = self.truths.get(known.get(value, ""))
            if entry is None:
                row = batch.slice(int(first[code]), 1).to_pylist()[0]
                known[value] = key = f"{kind}:{value!r}"
                entry = self.truths[key] = {"truth": json.loads(value) if nested else value,
                                            "first": (f, start + int(first[code])), "count": 0,
                                            "data_source": row.get("data_source"), "extra_info": row.get("extra_info")}
            entry["count"] += int(counts[code])
            entry["last"] = (f, start + int(last[code]))

    def ordered_picks(self) -> list[tuple[tuple[int, int], dict[str, Any]]]:
        """The rows for verl's data path, most telling first: each shape's first rows, the first rows, the rest."""
        first = [fr for _, rows in self.shapes.values() for fr in rows]
        rest = sorted(k for k in self.picks if k not in self.sampled) + sorted(self.sampled)
        return [(k, self.picks[k]) for k in dict.fromkeys([*first, *rest]) if k in self.picks]


def _row_count(path: str) -> int:
    """Rows of a data file without reading them (parquet's footer; a JSON file's lines); large when unknown."""
    local = os.path.expanduser(path)
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(local).metadata.num_rows)
        with open(local, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b"")) + 1
    except Exception:  # noqa: BLE001 - the reading pass names it
        return ALL_ROWS + 1
