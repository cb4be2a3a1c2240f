"""The columnar pass of verl's row check (``hpo/backends/verl/_compose_rows.py``, the part that reads every row): each
message shape with its first rows, each distinct ground truth with the rows holding it, across a parquet and a
JSON-lines file of one split, and the rows verl's own data path then takes (``test_compose_datapath.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpo.backends.verl import _compose_rows
from hpo.backends.verl._compose_data import iter_batches
from hpo.backends.verl._compose_rows import SplitScan
from tests.hpo.backends.verl.conftest import user_row


def test_every_row_is_read_by_columns_across_files_and_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The columnar pass of the check (the part that reads every row): each message shape with its first rows, each
    distinct ground truth with the rows holding it, across a parquet and a JSON-lines file of one split; the rows
    verl's own data path then takes, most telling first, and a seeded sample that does not depend on the batches."""
    monkeypatch.setattr(_compose_rows, "ALL_ROWS", 500)  # the split is "large": a sample, not every row
    monkeypatch.setattr(_compose_rows, "SAMPLE_ROWS", 50)
    first = [user_row(i, truth="NA" if 120 <= i <= 130 else None) for i in range(1000)]
    second = [user_row(1000 + i, content=None if i == 40 else "") for i in range(600)]
    pq.write_table(pa.Table.from_pylist(first), tmp_path / "a.parquet", row_group_size=128)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in second))
    scans = []
    for batch_rows in (64, 65_536):  # what is found does not depend on how the rows are batched
        monkeypatch.setattr(_compose_rows, "iter_batches", lambda path, n=batch_rows: iter_batches(path, batch_rows=n))
        scan = SplitScan("train", [str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")], "prompt", seed=1)
        scan.scan()
        scans.append(scan)
    scan = scans[0]
    assert scan.rows == 1600 and scan.shapes["user"][0] == 1599 and scan.shapes["user|-content"] == [1, [(1, 40)]]
    na = next(t for t in scan.truths.values() if t["truth"] == "NA")
    assert na["count"] == 11 and na["first"] == (0, 120) and na["last"] == (0, 130)
    picks = [k for k, _ in scan.ordered_picks()]
    assert picks[:3] == [(0, 0), (0, 1), (1, 40)] and len(scan.sampled) == 50  # each shape's first rows first
    assert sorted(scans[1].sampled) == sorted(scan.sampled) and scans[1].picks.keys() == scan.picks.keys()
