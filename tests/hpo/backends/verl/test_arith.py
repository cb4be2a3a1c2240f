"""The arith task's prepare step (``hpo/backends/verl/_arith.py``; ``python -m hpo.backends.verl._arith``, which the
driver runs before a study of ``search_spaces/verl_grpo_cpu.yaml``): only its own missing files written (the data,
the reward, a test split of a data source of its own), never a path of the user's.

The real-verl CPU proxy example (issue 51): ``search_spaces/verl_grpo_cpu_proxy.yaml`` searches on the small
tiny_arith model for the large one. Before its prepare step neither model exists: the experiment still loads (the
arith task's models are the prepare step's to write, said in a note), and the study's prepare step writes the proxy's
model as well as the target's (the real ``python -m hpo.backends.verl._arith`` the driver runs, from the user's
directory). The real trials of such a study are those of ``test_real.py``; its validation with verl's own config
code was run by hand (docs/driver.md)."""

from __future__ import annotations

import os
import runpy
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpo.backends import backend_of, load_space, proxy_space
from hpo.backends.verl._arith import MODELS, REWARD_SOURCE, TEST_SOURCE, ensure
from tests.hpo.conftest import ROOT

EXAMPLE = ROOT / "search_spaces" / "verl_grpo_cpu_proxy.yaml"
MODEL_KEY = "actor_rollout_ref.model.path"


def test_the_arith_prepare_step_writes_only_its_own_missing_files(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    home = tmp_path / ".cache" / "verl_hpo" / "verl_arith"
    written = ensure([home / "train.parquet", home / "val.parquet", home / "reward.py"])
    assert [p.name for p in written] == ["train.parquet", "val.parquet", "reward.py"]
    rows = pq.read_table(home / "val.parquet").to_pylist()
    assert len(rows) == 225 and rows[0]["data_source"] == "synthetic/arith"
    assert ensure([home / "val.parquet"]) == []  # present: left alone
    score = runpy.run_path(str(home / "reward.py"))["compute_score"]
    assert (home / "reward.py").read_text() == REWARD_SOURCE
    assert score("synthetic/arith", " 19<|eos|>", "19") == 1.0 and score("synthetic/arith", "20", "19") == 0.0
    with pytest.raises(ValueError, match="does not exist"):
        ensure([tmp_path / "elsewhere" / "train.parquet"])  # the user's path: never generated


def test_the_arith_test_split_has_a_data_source_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl logs validation metrics per data source: the test rows' own source keeps their accuracy apart from the
    validation rows' when a confirmation run validates on both files. A test file from before is rewritten."""
    monkeypatch.setenv("HOME", str(tmp_path))
    home = tmp_path / ".cache" / "verl_hpo" / "verl_arith"
    test, val = home / "test.parquet", home / "val.parquet"
    assert ensure([val, test]) == [val, test]
    rows, val_rows = pq.read_table(test).to_pylist(), pq.read_table(val).to_pylist()
    assert len(rows) == 225 and {r["data_source"] for r in rows} == {TEST_SOURCE}
    assert not {r["prompt"][0]["content"] for r in rows} & {r["prompt"][0]["content"] for r in val_rows}
    assert ensure([test]) == []
    pq.write_table(pa.Table.from_pylist([{**r, "data_source": "synthetic/arith"} for r in rows]), test)  # older
    assert ensure([test]) == [test]
    assert {r["data_source"] for r in pq.read_table(test).to_pylist()} == {TEST_SOURCE}


def test_the_example_loads_before_its_models_exist_and_prepares_the_proxy_too(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VERL_HPO_CACHE", str(tiny_model_dir.parents[1]))  # verl_core's built models, kept per host
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the arith task's directory is the user's, empty
    home = tmp_path / "home" / ".cache" / "verl_hpo" / "verl_arith"
    space = load_space(str(EXAMPLE))
    assert "model_l' is written by the prepare step" in capfd.readouterr().err
    backend, proxy = backend_of(space), proxy_space(space, {})
    target_argv, proxy_argv = backend.prepare_argv(space), backend.prepare_argv(proxy)
    assert target_argv is not None and proxy_argv is not None
    assert f"{MODEL_KEY}={home / 'model_l'}" in [os.path.expandvars(a.replace("${oc.env:HOME}", "$HOME"))
                                                 for a in target_argv]
    assert proxy_argv[-1].startswith(f"{MODEL_KEY}=") and proxy_argv[-1].endswith("/verl_arith/model_s")
    # The proxy's prepare step, as the driver runs it (its interpreter, from the user's directory): the proxy's
    # model, the small member of the family, written into the task's directory.
    done = subprocess.run(proxy_argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    small = home / "model_s"
    assert (small / "config.json").is_file() and '"hidden_size": 64' in (small / "config.json").read_text()
    assert not (home / "model_l").exists()  # the target's is its own prepare step's (built for minutes: not here)
    # Once written, the proxy's facts are its directory's (its tokenizer is compared with the target's then).
    assert backend.model_facts(str(small)).hidden == 64
    assert set(MODELS) == {"model", "model_s", "model_l"}
