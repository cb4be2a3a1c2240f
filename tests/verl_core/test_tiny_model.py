"""The built-in model is built locally and deterministically, and starts as a "sometimes right" policy."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from verl_core import tasks
from verl_core.tiny_model import build_tiny_arith


def test_build_is_deterministic(tiny_model_dir: Path, tmp_path: Path) -> None:
    build_tiny_arith(tmp_path / "again")
    a = load_file(str(tiny_model_dir / "model.safetensors"))
    b = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (tiny_model_dir / "tokenizer.json").read_text() == (tmp_path / "again" / "tokenizer.json").read_text()


def test_model_config_and_warm_start(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.head_dim == 64  # a size vLLM's CPU attention supports
    _, val = tasks.split_problems()
    prompts = [tok.apply_chat_template([{"role": "user", "content": tasks.prompt_text(a, b)}],
                                       add_generation_prompt=True, tokenize=False) for a, b in val]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=4, do_sample=True, top_k=0, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    acc = sum(t.strip() == str(a + b) for t, (a, b) in zip(texts, val)) / len(val)
    assert 0.05 < acc < 0.6  # sometimes right: room for PPO to learn
    assert all(t.strip().isdigit() for t in texts[:20])  # the answer format is learned


def test_task_split_is_disjoint_and_fixed() -> None:
    train, val = tasks.split_problems()
    assert len(train) == 320 and len(val) == 80
    assert not set(train) & set(val)
    assert tasks.split_problems() == (train, val)
