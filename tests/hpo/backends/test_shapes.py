"""The shapes every memory estimate of the driver shares (``hpo/backends/_shapes.py``), held to the same numbers as
``verl_core``'s own copy (``verl_core/memory_common.py``): the trainer runs without the driver and keeps its own, so
a change to one copy that the other lacks fails here."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hpo.backends import _shapes
from hpo.backends.verl._model_config import KNOWN_HUB_CONFIGS
from verl_core import memory_common
from verl_core.config import ConfigError
from verl_core.pretrained import smollm2_config
from verl_core.tiny_model import FAMILY, tiny_config

SHARED_METHODS = ("layer_params", "backbone_params", "causal_lm_params", "value_model_params")
MOE = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 512,
       "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "num_local_experts": 4,
       "tie_word_embeddings": False, "attention_bias": True, "torch_dtype": "bfloat16"}
WRAPPED = {"model_type": "llava", "text_config": {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                                                  "num_attention_heads": 4},
           "quantization_config": {"load_in_4bit": True}}
CONFIGS: dict[str, dict[str, Any]] = {**{f"builtin:{n}": tiny_config(n) for n in FAMILY},
                                      "builtin:smollm2": smollm2_config(), **KNOWN_HUB_CONFIGS, "moe": MOE,
                                      "wrapped": WRAPPED}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_driver_and_verl_core_read_one_shape_alike(name: str) -> None:
    ours = _shapes.ModelShape.from_config(CONFIGS[name], name)
    theirs = memory_common.ModelShape.from_config(CONFIGS[name], name)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)
    for method in SHARED_METHODS:
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    assert ours.lora_params(8) == theirs.lora_params(8)
    for checkpointing in (True, False):
        assert ours.activation_elems_per_token(checkpointing) == theirs.activation_elems_per_token(checkpointing)


def test_a_config_that_is_not_a_decoders_is_refused_alike() -> None:
    with pytest.raises(_shapes.EstimateError) as ours:
        _shapes.ModelShape.from_config({"hidden_size": 8}, "m/config.json")
    with pytest.raises(ConfigError) as theirs:
        memory_common.ModelShape.from_config({"hidden_size": 8}, "m/config.json")
    assert str(ours.value) == str(theirs.value) and "no integer vocab_size" in str(ours.value)


def test_the_tables_and_the_helpers_agree() -> None:
    lines = [("CUDA context", 3 * _shapes.GiB, "persistent", "ctx", None, "actor", False),
             ("weights", 2 * _shapes.GiB, "persistent", "w", "a.param_offload", "actor", True),
             ("cache", 5 * _shapes.GiB, "rollout", "kv", "r.gpu_memory_utilization", "vllm", False),
             ("activations", 4 * _shapes.GiB, "update", "acts", "a.micro", "actor", True),
             ("grads", 1 * _shapes.GiB, "update", "g", None, "actor", True)]
    phases = ("rollout", "update")
    ours = _shapes.MemoryEstimate(tuple(_shapes.Component(*c) for c in lines), "cuda", phases)
    theirs = memory_common.MemoryEstimate(tuple(memory_common.Component(*c) for c in lines), "cuda", phases)
    for budget in (6 * _shapes.GiB, 10 * _shapes.GiB, 20 * _shapes.GiB):
        assert ours.render(budget, "GPU 0") == theirs.render(budget, "GPU 0")
        assert ours.not_fitting(budget, 0.1) == theirs.not_fitting(budget, 0.1)
    assert (ours.total, ours.peak_phase, ours.dominant_key(), ours.allocated_peak("actor"), ours.as_dict()) == \
        (theirs.total, theirs.peak_phase, theirs.dominant_key(), theirs.allocated_peak("actor"), theirs.as_dict())
    assert ours.total == 10 * _shapes.GiB and ours.not_fitting(9 * _shapes.GiB) is not None
    assert _shapes.DTYPE_BYTES == memory_common.DTYPE_BYTES
    assert _shapes.CUDA_BASELINE_BYTES == memory_common.CUDA_BASELINE_BYTES
    for dtype in (None, "bf16", "torch.float32", "FP16", "int8", "unknown"):
        assert _shapes.dtype_bytes(dtype) == memory_common._dtype_bytes(dtype)
    for n in (49152, 410_000, 134_500_000):
        assert _shapes.compact_count(n) == memory_common._m(n)


def test_the_gpu_probe_reads_nvidia_smi_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 1000, 81559'\necho '1, 2000, 81559'\necho 'garbage'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert _shapes.gpu_memory() == memory_common.gpu_memory() == [(2000 * _shapes.MiB, 81559 * _shapes.MiB)]
    assert _shapes.gpu_total() == 81559 * _shapes.MiB
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert len(_shapes.gpu_memory()) == 2


def test_the_shared_module_imports_no_trainer_and_no_torch() -> None:
    """Read as text: its imports are the standard library's."""
    import ast

    tree = ast.parse(Path(_shapes.__file__).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= {"__future__", "json", "math", "os", "shutil", "subprocess", "dataclasses", "pathlib", "typing"}


def test_a_config_json_is_read_from_a_directory_only(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    assert _shapes.read_config_json(str(tmp_path), "k") == {"hidden_size": 8}
    with pytest.raises(_shapes.EstimateError, match="k='builtin:tiny_arith': not a local Hugging Face model"):
        _shapes.read_config_json("builtin:tiny_arith", "k")
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(_shapes.EstimateError, match="not a JSON object"):
        _shapes.read_config_json(str(tmp_path), "k")
