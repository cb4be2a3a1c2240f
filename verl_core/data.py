"""verl-format parquet datasets: reading, prompt encoding, seeded batching.

Columns used: ``prompt`` (list of chat messages, or a plain string), ``data_source``,
``reward_model.ground_truth`` and ``extra_info``. Prompts go through the tokenizer's
chat template (a ``role: content`` fallback when it has none) and are left-padded,
left-truncated to ``data.max_prompt_length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_core.config import ConfigError


@dataclass
class Example:
    prompt_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    prompt_text: str


@dataclass
class PromptBatch:
    """Left-padded prompts. ``input_ids``/``attention_mask``: (B, P)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    examples: list[Example]
    uids: list[int]  # index of each prompt in its dataset (GRPO groups)


def read_parquet(path: str, key: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{key}={path!r}: no such file")
    try:
        rows = pq.ParquetFile(p).read().to_pylist()  # read_table's dataset API imports pandas (0.7 s)
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise ConfigError(f"{key}={path!r}: not a readable parquet file ({type(err).__name__})") from None
    if not rows:
        raise ConfigError(f"{key}={path!r}: the file has no rows")
    return rows


def render_prompt(tokenizer: Any, prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    messages = [dict(m) for m in prompt]
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def load_examples(path: str, key: str, tokenizer: Any, prompt_key: str, max_prompt_length: int) -> list[Example]:
    rows = read_parquet(path, key)
    missing = [c for c in (prompt_key, "data_source") if c not in rows[0]]
    if missing:
        raise ConfigError(f"{key}={path!r}: missing column(s) {', '.join(missing)}")
    out = []
    for row in rows:
        text = render_prompt(tokenizer, row[prompt_key])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][-max_prompt_length:]
        rm = row.get("reward_model") or {}
        out.append(Example(ids, str(row["data_source"]), rm.get("ground_truth"), row.get("extra_info") or {}, text))
    return out


def collate(examples: list[Example], uids: list[int], pad_id: int) -> PromptBatch:
    width = max(len(e.prompt_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.prompt_ids)
        ids[i, width - n :] = torch.tensor(e.prompt_ids, dtype=torch.long)
        mask[i, width - n :] = 1
    return PromptBatch(ids, mask, examples, uids)


class PromptSampler:
    """Deterministic epoch-wise shuffled batches; the position is checkpointable."""

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool) -> None:
        if batch_size > n:
            raise ConfigError(f"data.train_batch_size={batch_size} is larger than the training set ({n} prompts)")
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.epoch, self.pos = 0, 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next_indices(self) -> list[int]:
        if self.pos + self.batch_size > self.n:  # drop the last partial batch, as verl's dataloader does
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self._order()[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
