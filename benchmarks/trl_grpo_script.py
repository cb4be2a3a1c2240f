"""TRL side of the GRPO throughput row; run with the TRL 1.16 venv's python (``trl.GRPOTrainer``).

    .venv-bench-trl116/bin/python benchmarks/trl_grpo_script.py --assets DIR --steps N

Same policy, tokenizer and prompts as ours (``benchmarks/_assets.py``), the frozen reference
(``beta`` = our ``kl_loss_coef``, k3 estimator on both sides), the same rule reward (leading
integer equals the sum). One generation of ``prompts x generations`` completions per optimizer
step. Prints one JSON line: per-step seconds (between consecutive ``on_step_end`` callbacks,
the first from ``on_train_begin``) and response tokens per step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
_INT_RE = re.compile(r"-?\d+")


def arith_reward(completions: list, ground_truth: list, **_: object) -> list[float]:
    """verl_core.rewards.arith_score: 1.0 when the leading integer equals the ground truth."""
    out = []
    for c, gt in zip(completions, ground_truth):
        text = c[0]["content"] if isinstance(c, list) else str(c)
        m = _INT_RE.match(text.strip())
        out.append(1.0 if m is not None and m.group(0) == str(gt).strip() else 0.0)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--assets", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--response-length", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.04)
    args = p.parse_args()

    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    policy_dir = os.path.join(args.assets, "policy")
    tok = AutoTokenizer.from_pretrained(policy_dir, padding_side="left")
    rows = pq.read_table(os.path.join(args.assets, "train.parquet")).to_pylist()
    data = Dataset.from_list([{"prompt": [dict(m) for m in r["prompt"]],
                               "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    batch = args.prompts * args.generations
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_grpo_"), report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=args.generations, max_completion_length=args.response_length, temperature=1.0,
        top_p=1.0, beta=args.beta, num_iterations=1, epsilon=0.2, loss_type="dapo", learning_rate=args.lr,
        max_steps=args.steps, logging_steps=1, save_strategy="no", seed=1, dataloader_num_workers=0,
        log_completions=False,
    )
    marks: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *a: object, **k: object) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, *a: object, **k: object) -> None:
            marks.append(time.perf_counter())

        def on_log(self, _args: object, _state: object, _control: object, logs: dict | None = None,
                   **k: object) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    trainer = GRPOTrainer(model=model, reward_funcs=arith_reward, args=cfg, train_dataset=data,
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    print(json.dumps({"step_s": step_s, "response_tokens_per_step": batch * args.response_length,
                      "mean_completion_length": lengths, "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
