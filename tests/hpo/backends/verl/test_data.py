"""A verl study's data (``hpo/backends/verl/_data.py``): every row of its data files checked before launch, columnar and
in batches (issue 43 item 2: a null ``reward_model.ground_truth``, an empty prompt, a null ``data_source`` at row 150
is one line naming the file and the first rows, where verl's trial would have failed hours in, or scored 0
silently); a files value in each of its forms and the missing files in it; overlong prompts judged as verl treats
them; and the GSM8K-format data of the shipped experiment, written only where it keeps it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from hpo.backends.verl import _data
from hpo.backends.verl._data import bad_rows, missing_files, overlong_verdict, split_list
from hpo.backends.verl._launch import default_python
from hpo.experiment._space import read_yaml
from tests.hpo.backends.verl.conftest import (
    CPU_SPACE,
    INT_REWARD,
    SPACE_FILE,
    VERL_PY,
    errors,
    needs_verl,
    user_row,
    validate,
)
from tests.hpo.conftest import cli_env


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


@needs_verl
def test_validate_names_row_150_of_the_user_s_own_file(tmp_path: Path) -> None:
    data = _write(tmp_path / "train.parquet", _rows(400, row150={"reward_model": {"style": "rule",
                                                                                  "ground_truth": None}}))
    raw = yaml.safe_load(CPU_SPACE.read_text())
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


def test_a_reward_path_that_does_not_exist_is_refused_before_verl_starts(tmp_path: Path) -> None:
    """A typo in the reward's file name (relative to the experiment file) is one line naming the path and the .py
    files beside it, as a data path is: before verl's interpreter is started."""
    folder = tmp_path / "mine"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([user_row(i, "synthetic/arith") for i in range(16)]), folder / "train.parquet")
    (folder / "reward.py").write_text(INT_REWARD)
    raw = yaml.safe_load(CPU_SPACE.read_text())
    raw["overrides"].update({"data.train_files": "train.parquet", "data.val_files": "train.parquet",
                             "reward.custom_reward_function.path": "rewrd.py", "data.max_prompt_length": 64})
    raw["trial"]["prepare_command"] = None
    started = tmp_path / "verl-started"  # verl's interpreter, as trial.python: it says so when started
    spy = tmp_path / "verl-python"
    spy.write_text(f"#!/bin/sh\necho \"$@\" >> {started}\nexec {default_python()} \"$@\"\n")
    spy.chmod(0o755)
    raw["trial"]["python"] = str(spy)
    (folder / "experiment.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    res = validate(folder / "experiment.yaml")
    assert res.returncode == 2, (res.stdout, res.stderr)
    line, = errors(res)
    assert "overrides.reward.custom_reward_function.path" in line and f"{folder / 'rewrd.py'} does not exist" in \
        line and f"{folder} holds reward.py" in line, line
    assert not started.exists(), started.read_text()  # refused before verl's interpreter was started


@pytest.mark.parametrize(("value", "paths"), [
    ("a.parquet", ["a.parquet"]), (" [a.parquet, 'b c.parquet', \"d\"] ", ["a.parquet", "b c.parquet", "d"]),
    (["a.parquet", Path("b.parquet")], ["a.parquet", "b.parquet"]), ("[]", []), ("", []), (None, [])])
def test_a_files_value_is_one_path_a_hydra_list_or_a_yaml_list(value: object, paths: list[str]) -> None:
    assert split_list(value) == paths  # type: ignore[arg-type]


def test_a_missing_file_is_found_in_any_form_of_the_value(tmp_path: Path) -> None:
    (tmp_path / "here.parquet").write_bytes(b"")
    here, gone = str(tmp_path / "here.parquet"), str(tmp_path / "gone.parquet")
    for value in (f"[{here}, {gone}]", [here, gone]):
        assert (missing_files("data.val_files", value) or "").startswith(f"data.val_files: {gone} does not exist")
    assert missing_files("data.val_files", [here, "hdfs://x/y.parquet"]) is None
    assert missing_files("data.val_files", None) is None


def test_overlong_prompts_are_judged_as_verl_treats_them() -> None:
    found = {"rows": 400, "tokenized": 1, "count": 1, "first": [["/d/train.parquet", 150, 1664]],
             "longest": ["/d/train.parquet", 150, 1664], "capped": False, "limit": 128}
    for truncation in ("error", "left"):  # verl 0.9.1's RL path never reads data.truncation: its agent loop cuts
        level, line = overlong_verdict({**found, "truncation": truncation, "filter": False}) or ("", "")
        assert level == "warning" and "1 of 400 prompts are longer than data.max_prompt_length=128 tokens (first: " \
            "train.parquet row 150: 1664 tokens" in line and "keeps only their last 128 tokens" in line and \
            "raise data.max_prompt_length to 1664" in line, line
    level, line = overlong_verdict({**found, "truncation": "error", "filter": True}) or ("", "")
    assert level == "note" and "filter_overlong_prompts drops them" in line
    assert overlong_verdict({**found, "count": 0}) is None and overlong_verdict(None) is None


# ----------------------------------------------------------------------------- the shipped GSM8K-format data
def test_gsm8k_format_data_is_written_only_where_the_shipped_space_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq

    from hpo.backends.verl._data import main

    env_dir = tmp_path / "home"
    monkeypatch.setenv("HOME", str(env_dir))
    monkeypatch.setenv("VERL_HPO_TEST_DATA", str(env_dir / "elsewhere"))
    # a mistyped path to real data is an error, never replaced by synthetic problems; so is each item of a list
    assert main(["data.train_files=${oc.env:VERL_HPO_TEST_DATA}/train.parquet"]) == 2
    assert "train.parquet does not exist" in capsys.readouterr().err
    assert main(["data.train_files=[~/.cache/verl_hpo/gsm8k_small/train.parquet,'~/mine/b.parquet']"]) == 2
    assert "mine/b.parquet does not exist" in capsys.readouterr().err
    assert main(["data.train_files=${oc.env:NO_SUCH_VARIABLE_HPO}/x.parquet"]) == 2
    assert not (env_dir / "elsewhere").exists() and not (env_dir / ".cache").exists()
    shipped = read_yaml(SPACE_FILE)["overrides"]
    assert main(["--config", "ppo_trainer", f"data.train_files={shipped['data.train_files']}",
                 f"data.val_files={shipped['data.val_files']}", "data.train_batch_size=8"]) == 0
    d = env_dir / ".cache" / "verl_hpo" / "gsm8k_small"
    # files that exist are the user's: kept as they are (a list of them too)
    assert main([f"data.train_files=[{d / 'train.parquet'},{d / 'test.parquet'}]"]) == 0
    rows = pq.read_table(d / "train.parquet").to_pylist()
    val = pq.read_table(d / "test.parquet").to_pylist()
    assert (len(rows), len(val)) == (512, 128)
    row = rows[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith('after "####".')
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["answer"].endswith("#### " + row["reward_model"]["ground_truth"])
    assert {r["extra_info"]["question"] for r in rows}.isdisjoint({r["extra_info"]["question"] for r in val})


@needs_verl
def test_verls_gsm8k_reward_scores_the_worked_answers(tmp_path: Path) -> None:
    from hpo.backends.verl._data import write_parquet

    path = write_parquet(tmp_path / "test.parquet", "test", n=20)
    code = textwrap.dedent("""
        import sys, pyarrow.parquet as pq
        from verl.utils.reward_score import default_compute_score
        rows = pq.read_table(sys.argv[1]).to_pylist()
        truth = [r["reward_model"]["ground_truth"] for r in rows]
        print([default_compute_score(r["data_source"], r["extra_info"]["answer"], t) for r, t in zip(rows, truth)]
              + [default_compute_score("openai/gsm8k", "#### 999999", truth[0])])
    """)
    res = subprocess.run([str(VERL_PY), "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == str([1.0] * 20 + [0.0])
