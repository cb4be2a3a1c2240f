"""Build the benchmark's model, reward model and data once, locally: ``python -m benchmarks._assets OUT_DIR``.

Both sides (ours and TRL) load exactly these files; nothing is downloaded.

* ``OUT/policy``: a random-init Qwen2 (hidden 128, 2 layers, 2 heads, 1 KV head) + the tiny_arith
  byte-level BPE tokenizer. The tokenizer's EOS ``<|end|>`` is one id past the model's vocabulary,
  so the policy can never emit it: every response is exactly ``max_new_tokens`` long on both sides
  (same work per step, same token count), without touching either trainer's generation code.
* ``OUT/reward``: a random-init ``Qwen2ForSequenceClassification`` (1 label) of the same shape.
* ``OUT/train.parquet``: ``N`` arithmetic prompts in verl format (``prompt`` chat messages,
  ``data_source`` ``synthetic/arith``, ``reward_model.ground_truth``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EOS = "<|end|>"
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 128, 2, 2, 1, 64, 256


def build(out: Path, n_prompts: int = 64) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    from verl_core import tasks
    from verl_core.tiny_model import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab = len(tok)  # type: ignore[arg-type]
    tok.add_special_tokens({"eos_token": EOS})  # type: ignore[attr-defined]
    tok.padding_side = "left"  # type: ignore[attr-defined]
    assert tok.eos_token_id == vocab, (tok.eos_token_id, vocab)  # type: ignore[attr-defined]
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=None,  # type: ignore[attr-defined]
        eos_token_id=None, rope_theta=10000.0,  # type: ignore[attr-defined]
    )
    paths = {"policy": str(out / "policy"), "reward": str(out / "reward"), "data": str(out / "train.parquet")}
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(cfg).eval()
    policy.generation_config.pad_token_id = tok.pad_token_id  # type: ignore[attr-defined]
    policy.generation_config.eos_token_id = tok.eos_token_id  # type: ignore[attr-defined]
    policy.generation_config.bos_token_id = None
    policy.save_pretrained(paths["policy"])
    tok.save_pretrained(paths["policy"])  # type: ignore[attr-defined]
    torch.manual_seed(1)
    reward_cfg = Qwen2Config(**{k: v for k, v in cfg.to_dict().items() if k not in ("id2label", "label2id")},
                             num_labels=1)
    reward = Qwen2ForSequenceClassification(reward_cfg).eval()
    reward.save_pretrained(paths["reward"])
    tok.save_pretrained(paths["reward"])  # type: ignore[attr-defined]
    problems = tasks.all_problems()[:n_prompts]
    rows = [{"data_source": "synthetic/arith",
             "prompt": [{"role": "user", "content": tasks.prompt_text(a, b)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"index": i}} for i, (a, b) in enumerate(problems)]
    pq.write_table(pa.Table.from_pylist(rows), paths["data"])
    (out / "assets.json").write_text(json.dumps(paths, indent=2))
    return paths


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    print(json.dumps(build(Path(sys.argv[1]), n)))
