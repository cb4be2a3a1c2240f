"""The fast decode loop against ``transformers.generate``: same greedy tokens, same warpers, same distribution."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from verl_core.decode import FastDecoder, sample_from_probs, sample_next, unsupported_reason
from verl_core.rollout import HFRollout, SamplingParams

PAD = 0


def _model(kind: str) -> Any:
    import transformers as tf

    common: dict[str, Any] = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  max_position_embeddings=128, pad_token_id=PAD, bos_token_id=None,
                                  eos_token_id=None)
    cfg = {
        "llama": lambda: tf.LlamaConfig(**common, attention_bias=True, mlp_bias=True),
        "qwen2": lambda: tf.Qwen2Config(**common, tie_word_embeddings=True),
        "qwen3": lambda: tf.Qwen3Config(**common),
        "mistral": lambda: tf.MistralConfig(**common, sliding_window=4096),
        "llama_rope_scaled": lambda: tf.LlamaConfig(**{**common, "rope_parameters": {
            "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    }[kind]()
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    for p in model.parameters():  # larger weights than the init: peaked, input-dependent greedy choices
        p.data.mul_(4.0) if p.dim() > 1 else None
    return model


def _prompts(b: int = 12, p: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (b, p), generator=g)
    mask = torch.ones(b, p, dtype=torch.long)
    for i in range(b):  # left padding of 0..5 tokens
        pad = i % 6
        mask[i, :pad] = 0
        ids[i, :pad] = PAD
    return ids, mask


def _hf_greedy(model: Any, ids: torch.Tensor, mask: torch.Tensor, new: int, eos: int) -> torch.Tensor:
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=False, max_new_tokens=new, pad_token_id=PAD, eos_token_id=eos)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)[:, ids.shape[1]:]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "llama_rope_scaled"])
def test_greedy_tokens_equal_generate(kind: str) -> None:
    model = _model(kind)
    assert unsupported_reason(model, 64) is None
    ids, mask = _prompts()
    fast = FastDecoder(model)
    want = _hf_greedy(model, ids, mask, 12, eos=1)  # token 1 is rare: full length
    got = fast.generate(ids, mask, 12, eos_id=1, pad_id=PAD, do_sample=False).tokens
    assert torch.equal(got, want)
    assert len(set(want[:, 0].tolist())) > 3  # rows differ: padding and prompts matter
    # a frequent token as EOS: rows stop at different steps, pad after, early exit when all stopped
    eos = int(want[:, 3].mode().values)
    want = _hf_greedy(model, ids, mask, 12, eos=eos)
    got = fast.generate(ids, mask, 12, eos_id=eos, pad_id=PAD, do_sample=False).tokens
    assert (want == eos).any()
    assert torch.equal(got, want)


def _tiny_arith_engine(model_dir: Path, n_prompts: int) -> tuple[Any, Any, HFRollout, Any]:
    """(tokenizer, model, HF engine, left-padded encoding of the first ``n_prompts`` arithmetic prompts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_core import tasks

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    texts = [tok.apply_chat_template([{"role": "user", "content": tasks.prompt_text(a, b)}], tokenize=False,
                                     add_generation_prompt=True) for a, b in tasks.all_problems()[:n_prompts]]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left")
    return tok, model, HFRollout(model, tok.pad_token_id, tok.eos_token_id, contextlib.nullcontext), enc


def test_tiny_arith_greedy_equals_generate_before_and_after_an_update(tiny_model_dir: Path) -> None:
    """The decoder reads the live weights: after an optimizer step it still matches generate."""
    tok, model, engine, enc = _tiny_arith_engine(tiny_model_dir, 40)
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=8)
    before = engine.generate(enc.input_ids, enc.attention_mask, greedy)
    assert engine.backend == "fast"
    assert torch.equal(before, _hf_greedy(model, enc.input_ids, enc.attention_mask, 8, tok.eos_token_id))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask)
    out.logits[:, -1].logsumexp(-1).mean().backward()
    opt.step()
    after = engine.generate(enc.input_ids, enc.attention_mask, greedy)
    assert not torch.equal(after, before)
    assert torch.equal(after, _hf_greedy(model, enc.input_ids, enc.attention_mask, 8, tok.eos_token_id))


@pytest.mark.parametrize("fast_decode", [True, False])
def test_greedy_at_temperature_zero_equals_generate(tiny_model_dir: Path, fast_decode: bool) -> None:
    """verl's validation default (do_sample=false, temperature=0): greedy never divides by the temperature,
    on the fast decoder and on the transformers-generate fallback alike (which must not warn about it)."""
    import warnings

    tok, model, engine, enc = _tiny_arith_engine(tiny_model_dir, 40)
    engine.fast_decode = fast_decode
    want = _hf_greedy(model, enc.input_ids, enc.attention_mask, 8, tok.eos_token_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = engine.generate(enc.input_ids, enc.attention_mask,
                              SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=8))
    assert engine.backend == ("fast" if fast_decode else "generate")
    assert torch.equal(got, want)
    assert len(set(want[:, 0].tolist())) > 1  # real, prompt-dependent answers (not argmax 0 everywhere)


def test_generate_fallback_greedy_ignores_the_models_sampling_defaults() -> None:
    """A checkpoint whose generation_config samples (as Qwen's do): greedy through transformers generate stays
    greedy, and transformers does not log that temperature/top_p/top_k "may be ignored"."""
    import logging

    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    model = _model("qwen2")
    ids, mask = _prompts(4, 5)
    want = _hf_greedy(model, ids, mask, 6, eos=1)
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, pad_token_id=PAD)
    engine = HFRollout(model, PAD, 1, contextlib.nullcontext, fast_decode=False)
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    hf_logger = hf_logging.get_logger()
    hf_logger.addHandler(handler)
    try:
        got = engine.generate(ids, mask, SamplingParams(do_sample=False, temperature=0.0, max_new_tokens=6))
    finally:
        hf_logger.removeHandler(handler)
    assert engine.backend == "generate" and torch.equal(got, want)
    assert not [m for m in messages if "may be ignored" in m or "do_sample" in m], messages


def test_sampling_at_temperature_zero_is_refused() -> None:
    logits = torch.randn(4, 10)
    assert torch.equal(sample_next(logits, 0.0, -1, 1.0, False), logits.argmax(-1))
    with pytest.raises(ValueError, match="temperature=0.0"):
        sample_next(logits, 0.0, -1, 1.0, True)
    ids, mask = _prompts(2, 3)
    with pytest.raises(ValueError, match="temperature=0.0"):
        FastDecoder(_model("qwen2")).generate(ids, mask, 2, eos_id=1, pad_id=PAD, do_sample=True, temperature=0.0)


def test_unsupported_models_fall_back_to_generate() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert "gpt2" in (unsupported_reason(model, 20) or "")
    engine = HFRollout(model, PAD, 1, contextlib.nullcontext)
    ids, mask = _prompts(4, 5)
    out = engine.generate(ids % 50, mask, SamplingParams(n=2, max_new_tokens=3))
    assert engine.backend == "generate" and out.shape == (8, 3)
    mistral = _model("mistral")
    mistral.config.sliding_window = 16
    assert "sliding_window=16" in (unsupported_reason(mistral, 20) or "")
    assert unsupported_reason(mistral, 16) is None
    engine = HFRollout(_model("qwen2"), PAD, 1, contextlib.nullcontext, fast_decode=False)
    engine.generate(ids, mask, SamplingParams(max_new_tokens=2))
    assert engine.backend == "generate"


def test_sample_from_probs_matches_the_distribution() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    draws = sample_from_probs(probs, g)
    freq = torch.bincount(draws, minlength=6).double() / draws.numel()
    assert freq[[0, 2, 5]].sum() == 0  # zero-probability tokens never drawn, the last one included
    torch.testing.assert_close(freq, probs[0].double(), atol=0.015, rtol=0)
    # unnormalised rows are fine (the draw scales by the row total)
    assert sample_from_probs(torch.tensor([[0.0, 0.0, 3.0]]), g).tolist() == [2]


def test_warpers_keep_the_tokens_hf_keeps() -> None:
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    for top_k, top_p in [(5, 1.0), (0, 0.7), (10, 0.5), (0, 0.05)]:
        want = logits / 0.7
        if top_k:
            want = TopKLogitsWarper(top_k)(None, want)  # type: ignore[arg-type]
        if top_p < 1:
            want = TopPLogitsWarper(top_p)(None, want)  # type: ignore[arg-type]
        allowed = torch.isfinite(want)
        for _ in range(30):
            tok = sample_next(logits, 0.7, top_k, top_p, True)
            assert allowed.gather(1, tok[:, None]).all(), (top_k, top_p)
    assert torch.equal(sample_next(logits, 0.7, 5, 0.5, False), logits.argmax(-1))
    # a vanishing top_p (1 - p rounds to 1 in float32) still keeps the most likely token
    assert torch.equal(sample_next(logits, 1.0, 0, 1e-9, True), logits.argmax(-1))


def test_decode_log_probs_equal_the_actor_forward(tiny_model_dir: Path) -> None:
    """with_log_probs: the decode steps' log-probs / entropies are what compute_log_prob recomputes (fp32)."""
    from verl_core.rollout import response_mask
    from verl_core.workers import Policy

    tok, model, engine, enc = _tiny_arith_engine(tiny_model_dir, 24)
    torch.manual_seed(0)
    params = SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=10, log_probs=True)
    responses = engine.generate(enc.input_ids, enc.attention_mask, params)
    lp, ent = engine.last_log_probs, engine.last_entropy
    assert lp is not None and ent is not None and lp.shape == responses.shape == ent.shape
    rmask = response_mask(responses, tok.eos_token_id)
    assert (rmask == 0).any()  # some rows stop early: their tail must be 0 in both
    attn = torch.cat([enc.attention_mask.repeat_interleave(2, 0), rmask], 1)
    batch = {"input_ids": torch.cat([enc.input_ids.repeat_interleave(2, 0), responses], 1), "attention_mask": attn,
             "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "responses": responses}
    want_lp, want_ent = Policy(model, 0.7, contextlib.nullcontext).compute_log_prob(batch, 16)
    assert want_ent is not None
    torch.testing.assert_close(lp, want_lp * rmask, atol=1e-4, rtol=0)
    torch.testing.assert_close(ent, want_ent * rmask, atol=1e-4, rtol=0)
    assert float((lp - want_lp * rmask).abs().max()) < 1e-4 and float(lp.min()) < -0.1
    engine.generate(enc.input_ids, enc.attention_mask, SamplingParams(max_new_tokens=4))
    assert engine.last_log_probs is None  # only when asked
