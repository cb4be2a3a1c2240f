"""Where the ``config.json`` of a verl model path comes from, for the memory estimate
(:mod:`hpo.backends.verl._memory_model`) and the rehearsal's small model: a local directory, else the Hugging Face
cache, else :data:`KNOWN_HUB_CONFIGS` (the hub models verl's examples and docs use), without a download and without
torch. :class:`ModelConfigUnavailable` when none has it: no estimate, not a bad config."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpo.backends._shapes import EstimateError, read_config_json

# config.json numbers of hub models verl's examples and docs use, so that a space naming one is estimated without a
# download (from each model's config.json on the Hugging Face hub; a local directory or the HF cache is read first).
_QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
             "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_QWEN25_14B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
               "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
               "num_key_value_heads": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_QWEN2_72B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
              "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
KNOWN_HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
        "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2.5-3B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2-7B-Instruct": _QWEN2_7B,
    "Qwen/Qwen2.5-7B-Instruct": _QWEN2_7B,
    "Qwen/Qwen2.5-14B-Instruct": _QWEN25_14B,
    "Qwen/Qwen2.5-Coder-14B-Instruct": _QWEN25_14B,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": _QWEN25_14B,
    "Qwen/Qwen2.5-32B-Instruct": {**_QWEN25_14B, "intermediate_size": 27648, "num_hidden_layers": 64},
    "Qwen/Qwen2-72B-Instruct": _QWEN2_72B,
    "Qwen/Qwen2.5-72B-Instruct": _QWEN2_72B,
}


class ModelConfigUnavailable(EstimateError):
    """No ``config.json`` for a model path (a hub id neither cached nor known): no estimate, not a bad config."""


def read_hub_or_local_config(path: str | None, key: str) -> dict[str, Any]:
    """``config.json`` of a verl model path: a local directory, else the Hugging Face cache
    (``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``) for a hub id, else
    :data:`KNOWN_HUB_CONFIGS`; :class:`ModelConfigUnavailable` when none has it."""
    if path is None:
        raise EstimateError(f"{key}=None: no model path")
    local = Path(path).expanduser()
    if local.is_dir():
        return read_config_json(str(local), key)
    hub = os.environ.get("HF_HUB_CACHE") or str(Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = Path(hub).expanduser() / f"models--{path.replace('/', '--')}" / "snapshots"
    for found in sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []:
        return read_config_json(str(found.parent), key)
    if path in KNOWN_HUB_CONFIGS:
        return dict(KNOWN_HUB_CONFIGS[path])
    raise ModelConfigUnavailable(f"{key}={path!r}: no local directory, not in the Hugging Face cache and not one of "
                                 f"the known hub models ({', '.join(KNOWN_HUB_CONFIGS)}): no memory estimate")
