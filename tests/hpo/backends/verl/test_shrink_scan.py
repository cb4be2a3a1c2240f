"""Every training row read once for the rehearsal's shrunk experiment (``hpo/backends/verl/_shrink_scan.py``, run in
verl's interpreter beside ``_shrink.py``; it needs only pyarrow): the rows with the longest prompts across files and
formats, the rows whose ground truths are the most unusual (another type first, then the longest and the shortest),
whatever the batches, and the rows picked written in the order picked, each labelled with its file and row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hpo.backends.verl._shrink_scan import scan_rows, write_rows


def _row(i: int, question: str, truth: Any) -> dict[str, Any]:
    return {"data_source": "mine", "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": truth}}


def test_the_longest_prompts_and_the_unusual_truths_whatever_the_batches(tmp_path: Path) -> None:
    first = [_row(i, f"{i}+1=", str(i + 1)) for i in range(100)]
    first[30] = _row(30, "add these: " + " + ".join(map(str, range(40))), "780")  # the longest prompt
    first[70]["reward_model"]["ground_truth"] = "a much longer ground truth than any other"
    second = [_row(100 + i, f"{i}*2=", str(2 * i)) for i in range(50)]
    second[5] = _row(105, "multiply " + " * ".join(map(str, range(20))), "0")  # the second longest
    second[9]["reward_model"]["ground_truth"] = None  # another type than every other row's
    pq.write_table(pa.Table.from_pylist(first), tmp_path / "a.parquet", row_group_size=16)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in second))
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")]
    scans = [scan_rows(paths, 2, "prompt", batch_rows=n) for n in (7, 65_536)]
    assert scans[0] == scans[1]  # what is found does not depend on how the rows are batched
    scan = scans[0]
    assert scan["total"] == 150 and [tuple(p) for p in scan["longest"]] == [(0, 30), (1, 5)]  # in file order
    unusual = [tuple(p) for p in scan["unusual"]]
    assert unusual[0] == (1, 9) and (0, 70) in unusual  # the None first, then the longest truth
    out = tmp_path / "shrunk" / "train.parquet"
    assert write_rows(paths, [(1, 5), (0, 30), (1, 9)], str(out), label=True) == 3
    rows = pq.read_table(out).to_pylist()
    assert [r["__row"] for r in rows] == ["b.jsonl:5", "a.parquet:30", "b.jsonl:9"]  # in the order picked
    assert rows[1]["prompt"][0]["content"].startswith("add these:") and rows[2]["reward_model"]["ground_truth"] is None
