"""The data files and prompt lengths as verl reads them (``hpo/backends/verl/_compose_data.py``, imported in verl's
interpreter by ``_compose``): the three formats verl 0.9.1's RLHFDataset loads (parquet, JSON lines, JSON) read in
batches, and every prompt measured against ``data.max_prompt_length`` as verl 0.9.1 treats it (cut, whatever
``data.truncation`` says; issue 43 items 4 and 7), in a verl user's own experiment with real verl's interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hpo.backends.verl._compose_data import iter_batches
from hpo.backends.verl._data import bad_rows
from tests.hpo.backends.verl.conftest import arith_experiment, arith_rows, needs_verl, user_row, validate


def test_jsonl_json_and_parquet_rows_are_read_as_verl_reads_them(tmp_path: Path) -> None:
    """The three formats verl 0.9.1's RLHFDataset loads give the same rows, in batches; any other name is refused
    with verl's reason, and the row checks name a JSON line's row."""
    rows = [user_row(i) for i in range(300)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", row_group_size=64)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps(rows))
    for name in ("d.parquet", "d.jsonl", "d.json"):
        read = [r for b in iter_batches(str(tmp_path / name), ["prompt", "reward_model"], 100) for r in b.to_pylist()]
        assert read == [{"prompt": r["prompt"], "reward_model": r["reward_model"]} for r in rows], name
        assert bad_rows("data.train_files", str(tmp_path / name)) is None
    rows[150]["reward_model"]["ground_truth"] = None
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "bad.jsonl row 150: reward_model.ground_truth is null" in (bad_rows("data.val_files",
                                                                               str(tmp_path / "bad.jsonl")) or "")
    (tmp_path / "d.csv").write_text("prompt\n")
    assert "reads .parquet, .json and .jsonl files only" in (bad_rows("data.train_files", str(tmp_path / "d.csv"))
                                                            or "")


@needs_verl
def test_a_prompt_13x_longer_than_max_prompt_length_at_row_150_is_named(tmp_path: Path) -> None:
    """verl 0.9.1's agent loop cuts a text prompt over data.max_prompt_length to its last tokens, whatever
    data.truncation says (its RL path never reads that key): validate passes with a warning naming row 150, its
    length, the count and the longest (issue 52: a check of ours is never stricter than verl)."""
    space = arith_experiment(tmp_path, arith_rows(400))
    res = validate(space)
    assert res.returncode == 0, (res.stdout, res.stderr)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("warning: 1 of 416 prompts"))
    assert "are longer than data.max_prompt_length=16 tokens (first: train.parquet row 150: " in line and \
        "keeps only their last 16 tokens" in line and "data.truncation=error is not read" in line, line
    tokens = int(line.split("row 150: ")[1].split()[0])
    assert tokens >= 13 * 16 and f"longest: train.parquet row 150, {tokens} tokens" in line, line  # 13x the limit
