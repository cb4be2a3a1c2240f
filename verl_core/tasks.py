"""The built-in synthetic tasks, written as verl-format parquet (``data.train_files: builtin:<name>``).

``arith`` (for the tiny model): two-operand addition as bare ``a+b=`` prompts, operands
0..``MAX_OPERAND`` (29): 900 problems, every ``VAL_EVERY``-th (4th) of a fixed shuffle held out,
so 675 train and 225 validation prompts. 225 prompts decoded greedily (the trainer config's
validation) give a deterministic objective per policy; its resolution is 1/225.

A row is what verl's data preprocessing scripts write::

    {"data_source": "synthetic/arith",
     "prompt": [{"role": "user", "content": "12+7="}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "19"},
     "extra_info": {"split": "train", "index": 3}}

The answer is scored by :func:`verl_core.rewards.arith_score` (exact match of the
response's leading integer). The split is deterministic. The built-in model's warm start
(:mod:`verl_core.tiny_model`) is biased towards ``a+b+1`` on all 900 problems; PPO sees only the
train prompts, so the validation reward measures a correction that generalises.

``addition`` (for a pretrained chat model, ``builtin:smollm2``): the same sums as a chat instruction
that also asks for a format, ``"What is 7 + 5? Reply with only the number."``, operands
0..``ADDITION_MAX_OPERAND``, scored by :func:`verl_core.rewards.addition_score` (1 for the bare number,
0.5 for the right number inside other words). SmolLM2-135M-Instruct answers most of them right when
greedy, but in sentences ("The answer is 12."), and sampled at temperature 1 it rambles: the sampled
reward starts near 0.1, with room to learn both the sum and the format.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_core.config import ConfigError

DATA_SOURCE = "synthetic/arith"
MAX_OPERAND = 29  # operands 0..MAX_OPERAND: 900 problems
VAL_EVERY = 4  # 225 held-out validation problems


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
    return ensure_builtin_data("arith", cache_dir)


# ----------------------------------------------------------------------------- addition (chat, pretrained model)
ADDITION_SOURCE = "synthetic/addition"
ADDITION_MAX_OPERAND = 15  # 256 problems
ADDITION_VAL_EVERY = 4  # 64 held-out validation problems


def addition_prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}? Reply with only the number."


def addition_split() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    probs = [(a, b) for a in range(ADDITION_MAX_OPERAND + 1) for b in range(ADDITION_MAX_OPERAND + 1)]
    random.Random(4321).shuffle(probs)
    val = [p for i, p in enumerate(probs) if i % ADDITION_VAL_EVERY == 0]
    train = [p for i, p in enumerate(probs) if i % ADDITION_VAL_EVERY != 0]
    return train, val


def addition_rows(problems: list[tuple[int, int]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": ADDITION_SOURCE,
            "prompt": [{"role": "user", "content": addition_prompt(a, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, b) in enumerate(problems)
    ]


# ----------------------------------------------------------------------------- registry
Split = Callable[[], tuple[list[tuple[int, int]], list[tuple[int, int]]]]
Rows = Callable[[list[tuple[int, int]], str], list[dict[str, Any]]]
# name -> (cache directory name, problem split, row writer); bump the directory's version when rows change
BUILTIN: dict[str, tuple[str, Split, Rows]] = {
    "arith": ("arith_v2", split_problems, make_rows),
    "addition": ("addition_v1", addition_split, addition_rows),
}


def builtin_val_size(name: str) -> int | None:
    """Validation prompts of ``builtin:<name>`` (None for an unknown name)."""
    return len(BUILTIN[name][1]()[1]) if name in BUILTIN else None


def ensure_builtin_data(name: str, cache_dir: Path, key: str = "data.train_files") -> tuple[Path, Path]:
    """Write (once) and return the train/val parquet paths of ``builtin:<name>``."""
    if name not in BUILTIN:
        known = ", ".join(f"builtin:{n}" for n in BUILTIN)
        raise ConfigError(f"{key}='builtin:{name}': unknown built-in dataset (known: {known})")
    dirname, split, rows = BUILTIN[name]
    out = cache_dir / "data" / dirname
    train_p, val_p = out / "train.parquet", out / "val.parquet"
    if not (train_p.is_file() and val_p.is_file()):
        train, val = split()
        write_parquet(rows(train, "train"), train_p)
        write_parquet(rows(val, "val"), val_p)
    return train_p, val_p
