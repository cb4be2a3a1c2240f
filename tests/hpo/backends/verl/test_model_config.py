"""Where a verl model path's ``config.json`` comes from for the memory estimate and the rehearsal's small model
(``hpo/backends/verl/_model_config.py``): a local directory, else the Hugging Face cache, else the hub models verl's
examples use, never downloaded; none of them is :class:`ModelConfigUnavailable` (no estimate, not a bad config)."""

from __future__ import annotations

from typing import Any

import pytest

from hpo.backends.verl._model_config import KNOWN_HUB_CONFIGS, ModelConfigUnavailable, read_hub_or_local_config

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def test_model_config_from_a_local_dir_the_hub_cache_or_the_known_list(tmp_path: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_hub_or_local_config(QWEN, "k")["vocab_size"] == KNOWN_HUB_CONFIGS[QWEN]["vocab_size"]
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"vocab_size": 7, "hidden_size": 8, "num_hidden_layers": 1, '
                                      '"num_attention_heads": 2}')
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert read_hub_or_local_config("org/m", "k")["vocab_size"] == 7
    assert read_hub_or_local_config(str(snap), "k")["hidden_size"] == 8
    with pytest.raises(ModelConfigUnavailable, match="org/unknown"):
        read_hub_or_local_config("org/unknown", "k")
