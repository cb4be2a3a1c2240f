"""What the driver can tell about a model path without loading it (``study.fidelity.proxy``'s checks,
:mod:`hpo.backends._fidelity`): whether it names a model, which tokenizer it has and its hidden size.

A path is *local* when it starts with ``/``, ``./``, ``../`` or ``~``, or names something that exists; anything else
(``Qwen/Qwen2.5-0.5B-Instruct``) is a hub id, which cannot be checked here. A local Hugging Face directory's tokenizer
is the sha256 of what decides its token ids and prompts: ``tokenizer.json``, ``vocab.json``, ``merges.txt``,
``tokenizer.model``, ``vocab.txt``, ``added_tokens.json`` whole, and from ``tokenizer_config.json`` only
:data:`TOKENIZER_CONFIG_KEYS` (the added tokens' ids, the chat template, the special tokens): a size's own
``model_max_length`` or a cosmetic field does not make two tokenizers differ. Two such digests are equal exactly when
token ids mean the same. Every file is read only if it is a regular file of bounded size
(:func:`hpo.analysis.read_bounded`); an unreadable one makes the tokenizer unknown, not different."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo.analysis import FileRefused, read_bounded

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt", "added_tokens.json")
TOKENIZER_CONFIG_KEYS = ("added_tokens_decoder", "chat_template", "bos_token", "eos_token", "pad_token", "unk_token")
MAX_TOKENIZER_BYTES = 256 * 2**20  # a tokenizer.json of a 250k vocabulary is ~20 MB
MAX_CONFIG_BYTES = 16 * 2**20
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")  # config.json's width, by model family


@dataclass(frozen=True)
class ModelFacts:
    """What is known here of a model path: ``missing`` (why it names no model: a local path that is not a
    directory, an unknown built-in), its ``tokenizer`` (kind and identity: ``("sha256", hex)`` of a local directory,
    ``("family", name)`` of a trainer's built-in models; equal identities of one kind mean the same token ids; None:
    unknown here), its ``hidden`` size (None: unknown) and ``note`` (why something is unknown)."""

    missing: str = ""
    tokenizer: tuple[str, str] | None = None
    hidden: int | None = None
    note: str = ""


def is_local(path: str) -> bool:
    text = path.strip()
    return text.startswith(("/", "./", "../", "~")) or os.path.lexists(os.path.expanduser(text))


def local_facts(path: str) -> ModelFacts:
    """A local path's facts (see the module docstring); a hub id's are unknown."""
    if not is_local(path):
        return ModelFacts(note=f"{path!r} is a hub id (not a local directory): not checked here")
    where = Path(os.path.expanduser(path.strip()))
    if not where.is_dir():
        return ModelFacts(missing=f"{path!r} does not exist" if not os.path.lexists(where) else
                          f"{path!r} is not a directory")
    return ModelFacts(tokenizer=tokenizer_digest(where), hidden=hidden_size(where),
                      note="" if (where / "config.json").is_file() else f"{path!r} has no config.json")


def builtin_facts_from(path: str, known: Mapping[str, tuple[str, int | None]]) -> ModelFacts:
    """The facts of a trainer's built-in model ``path`` (``builtin:<name>``) from ``known``: each name's tokenizer
    family (two models of one family share token ids) and hidden size; ``missing`` for a name not in ``known``."""
    name = path.removeprefix("builtin:")
    if name not in known:
        return ModelFacts(missing=f"{path!r} is not a built-in model (known: "
                                  f"{', '.join(f'builtin:{n}' for n in known)})")
    family, hidden = known[name]
    return ModelFacts(tokenizer=("family", family), hidden=hidden)


def tokenizer_digest(where: Path) -> tuple[str, str] | None:
    """``("sha256", hex)`` of the tokenizer in directory ``where``; None when it has none or a file is refused."""
    digest, found = hashlib.sha256(), False
    try:
        for name in TOKENIZER_FILES:
            if os.path.lexists(where / name):
                digest.update(name.encode() + b"\0" + read_bounded(where / name, name, MAX_TOKENIZER_BYTES) + b"\0")
                found = True
        if os.path.lexists(where / "tokenizer_config.json"):
            config = json.loads(read_bounded(where / "tokenizer_config.json", "tokenizer_config.json",
                                             MAX_CONFIG_BYTES))
            if isinstance(config, dict):
                kept = {k: config.get(k) for k in TOKENIZER_CONFIG_KEYS}
                digest.update(json.dumps(kept, sort_keys=True, default=str).encode())
                found = True
    except (OSError, FileRefused, ValueError, RecursionError):
        return None
    return ("sha256", digest.hexdigest()) if found else None


def hidden_size(where: Path) -> int | None:
    """The width ``config.json`` in ``where`` gives (its text config's for a multimodal model); None: unknown."""
    try:
        config: Any = json.loads(read_bounded(where / "config.json", "config.json", MAX_CONFIG_BYTES))
    except (OSError, FileRefused, ValueError, RecursionError):
        return None
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], **{k: v for k, v in config.items() if k in HIDDEN_KEYS}}
    for key in HIDDEN_KEYS:
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
