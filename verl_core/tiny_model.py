"""Build the ``builtin:tiny_arith`` policy family locally: no hub, deterministic, ~1 minute on 2 cores (the default
size; the small one ~40 s, the large one ~5-6 min).

One recipe at three sizes (:data:`FAMILY`), for studies that search on a small model of the target's family
(``study.fidelity.proxy``): ``builtin:tiny_arith_s`` (hidden 64, 2 layers, 0.10M parameters),
``builtin:tiny_arith`` (hidden 128, 2 layers, 0.33M: the default) and ``builtin:tiny_arith_l`` (hidden 256,
4 layers, 2.4M). They share steps 1 and 3 below: the tokenizer files are byte-identical (same token ids, same chat
template) and the warm start is the same SFT (data, steps, batch, learning rate, seeds); only the shape of step 2
differs. Each starts at a comparable point (greedy right on 2-3% of the validation problems, the off-by-one answer
on 94-98%, sampling right ~20%: docs/trainer.md). One layer at hidden 64 was tried and does not fit the
2:7 split in the same SFT (greedy right 22%, off by one 52%), hence 2 layers for the small one.

Recipe (bump ``RECIPE_VERSION`` when it changes; the cache key includes it). Version 2:

1. a byte-level BPE tokenizer trained by ``tokenizers`` on task text (digits split
   individually), with a chat template ``<|user|>...<|assistant|>`` and ``<|eos|>``;
2. a random-weight Qwen2 of the member's shape (the default: hidden 128, 2 layers, 2 heads of dim 64, 1 KV head);
3. a supervised warm start on *biased* answers (:func:`sft_answers`): of the ``SFT_COPIES``
   targets of every problem ``a+b=``, ``SFT_CORRECT`` (2) are the sum, ``SFT_DOMINANT`` (7) are a
   systematic wrong answer, the sum + ``DOMINANT_OFFSET`` (off by one), and the rest a random small
   offset. The model learns the format and that split: greedy decoding (how validation decodes)
   answers the off-by-one sum for almost every problem (greedy accuracy ~0.02), while sampling at
   temperature 1 still finds the right sum ~15-20% of the time. PPO has to move probability from
   the dominant wrong answer to the right one, and greedy accuracy only rises for a problem once the
   right answer overtakes, so the validation reward measures learning, not lower entropy.

Version 1 put 3 of 10 copies on the sum and spread the rest over six offsets: greedy decoding
was already right on 85% of the problems at step 0.

The result is cached under ``$VERL_HPO_CACHE`` (default ``~/.cache/verl_hpo``) and
built under a file lock, so parallel trials wait for one build.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_core import tasks

RECIPE_VERSION = 2
SFT_COPIES = 10  # SFT sequences per problem, split as below
SFT_CORRECT = 2  # copies with the right sum
SFT_DOMINANT = 7  # copies with the systematic wrong answer: sum + DOMINANT_OFFSET
DOMINANT_OFFSET = 1
NOISE_OFFSETS = (-2, -1, 2, 10, -10)  # the remaining copies: sum + one of these, drawn at random
SFT_STEPS = 900  # enough to fit the 2:7 split cleanly (500 left arithmetic slips that greedy gets right by luck)
SFT_BATCH = 128
SFT_LR = 3e-3
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
# The default model's shape (step 2 of the recipe) and the vocabulary the tokenizer training yields.
TINY_SHAPE: dict[str, Any] = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=64, max_position_embeddings=256)
TINY_VOCAB = 304
DEFAULT = "tiny_arith"
# The family: builtin name -> shape. Heads of dim 64 throughout (vLLM's CPU attention supports it), the MLP twice
# the hidden size; the default's cache directory (tiny_arith_v2) and bytes are those of before the family.
# Only the recipe's shape differs, so RECIPE_VERSION (the cache key) is the family's.
FAMILY: dict[str, dict[str, Any]] = {
    "tiny_arith_s": {**TINY_SHAPE, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 1},
    DEFAULT: TINY_SHAPE,
    "tiny_arith_l": {**TINY_SHAPE, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2},
}


def cache_root() -> Path:
    return Path(os.environ.get("VERL_HPO_CACHE", Path.home() / ".cache" / "verl_hpo"))


def _member(name: str) -> str:
    if name not in FAMILY:
        raise ValueError(f"unknown tiny_arith family member {name!r} (known: {', '.join(FAMILY)})")
    return name


def builtin_model_dir(name: str = DEFAULT) -> Path:
    return cache_root() / "models" / f"{_member(name)}_v{RECIPE_VERSION}"


def ensure_tiny_arith(log: bool = True, name: str = DEFAULT) -> Path:
    """Return the cached directory of family member ``name``, building it first if needed (process-safe)."""
    return build_once(builtin_model_dir(name), lambda out: build_tiny_arith(out, name), f"the {name} model", log)


def build_once(target: Path, build: Callable[[Path], None], what: str, log: bool = True) -> Path:
    """``target`` once ``build(tmp_dir)`` has filled it: built under a file lock into a temporary directory that
    is renamed into place with a ``DONE`` marker, so parallel trials wait for one build and an interrupted build
    leaves nothing behind. Returns at once when ``target/DONE`` exists."""
    if (target / "DONE").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "DONE").is_file():
            return target
        tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.time()
        if log:
            print(f"building {what} (once) into {target} ...", flush=True)
        try:
            build(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / "DONE").write_text(f"built in {time.time() - t0:.1f}s\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        if log:
            print(f"built {what} in {time.time() - t0:.1f}s", flush=True)
    return target


def tiny_config(name: str = DEFAULT) -> dict[str, Any]:
    """The ``config.json`` of family member ``name`` as a dict, without building it or importing torch
    (for memory estimates): the cached one when built, else the recipe's (``TINY_VOCAB`` is what the
    deterministic tokenizer training yields; a test checks both agree)."""
    built = builtin_model_dir(name) / "config.json"
    if built.is_file():
        return dict(json.loads(built.read_text()))
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": TINY_VOCAB, **FAMILY[name],
            "tie_word_embeddings": True, "dtype": "float32"}


def train_tokenizer() -> object:
    """Byte-level BPE on the task's text; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [tasks.prompt_text(a, b) + str(a + b) for a, b in tasks.all_problems()]
    corpus += ["The answer is #### 42.", "What is the sum of these numbers?", "hello world, this is a test."] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>", padding_side="left",
        model_max_length=256,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def sft_answers(a: int, b: int, rng: random.Random) -> list[int]:
    """The ``SFT_COPIES`` target answers of ``a+b=``: ``SFT_CORRECT`` right, ``SFT_DOMINANT`` off by
    ``DOMINANT_OFFSET`` (the answer greedy decoding picks), the rest off by a random ``NOISE_OFFSETS`` entry."""
    s = a + b
    answers = [s] * SFT_CORRECT + [s + DOMINANT_OFFSET] * SFT_DOMINANT
    for _ in range(SFT_COPIES - SFT_CORRECT - SFT_DOMINANT):
        wrong = s + rng.choice(NOISE_OFFSETS)
        answers.append(wrong if wrong >= 0 and wrong not in (s, s + DOMINANT_OFFSET) else s + 2)
    return answers


def _sft_examples(tokenizer: object) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per SFT sequence; answers are biased by design (:func:`sft_answers`)."""
    rng = random.Random(0)
    out = []
    for a, b in tasks.all_problems():
        prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": tasks.prompt_text(a, b)}], add_generation_prompt=True, tokenize=False
        )
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        for ans in sft_answers(a, b, rng):
            r_ids = tokenizer(str(ans), add_special_tokens=False)["input_ids"]  # type: ignore[operator]
            out.append((p_ids + r_ids + [tokenizer.eos_token_id], len(p_ids)))  # type: ignore[attr-defined]
    return out


def build_tiny_arith(out_dir: Path, name: str = DEFAULT) -> None:
    """Build family member ``name`` on one torch thread whatever the caller's setting: float reductions split over
    threads round differently, and the cached model must not depend on who built it (a trainer on 1 thread, pytest
    on all)."""
    import torch

    shape = FAMILY[_member(name)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _build_tiny_arith(out_dir, shape)
    finally:
        torch.set_num_threads(threads)


def _build_tiny_arith(out_dir: Path, shape: dict[str, Any]) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tokenizer = train_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), **shape,  # type: ignore[arg-type]
        tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,  # type: ignore
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,  # type: ignore[attr-defined]
    )
    model = Qwen2ForCausalLM(config)
    examples = _sft_examples(tokenizer)
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), tokenizer.pad_token_id, dtype=torch.long)  # type: ignore
    labels = torch.full_like(ids, -100)
    attn = torch.zeros_like(ids)
    for i, (seq, plen) in enumerate(examples):  # right padding for SFT
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, plen : len(seq)] = torch.tensor(seq[plen:])
        attn[i, : len(seq)] = 1
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / SFT_STEPS))
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(SFT_STEPS):
        idx = torch.randint(0, len(examples), (SFT_BATCH,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=attn[idx], labels=labels[idx]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id  # type: ignore[attr-defined]
    model.generation_config.eos_token_id = tokenizer.eos_token_id  # type: ignore[attr-defined]
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)  # type: ignore[attr-defined]
