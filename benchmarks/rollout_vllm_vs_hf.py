"""Rollout throughput, vLLM vs HF ``generate``, on the builtin tiny_arith model and this CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/rollout_vllm_vs_hf.py [--batch 64] [--new-tokens 32] [--reps 5]

Both engines decode the same batch (the validation prompts, repeated to ``--batch``) greedily
for exactly ``--new-tokens`` tokens (EOS masked: ``min_new_tokens`` for HF, ``min_tokens`` for
vLLM), repetitions interleaved (HF, vLLM, HF, ...), median tokens/s reported. Also measured:
engine start (``VLLMRollout`` construction), ``sync_weights`` per step (in-memory reload vs the
safetensors-file path, each with the probe verification), and what the naive
``model.load_weights`` does on the CPU backend. Prints one JSON object.

``measure`` is shared with ``benchmarks/gpu_rollout.py`` (the same measurement on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the JSON only

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _hf_generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new: int, autocast: Any
                 ) -> torch.Tensor:
    with torch.no_grad(), autocast():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,  # type: ignore
                             min_new_tokens=new, pad_token_id=0)
    return out[:, ids.shape[1] :]


def _vllm_generate(llm: Any, ids: torch.Tensor, mask: torch.Tensor, new: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=r[m.bool()].tolist()) for r, m in zip(ids.cpu(), mask.cpu())]
    # min_tokens masks EOS like HF's min_new_tokens (ignore_eos would keep EOS tokens in the output)
    sp = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, detokenize=False)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]


def measure(model_dir: str, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, reps: int,
            device: torch.device, rollout_overrides: dict[str, Any], hf_autocast: Any, syncs: int = 10,
            naive_load: bool = False) -> dict[str, Any]:
    """HF vs vLLM tokens/s on (ids, mask), engine start, sync cost. ``ids``: (B, P) left-padded."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from verl_core.config import RolloutConfig
    from verl_core.vllm_rollout import VLLMRollout

    res: dict[str, Any] = {"batch": ids.shape[0], "new_tokens": new_tokens, "reps": reps,
                           "torch_threads": torch.get_num_threads()}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()  # type: ignore
    res["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    cfg = dataclasses.replace(RolloutConfig(name="vllm"), **rollout_overrides)
    t0 = time.perf_counter()
    engine = VLLMRollout(model_dir, cfg, ids.shape[1], new_tokens, 0, 1, device, seed=1)
    res["engine"] = {"dtype": engine.dtype, "start_s": round(engine.start_s, 2),
                     "construct_s": round(time.perf_counter() - t0, 2)}
    ids, mask = ids.to(device), mask.to(device)

    _hf_generate(model, ids[:2], mask[:2], 2, hf_autocast)  # warm-up both
    _vllm_generate(engine.llm, ids[:2], mask[:2], 2)
    hf_t: list[float] = []
    vl_t: list[float] = []
    first: dict[str, Any] = {}
    for _ in range(reps):
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        hf_out = _hf_generate(model, ids, mask, new_tokens, hf_autocast)
        sync()
        hf_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        vl_out = _vllm_generate(engine.llm, ids, mask, new_tokens)
        vl_t.append(time.perf_counter() - t0)
        first = {"hf": hf_out.cpu(), "vllm": vl_out}
    n_tok = ids.shape[0] * new_tokens
    assert first["hf"].shape == (ids.shape[0], new_tokens), first["hf"].shape
    assert all(len(r) == new_tokens for r in first["vllm"])
    hf_tps, vl_tps = n_tok / statistics.median(hf_t), n_tok / statistics.median(vl_t)
    equal = first["hf"] == torch.tensor(first["vllm"])
    res["hf"] = {"tokens_per_s": round(hf_tps, 1), "median_s": round(statistics.median(hf_t), 3)}
    res["vllm"] = {"tokens_per_s": round(vl_tps, 1), "median_s": round(statistics.median(vl_t), 3)}
    res["vllm_over_hf"] = round(vl_tps / hf_tps, 2)
    # fp32 on CPU: identical; bf16 vs fp32+autocast on GPU may drift apart after a near-tie
    res["greedy_rows_identical"] = round(equal.all(-1).float().mean().item(), 4)
    res["greedy_token_agreement"] = round(equal.float().mean().item(), 4)

    # weight sync: perturb the "trainer" weights (as an optimizer step would), sync, verify
    sync_res: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)
    for path in ("in_memory", "safetensors_file"):
        engine.in_process = path == "in_memory"
        total, reload, diff = [], [], []
        for _ in range(syncs):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen).to(p.device, p.dtype) * 1e-3)
            engine.sync_weights(model)
            total.append(engine.last_sync_s)
            reload.append(engine.last_reload_s)
            diff.append(engine.last_sync_logprob_diff)
        sync_res[path] = {"first_s": round(total[0], 4), "first_reload_s": round(reload[0], 4),
                          "median_s": round(statistics.median(total[1:] or total), 4),
                          "reload_median_s": round(statistics.median(reload[1:] or reload), 4),
                          "probe_logprob_diff_max": float(f"{max(diff):.3g}")}
    res["sync"] = sync_res
    if engine.sleep_between:
        free_before = torch.cuda.mem_get_info()[0] / 1024**3
        t0 = time.perf_counter()
        engine.llm.sleep(level=1)
        free_after = torch.cuda.mem_get_info()[0] / 1024**3
        t1 = time.perf_counter()
        engine.llm.wake_up()
        res["sleep"] = {"sleep_s": round(t1 - t0, 3), "wake_s": round(time.perf_counter() - t1, 3),
                        "freed_gb": round(free_after - free_before, 1)}
    if naive_load:  # what verl/TRL's direct load_weights does here (last: it leaves the engine half-loaded)
        try:
            engine.llm.apply_model(lambda m: m.load_weights(iter(model.state_dict().items())))
            res["naive_load_weights"] = "ok"
        except Exception as err:  # noqa: BLE001 - reported, not handled
            res["naive_load_weights"] = f"{type(err).__name__}: {err}"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kv-gb", type=float, default=0.25, help="rollout.cpu_kvcache_space_gb")
    args = ap.parse_args()
    import contextlib

    from transformers import AutoTokenizer

    from verl_core.data import collate, load_examples
    from verl_core.tasks import ensure_arith_data
    from verl_core.tiny_model import cache_root, ensure_tiny_arith

    model_dir = str(ensure_tiny_arith())
    tok = AutoTokenizer.from_pretrained(model_dir)
    val = load_examples(str(ensure_arith_data(cache_root())[1]), "val", tok, "prompt", 16)
    examples = [val[i % len(val)] for i in range(args.batch)]
    pb = collate(examples, list(range(len(examples))), tok.pad_token_id)
    res = measure(model_dir, pb.input_ids, pb.attention_mask, args.new_tokens, args.reps, torch.device("cpu"),
                  {"cpu_kvcache_space_gb": args.kv_gb}, contextlib.nullcontext, naive_load=True)
    res["model"] = "builtin:tiny_arith"
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
