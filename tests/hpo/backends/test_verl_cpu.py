"""verl on the CPU, the driver's side (issue 33): what a trial handed no devices gets (overrides, environment,
TransferQueue sizing), the interpreter check for the CPU platform, and the arith task's prepare step. The real
trainer runs in ``test_verl_real.py``; the plugin's own patches are tested in ``tests/plugins/``."""

from __future__ import annotations

import runpy
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpo.backends.verl import ComposedConfig, interpreter_problem, verl_argv, verl_env
from hpo.backends.verl._arith import REWARD_SOURCE, TEST_SOURCE, ensure
from hpo.backends.verl._cpu import (
    CPU_OVERRIDES,
    PLUGIN_MODULE,
    cpu_env,
    cpu_overrides,
    storage_units,
    transfer_queue_overrides,
)
from hpo.backends.verl._data import missing_files, split_list

TQ = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


def _keys(argv: list[str]) -> dict[str, str]:
    return {a.split("=", 1)[0].lstrip("+"): a.split("=", 1)[1] for a in argv if "=" in a}


def test_a_trial_without_devices_gets_the_cpu_platform_and_one_with_gpus_does_not(tmp_path: Path) -> None:
    cpu = _keys(verl_argv("py", "ppo_trainer", ["data.train_batch_size=8"], "s", 0, tmp_path / "0", n_gpus=0))
    assert cpu["trainer.device"] == "cpu" and cpu["ray_kwargs.ray_init.num_gpus"] == "1"
    assert cpu["actor_rollout_ref.actor.strategy"] == "fsdp2" and cpu["trainer.n_gpus_per_node"] == "1"
    assert cpu[TQ] == "2"
    gpu = _keys(verl_argv("py", "ppo_trainer", ["data.train_batch_size=8"], "s", 0, tmp_path / "0", n_gpus=2))
    assert "trainer.device" not in gpu and "ray_kwargs.ray_init.num_gpus" not in gpu
    assert TQ in gpu and gpu["trainer.n_gpus_per_node"] == "2"


def test_keys_the_experiment_sets_are_left_to_it() -> None:
    mine = ["+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "actor_rollout_ref.actor.strategy=fsdp", f"{TQ}=5", "ray_kwargs.ray_init.num_cpus=4"]
    added = cpu_overrides(mine)
    keys = [a.split("=", 1)[0].lstrip("+") for a in added]
    assert "actor_rollout_ref.model.override_config.attn_implementation" not in keys  # a second '+key' would fail
    assert "actor_rollout_ref.actor.strategy" not in keys and "ray_kwargs.ray_init.num_cpus" not in keys
    assert len(added) == len(CPU_OVERRIDES) - 3
    assert transfer_queue_overrides(mine, cpu_platform=True) == []


@pytest.mark.parametrize(("cpus", "cpu_platform", "units"),
                         [(2, True, 2), (64, True, 2), (2, False, 2), (16, False, 4), (64, False, 8)])
def test_transfer_queue_storage_units_fit_the_host(cpus: int, cpu_platform: bool, units: int) -> None:
    """verl's 8 storage actors of one CPU each never place on a small Ray node (the run hangs in tq.init)."""
    assert storage_units(cpus, cpu_platform) == units
    assert transfer_queue_overrides([], cpu_platform, cpus) == [f"++{TQ}={units}"]


def test_the_cpu_environment_loads_the_plugin_and_keeps_the_trial_s_own(tmp_path: Path) -> None:
    env = cpu_env({"CUDA_VISIBLE_DEVICES": "", "VERL_USE_EXTERNAL_MODULES": "my_mod", "VLLM_CPU_KVCACHE_SPACE": "4"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"my_mod,{PLUGIN_MODULE}" and env["VERL_PLATFORM"] == "cpu"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the trial's value wins
    assert "CUDA_VISIBLE_DEVICES" not in env  # "" makes Ray refuse the logical GPU
    assert cpu_env(env)["VERL_USE_EXTERNAL_MODULES"] == env["VERL_USE_EXTERNAL_MODULES"]  # added once
    trial = verl_env({"CUDA_VISIBLE_DEVICES": ""}, tmp_path / "t", cpu=True)
    assert trial["VERL_PLATFORM"] == "cpu" and "VERL_PLATFORM" not in verl_env({}, tmp_path / "u")


def _composed(**changes: object) -> ComposedConfig:
    base = dict(rollout_name="vllm", strategy="fsdp2", attn_implementation="sdpa", val_core_var="acc",
                seed_keys=(), val_n=1, data_sources=("s",), total_training_steps=4, test_freq=1, save_freq=2,
                val_before_train=True, n_gpus=1, use_critic=False, use_reference_policy=True,
                adv_estimator="grpo", train_files=(), val_files=())
    fields = ComposedConfig.__dataclass_fields__
    return ComposedConfig(**{k: v for k, v in {**base, **changes}.items() if k in fields})  # type: ignore[arg-type]


def test_the_interpreter_check_on_the_cpu_asks_for_the_plugin_and_vllm_s_cpu_build() -> None:
    ready = {"torch": "2.13.0+cpu", "torch_cuda": None, "vllm": True, "vllm_version": "0.27.1+cpu",
             "verl_cpu_platform": True, "flash_attn": False}
    info = _composed()
    assert interpreter_problem(ready, info, "py", cpu=True) is None
    assert "make install-verl" in (interpreter_problem({**ready, "verl_cpu_platform": False}, info, "py", cpu=True)
                                   or "")
    assert "vllm 0.27.1" in (interpreter_problem({**ready, "vllm_version": "0.27.1"}, info, "py", cpu=True) or "")
    assert "SGLang" in (interpreter_problem(ready, _composed(rollout_name="sglang"), "py", cpu=True) or "")
    assert "without CUDA" in (interpreter_problem(ready, info, "py", cpu=False) or "")  # the same venv for GPUs


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
