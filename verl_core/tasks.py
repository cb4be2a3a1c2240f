"""The built-in synthetic tasks, written as verl-format parquet (``data.train_files: builtin:<name>``).

``arith`` (for the tiny model): two-operand addition as bare ``a+b=`` prompts, operands
0..``MAX_OPERAND`` (29): 900 problems in a fixed shuffle, split three ways by position ``i % VAL_EVERY`` (4):
0 is validation (225 problems, the same as before the test split existed), 2 is the held-out **test** split
(225, ``data.test_files: builtin:arith``; a search never sees it, ``verl-hpo confirm`` reports it), the rest
train (450). 225 prompts decoded greedily (the trainer config's validation) give a deterministic objective
per policy; its resolution is 1/225.

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
VAL_EVERY = 4  # 225 held-out validation problems (position 0 of every 4) and 225 test problems (position 2)
TEST_AT = 2  # the test split's position in each group of VAL_EVERY
Problems = list[tuple[int, int]]


def all_problems() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def three_way(probs: Problems, every: int) -> tuple[Problems, Problems, Problems]:
    """(train, val, test) of an already shuffled list: position ``i % every`` 0 is validation, ``TEST_AT`` test."""
    val = [p for i, p in enumerate(probs) if i % every == 0]
    test = [p for i, p in enumerate(probs) if i % every == TEST_AT]
    train = [p for i, p in enumerate(probs) if i % every not in (0, TEST_AT)]
    return train, val, test


def arith_splits() -> tuple[Problems, Problems, Problems]:
    """The arith task's (train, val, test) problems: disjoint, the same on every call."""
    probs = all_problems()
    random.Random(1234).shuffle(probs)
    return three_way(probs, VAL_EVERY)


def split_problems() -> tuple[Problems, Problems]:
    """(train, val) of the arith task (the test split is :func:`arith_splits`' third)."""
    train, val, _ = arith_splits()
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
ADDITION_TEST_MAX_OPERAND = 19  # the test split's sums have an operand in 16..19 (64 of them)


def addition_prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}? Reply with only the number."


def addition_splits() -> tuple[Problems, Problems, Problems]:
    """The addition task's (train 192, val 64, test 64) problems: train and validation as before the test split
    existed (every ``ADDITION_VAL_EVERY``-th of a fixed shuffle held out), and the test split drawn from sums with
    an operand of ``ADDITION_MAX_OPERAND + 1``..``ADDITION_TEST_MAX_OPERAND``, which training never sees. (Carving
    the test split out of the 192 training sums instead left too few for the pretrained model's 4-step GRPO run
    to learn from: 0.06 -> 0.08 instead of 0.06 -> 0.34.)"""
    probs = [(a, b) for a in range(ADDITION_MAX_OPERAND + 1) for b in range(ADDITION_MAX_OPERAND + 1)]
    random.Random(4321).shuffle(probs)
    val = [p for i, p in enumerate(probs) if i % ADDITION_VAL_EVERY == 0]
    train = [p for i, p in enumerate(probs) if i % ADDITION_VAL_EVERY != 0]
    wider = [(a, b) for a in range(ADDITION_TEST_MAX_OPERAND + 1) for b in range(ADDITION_TEST_MAX_OPERAND + 1)
             if max(a, b) > ADDITION_MAX_OPERAND]
    random.Random(8642).shuffle(wider)
    return train, val, wider[:len(val)]


def addition_split() -> tuple[Problems, Problems]:
    """(train, val) of the addition task."""
    train, val, _ = addition_splits()
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
Split = Callable[[], tuple[Problems, Problems, Problems]]
Rows = Callable[[Problems, str], list[dict[str, Any]]]
# name -> (cache directory name, problem split, row writer); bump the directory's version when rows change
# (v3 / v2: the test split was carved out of the training problems)
BUILTIN: dict[str, tuple[str, Split, Rows]] = {
    "arith": ("arith_v3", arith_splits, make_rows),
    "addition": ("addition_v3", addition_splits, addition_rows),
}
SPLITS = ("train", "val", "test")


def builtin_val_size(name: str) -> int | None:
    """Validation prompts of ``builtin:<name>`` (None for an unknown name)."""
    return len(BUILTIN[name][1]()[1]) if name in BUILTIN else None


def builtin_split_path(name: str, cache_dir: Path, split: str, key: str = "data.train_files") -> Path:
    """Write (once) every split of ``builtin:<name>`` and return the parquet path of ``split`` (train, val or
    test)."""
    if name not in BUILTIN:
        known = ", ".join(f"builtin:{n}" for n in BUILTIN)
        raise ConfigError(f"{key}='builtin:{name}': unknown built-in dataset (known: {known})")
    dirname, splits, rows = BUILTIN[name]
    out = cache_dir / "data" / dirname
    paths = {s: out / f"{s}.parquet" for s in SPLITS}
    if not all(p.is_file() for p in paths.values()):
        for s, problems in zip(SPLITS, splits(), strict=True):
            write_parquet(rows(problems, s), paths[s])
    return paths[split]


def ensure_builtin_data(name: str, cache_dir: Path, key: str = "data.train_files") -> tuple[Path, Path]:
    """Write (once) and return the train/val parquet paths of ``builtin:<name>`` (the test split is written
    beside them: :func:`builtin_split_path`)."""
    return builtin_split_path(name, cache_dir, "train", key), builtin_split_path(name, cache_dir, "val", key)
