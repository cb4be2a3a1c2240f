"""verl_core.memory: parameter counts against real models, the estimate's arithmetic by hand, torch-free import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl_core import memory
from verl_core.config import ConfigError, load_config
from verl_core.memory import GiB, ModelShape

REPO = Path(__file__).resolve().parents[2]

# A small Llama: V=1000, H=64, I=128, 2 layers, 4 heads x 16, 2 KV heads, tied embeddings, no biases.
SMALL = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "tie_word_embeddings": True}


def test_param_count_by_hand() -> None:
    s = ModelShape.from_config(SMALL)
    # attention: q 64x64 + k,v 2 x 64x32 + o 64x64 = 4096 + 4096 + 4096 = 12288; MLP 3 x 64x128 = 24576; norms 128
    assert s.layer_params() == 12288 + 24576 + 128 == 36992
    # embedding 1000x64 + 2 layers + final norm; tied LM head adds nothing
    assert s.causal_lm_params() == 64000 + 2 * 36992 + 64 == 138048
    assert ModelShape.from_config({**SMALL, "tie_word_embeddings": False}).causal_lm_params() == 138048 + 64000
    # critic / reward model: no LM head, a 64 -> 1 head with bias
    assert s.value_model_params() == 138048 + 65
    # per-token saved activations: per layer 4H + 2Hq + 2Hkv + 4I = 256 + 128 + 64 + 512 = 960
    assert s.activation_elems_per_token(checkpointing=False) == 2 * 960 + 3 * 64 == 2112
    assert s.activation_elems_per_token(checkpointing=True) == 2 * 64 + 960 + 3 * 64 == 1280
    assert s.activation_bytes_per_token(checkpointing=False, autocast=False) == 2112 * 4
    # bf16 autocast: per layer 16H (fp32 norms) + 2 x (2H + 2Hq + 2Hkv + 4I) = 1024 + 2 x 832 = 2688; + 12H
    assert s.activation_bytes_per_token(checkpointing=False, autocast=True) == 2 * 2688 + 12 * 64 == 6144
    assert s.activation_bytes_per_token(checkpointing=True, autocast=True) == 4 * 2 * 64 + 2688 + 12 * 64 == 3968
    # KV cache: 2 x 2 layers x 2 heads x 16 x 4 B = 512 B per token
    assert s.kv_bytes_per_token(4) == 512
    # 4-bit: linear weights 2 x (12288 + 24576) = 73728 at 0.5 B + 73728/64 absmax x 4 B; the rest in bf16
    q = ModelShape.from_config({**SMALL, "dtype": "bfloat16", "quantization_config": {"load_in_4bit": True}})
    assert q.weight_bytes(138048) == 73728 // 2 + 73728 // 64 * 4 + (138048 - 73728) * 2


def test_estimate_arithmetic_by_hand() -> None:
    """GRPO, 8 prompts x 2 samples, micro 4, prompt 24 + response 8 tokens, no validation, CPU."""
    cfg = load_config(None, [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "data.max_prompt_length=24", "data.max_response_length=8", "trainer.val_before_train=false",
        "trainer.test_freq=0", "evaluation.toxicity.enable=false"])
    est = memory.estimate(cfg, SMALL, device="cpu")
    c = {x.name: x.bytes for x in est.components}
    p = 138048
    assert c["actor weights"] == p * 4 == 552192
    assert c["actor gradients"] == 552192
    assert c["actor AdamW states"] == p * 8 == 1104384
    assert "critic weights" not in c and "reference weights" not in c  # GRPO without KL
    # 16 samples x 32 tokens x 512 B
    assert c["rollout KV cache"] == 16 * 32 * 512 == 262144
    # prefill 16 x 24 x (2 x 64 + 3 x 128) x 4 B + decode logits 16 x 1000 x (4 + 4 + 8) B
    assert c["rollout prefill + step logits"] == 16 * 24 * 512 * 4 + 16 * 1000 * 16 == 1042432
    # on-policy (1 epoch, 1 mini-batch, no KL): no old-log-prob pass
    assert "log-prob logits" not in c
    assert c["actor activations"] == 4 * 32 * 2112 * 4 == 1081344
    # the dense gradients of the embedding and the (tied) LM head in backward: 2 x 1000 x 64 x 4 B
    assert c["actor embedding + LM-head grads (backward)"] == 512000
    # 4 samples x 9 positions (R + 1) x 1000 vocab x copies x 4 B
    assert c["actor logits"] == 4 * 9 * 1000 * 4 * memory.LOGITS_COPIES_TRAIN
    persistent = memory.CPU_BASELINE_BYTES + 552192 * 4
    assert est.persistent == persistent
    assert est.peak_phase == "update_actor"
    assert est.total == persistent + 1081344 + 512000 + c["actor logits"]
    assert est.allocated_total == est.total - memory.CPU_BASELINE_BYTES


def test_ppo_with_critic_reference_and_cuda() -> None:
    cfg = load_config(None, ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                             "algorithm.use_kl_in_reward=true", "data.max_prompt_length=24",
                             "data.max_response_length=8"])
    est = memory.estimate(cfg, SMALL, device="cuda", val_prompts=10)
    c = {x.name: x for x in est.components}
    assert c["critic weights"].bytes == (138048 + 65) * 4 and c["reference weights"].bytes == 138048 * 4
    assert c["critic AdamW states"].bytes == (138048 + 65) * 8
    assert c["log-prob logits"].phase == "log_prob"  # two mini-batches: the old-log-prob pass runs
    assert c["framework baseline"].bytes == memory.CUDA_BASELINE_BYTES
    assert c["rollout KV cache"].bytes == 10 * 32 * 256  # 10 validation prompts > 8 training rows; bf16
    ckpt_cfg = load_config(None, ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                  "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                                  "data.max_prompt_length=24", "data.max_response_length=8"])
    ckpt = memory.estimate(ckpt_cfg, SMALL, device="cuda")
    ratio = {x.name: x.bytes for x in ckpt.components}["actor activations"] / c["actor activations"].bytes
    assert ratio == pytest.approx(3968 / 6144, rel=1e-3)


def test_vllm_share_on_gpu() -> None:
    cfg = load_config(None, ["actor_rollout_ref.rollout.name=vllm",
                             "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "data.train_batch_size=8",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=8"])
    est = memory.estimate(cfg, SMALL, device="cuda", gpu_total_bytes=80 * GiB)
    share = {x.name: x for x in est.components}["vLLM engine (weights + KV cache)"]
    assert share.bytes == int(0.4 * 80 * GiB) and share.phase == "persistent"
    assert "rollout KV cache" not in {x.name for x in est.components}


def test_not_fitting_names_the_component_and_render() -> None:
    cfg = load_config("smollm2_addition", ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=256"])
    est = memory.estimate(cfg, device="cpu")
    assert est.peak_phase == "update_actor"
    msg = est.not_fitting(8 * GiB)
    assert msg is not None and "'actor activations'" in msg and "\n" not in msg
    assert est.not_fitting(est.total + 1) is None and est.fits(est.total)
    assert not est.fits(est.total, margin=0.1)
    table = est.render(16 * GiB, "test")
    assert "actor AdamW states" in table and "TOTAL (peak)" in table and "<- peak" in table


def test_read_model_config() -> None:
    assert memory.read_model_config("builtin:smollm2")["vocab_size"] == 49152
    assert memory.read_model_config("builtin:tiny_arith")["hidden_size"] == 128
    with pytest.raises(ConfigError, match="no config.json"):
        memory.read_model_config("/nonexistent/model", "actor_rollout_ref.model.path")
    with pytest.raises(ConfigError, match="not a decoder-only"):
        ModelShape.from_config({"hidden_size": 4})


def test_available_bytes_respects_the_cap() -> None:
    got = memory.available_bytes("cpu", memory_limit_gb=0.5)
    assert got.bytes == int(0.5 * GiB) and "memory-limit" in got.source
    assert memory.available_bytes("cpu").bytes > 0


def test_import_is_torch_free() -> None:
    code = ("import sys; from verl_core import memory, validate; from verl_core.config import load_config; "
            "e = memory.estimate(load_config('smollm2_addition'), device='cpu'); assert e.total > 0; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_param_counts_match_transformers_models() -> None:
    """The formulas against the real modules, built on the meta device (no memory, no weights)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from verl_core.pretrained import SMOLLM2_CONFIG
    from verl_core.tiny_model import tiny_config

    for cfg_dict in (SMOLLM2_CONFIG, tiny_config(), {**SMALL, "model_type": "qwen2"}):
        kwargs = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type", "dtype")}
        hf_cfg = AutoConfig.for_model(cfg_dict["model_type"], **kwargs)
        shape = ModelShape.from_config(cfg_dict)
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(hf_cfg)
            hf_cfg.num_labels = 1
            critic = AutoModelForTokenClassification.from_config(hf_cfg)
        assert shape.causal_lm_params() == sum(p.numel() for p in lm.parameters()), cfg_dict["model_type"]
        assert shape.value_model_params() == sum(p.numel() for p in critic.parameters()), cfg_dict["model_type"]
    assert ModelShape.from_config(SMOLLM2_CONFIG).causal_lm_params() == 134_515_008


@pytest.mark.skipif(memory.gpu_memory() != [], reason="checks the no-GPU case")
def test_gpu_metrics_are_empty_without_a_gpu() -> None:
    from verl_core.gpu_metrics import UtilizationSampler, gpu_utilization

    assert gpu_utilization() == {}
    with UtilizationSampler() as s:
        pass
    assert s.mean() is None
    assert memory.available_bytes("cuda", memory_limit_gb=2).bytes == 2 * GiB  # no GPU: the cap


def test_tiny_recipe_config_matches_the_built_model() -> None:
    """memory.read_model_config('builtin:tiny_arith') answers from the recipe before the model is built."""
    import json

    from verl_core.tiny_model import TINY_SHAPE, TINY_VOCAB, ensure_tiny_arith

    built = json.loads((ensure_tiny_arith(log=False) / "config.json").read_text())
    assert built["vocab_size"] == TINY_VOCAB
    assert {k: built[k] for k in TINY_SHAPE} == TINY_SHAPE
