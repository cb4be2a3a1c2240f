"""What the driver reads of a model without loading it (:mod:`hpo.backends._models`, ``study.fidelity.proxy``): which
tokenizer a local directory has (what decides token ids, not a size's own ``model_max_length``), the tiny_arith
family's shared tokenizer and hidden sizes (a ``scale_by: hidden_ratio`` transfer rule), and a hub id said unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpo.backends import backend_named, load_space, transfer_factors
from hpo.backends._models import local_facts
from hpo.experiment import SpaceError


def _dir(tmp_path: Path, name: str, config: dict[str, object]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def test_a_tokenizer_is_what_decides_its_ids_and_prompts(tmp_path: Path) -> None:
    small = _dir(tmp_path, "small", {"eos_token": "<e>", "chat_template": "{{m}}", "model_max_length": 512})
    large = _dir(tmp_path, "large", {"eos_token": "<e>", "chat_template": "{{m}}", "model_max_length": 32768})
    other = _dir(tmp_path, "other", {"eos_token": "<e>", "chat_template": "<|user|>{{m}}"})
    assert local_facts(str(small)).tokenizer == local_facts(str(large)).tokenizer  # a size's own length: the same
    assert local_facts(str(small)).tokenizer != local_facts(str(other)).tokenizer  # another chat template: not
    assert local_facts(str(tmp_path / "gone")).missing == f"{str(tmp_path / 'gone')!r} does not exist"
    hub = local_facts("Qwen/Qwen2.5-0.5B-Instruct")
    assert not hub.missing and hub.tokenizer is None and "hub id" in hub.note


def test_the_tiny_arith_family_shares_a_tokenizer_and_gives_its_hidden_sizes() -> None:
    b = backend_named("verl_core")
    s, l_ = b.model_facts("builtin:tiny_arith_s"), b.model_facts("builtin:tiny_arith_l")
    assert s.tokenizer == l_.tokenizer == ("family", "tiny_arith") and (s.hidden, l_.hidden) == (64, 256)
    space = load_space("kl_lr_proxy", ["study.fidelity.proxy.transfer={actor_lr: {scale_by: hidden_ratio}}"])
    assert transfer_factors(space, b) == {"actor_lr": 0.25}  # the target runs a quarter of the proxy's rate


def test_a_hidden_ratio_needs_both_hidden_sizes(tmp_path: Path) -> None:
    d = _dir(tmp_path, "noconfig", {})
    with pytest.raises(SpaceError, match=r"transfer\.actor_lr\.scale_by: hidden_ratio needs both models' hidden "):
        load_space("kl_lr_proxy", [f"study.fidelity.proxy.overrides.actor_rollout_ref.model.path={d}",
                                   "study.fidelity.proxy.transfer={actor_lr: {scale_by: hidden_ratio}}"])
