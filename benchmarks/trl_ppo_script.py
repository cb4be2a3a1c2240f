"""TRL side of the PPO throughput rows; run with the TRL 1.12 venv's python (``trl.experimental.ppo``).

    .venv-bench-trl112/bin/python benchmarks/trl_ppo_script.py --assets DIR --steps N --mini-batches M --epochs E

Loads the benchmark's policy (actor, frozen reference copy, value model = policy backbone + new
1-label head) and reward model from ``benchmarks/_assets.py``'s directory; the prompts are the
same parquet as ours, rendered with the same chat template. Prints one JSON line: per-step
seconds (time between consecutive ``on_step_end`` callbacks; the first step counts from
``on_train_begin``) and response tokens per step.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--assets", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--response-length", type=int, default=32)
    p.add_argument("--mini-batches", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-5)
    args = p.parse_args()

    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policy_dir, reward_dir = os.path.join(args.assets, "policy"), os.path.join(args.assets, "reward")
    tok = AutoTokenizer.from_pretrained(policy_dir, padding_side="left")
    rows = pq.read_table(os.path.join(args.assets, "train.parquet")).to_pylist()[: args.batch]
    ids = [tok.apply_chat_template([dict(m) for m in r["prompt"]], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for r in rows]
    ids = [x if isinstance(x, list) else list(x["input_ids"]) for x in ids]
    data = Dataset.from_dict({"input_ids": ids})

    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    value = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1, dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(reward_dir, num_labels=1, dtype=torch.float32)
    for m in (value, reward):
        m.config.pad_token_id = tok.pad_token_id

    out = tempfile.mkdtemp(prefix="trl_ppo_")
    cfg = PPOConfig(
        output_dir=out, report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
        num_mini_batches=args.mini_batches, num_ppo_epochs=args.epochs,
        total_episodes=args.batch * args.steps, local_rollout_forward_batch_size=args.batch,
        response_length=args.response_length, stop_token=None, temperature=1.0, learning_rate=args.lr,
        kl_coef=0.05, kl_estimator="k1", cliprange=0.2, cliprange_value=0.2, gamma=1.0, lam=0.95,
        num_sample_generations=0, save_strategy="no", logging_steps=1, seed=1,
        dataloader_num_workers=0, missing_eos_penalty=None,
    )
    marks: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *a: object, **k: object) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, *a: object, **k: object) -> None:
            marks.append(time.perf_counter())

    trainer = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=data, eval_dataset=data, callbacks=[Clock()])
    logged: list[dict[str, float]] = []
    orig_log = trainer.log

    def log(metrics: dict[str, float], *a: object, **k: object) -> None:
        logged.append(dict(metrics))
        orig_log(metrics, *a, **k)

    trainer.log = log  # type: ignore[method-assign]
    trainer.train()
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    print(json.dumps({"step_s": step_s, "response_tokens_per_step": args.batch * args.response_length,
                      "scores": [m.get("objective/scores") for m in logged],
                      "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
