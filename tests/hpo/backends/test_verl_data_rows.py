"""Every row of a verl study's data files checked before launch, columnar and in batches (issue 43 item 2): a null
``reward_model.ground_truth``, an empty prompt, a null ``data_source`` at row 150 is one line naming the file and the
first rows, where verl's trial would have failed hours in (or scored 0 silently)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from hpo.backends.verl import _data
from hpo.backends.verl._data import bad_rows
from tests.hpo.conftest import cli_env

ROOT = Path(__file__).resolve().parents[3]


def _rows(n: int, **bad: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{"data_source": "mine", "prompt": [{"role": "user", "content": f"{i}+1="}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(n)]
    for i, change in bad.items():
        rows[int(i.removeprefix("row"))].update(change)
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=50)
    return path


def test_each_kind_of_bad_row_is_named_with_its_first_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_data, "ROW_BATCH", 64)  # the bad rows in later batches: offsets must add up
    cases = {
        "reward_model.ground_truth is null (2 of 200 rows, the first 150, 170)":
            _rows(200, row150={"reward_model": {"style": "rule", "ground_truth": None}},
                  row170={"reward_model": {"style": "rule", "ground_truth": None}}),
        "prompt is null or empty (1 of 200 rows, the first 199)": _rows(200, row199={"prompt": []}),
        "data_source is null (1 of 200 rows, the first 64)": _rows(200, row64={"data_source": None}),
    }
    for said, rows in cases.items():
        path = _write(tmp_path / "train.parquet", rows)
        line = bad_rows("data.train_files", str(path))
        assert line is not None and f"{path} row {said.split('the first ')[1].split(',')[0].rstrip(')')}" in line \
            and said in line, line
    assert bad_rows("data.train_files", str(_write(tmp_path / "ok.parquet", _rows(200)))) is None
    no_col = _write(tmp_path / "cols.parquet", [{"question": "1+1", "data_source": "x", "reward_model": {"a": 1}}])
    assert "has no column 'prompt'" in (bad_rows("data.train_files", f"[{no_col}]") or "")


@pytest.mark.skipif(not (ROOT / ".venv-verl" / "bin" / "python").exists(), reason="needs make install-verl")
def test_validate_names_row_150_of_the_user_s_own_file(tmp_path: Path) -> None:
    data = _write(tmp_path / "train.parquet", _rows(400, row150={"reward_model": {"style": "rule",
                                                                                  "ground_truth": None}}))
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_cpu.yaml").read_text())
    raw["overrides"]["data.train_files"] = str(data)
    raw["trial"]["prepare_command"] = None
    space = tmp_path / "mine.yaml"
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", str(space)], cwd=tmp_path,
                         env=cli_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "overrides.data.train_files" in lines[0] and "row 150" in lines[0] \
        and "ground_truth is null" in lines[0], res.stderr
