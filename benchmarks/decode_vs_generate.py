"""Rollout on CPU: our HF engine's decode loop (``verl_core.decode.FastDecoder``) vs ``transformers.generate``.

    PYTHONPATH=. .venv/bin/python -m benchmarks.decode_vs_generate ASSETS_DIR [--batch 64] [--new-tokens 32]
        [--reps 5] [--threads 2]

The benchmark policy of ``benchmarks._assets`` (its EOS is outside the model's vocabulary, so every
row decodes exactly ``--new-tokens`` tokens on both sides), the trainer's sampling (temperature 1, no
top-k/top-p), the same left-padded batch; repetitions interleaved (generate, ours, ours, generate,
...). Greedy outputs are compared token for token first. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("assets")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import contextlib

    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from verl_core.rollout import HFRollout, SamplingParams

    torch.set_num_threads(args.threads)
    policy = str(Path(args.assets) / "policy")
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    rows = pq.read_table(str(Path(args.assets) / "train.parquet")).to_pylist()
    texts = [tok.apply_chat_template([dict(m) for m in r["prompt"]], tokenize=False, add_generation_prompt=True)
             for r in rows]
    texts = (texts * (args.batch // len(texts) + 1))[: args.batch]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left")
    engine = HFRollout(model, tok.pad_token_id, tok.eos_token_id, contextlib.nullcontext)

    def ours(sample: bool) -> torch.Tensor:
        return engine.generate(enc.input_ids, enc.attention_mask,
                               SamplingParams(do_sample=sample, max_new_tokens=args.new_tokens))

    def generate(sample: bool) -> torch.Tensor:
        cfg = GenerationConfig(do_sample=sample, max_new_tokens=args.new_tokens, pad_token_id=tok.pad_token_id,
                               eos_token_id=tok.eos_token_id, **({"temperature": 1.0, "top_k": 0, "top_p": 1.0}
                                                                 if sample else {}))
        with torch.no_grad():
            return model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask,  # type: ignore
                                  generation_config=cfg)[:, enc.input_ids.shape[1]:]

    greedy_equal = bool(torch.equal(ours(False), generate(False)))
    assert engine.backend == "fast"
    times: dict[str, list[float]] = {"ours": [], "generate": []}
    for f in (ours, generate):  # warm-up
        f(True)
    for rep in range(args.reps):
        order = [("generate", generate), ("ours", ours)]
        for name, f in order if rep % 2 == 0 else reversed(order):
            t0 = time.perf_counter()
            out = f(True)
            times[name].append(time.perf_counter() - t0)
            assert out.shape == (args.batch, args.new_tokens), out.shape
    tokens = args.batch * args.new_tokens
    print(json.dumps({
        "batch": args.batch, "new_tokens": args.new_tokens, "reps": args.reps, "threads": args.threads,
        "greedy_tokens_equal": greedy_equal,
        "ours_tokens_per_s": [tokens / t for t in times["ours"]],
        "generate_tokens_per_s": [tokens / t for t in times["generate"]],
        "ours_median_s": statistics.median(times["ours"]), "generate_median_s": statistics.median(times["generate"]),
    }))


if __name__ == "__main__":
    main()
