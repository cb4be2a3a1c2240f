"""The built-in synthetic task: two-operand addition, written as verl-format parquet.

A row is what verl's data preprocessing scripts write::

    {"data_source": "synthetic/arith",
     "prompt": [{"role": "user", "content": "12+7="}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "19"},
     "extra_info": {"split": "train", "index": 3}}

The answer is scored by :func:`verl_core.rewards.arith_score` (exact match of the
response's leading integer). Problems are split deterministically: every
``VAL_EVERY``-th problem is held out for validation.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

DATA_SOURCE = "synthetic/arith"
MAX_OPERAND = 19  # operands 0..MAX_OPERAND: 400 problems
VAL_EVERY = 5  # 80 held-out validation problems


def all_problems() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def split_problems() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    probs = all_problems()
    random.Random(1234).shuffle(probs)
    val = [p for i, p in enumerate(probs) if i % VAL_EVERY == 0]
    train = [p for i, p in enumerate(probs) if i % VAL_EVERY != 0]
    return train, val


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def make_rows(problems: list[tuple[int, int]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(a, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, b) in enumerate(problems)
    ]


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{random.getrandbits(32)}")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)


def ensure_arith_data(cache_dir: Path) -> tuple[Path, Path]:
    """Write (once) and return the train/val parquet paths of the synthetic task."""
    out = cache_dir / "data" / "arith_v1"
    train_p, val_p = out / "train.parquet", out / "val.parquet"
    if not (train_p.is_file() and val_p.is_file()):
        train, val = split_problems()
        write_parquet(make_rows(train, "train"), train_p)
        write_parquet(make_rows(val, "val"), val_p)
    return train_p, val_p
