"""What a composed verl config and its data files hold, read in verl's interpreter for ``_compose.py`` (its
neighbour): the data files a config names, the validation files' ``data_source`` values and first row, and the token
counts of the training prompts as verl's ``RLHFDataset`` makes them (:func:`measure_prompts`: the model's own
tokenizer and chat template, from a local directory or the Hugging Face cache, never downloaded; every prompt against
``data.max_prompt_length``, :func:`overlong_prompts`). Also the two helpers every verl-side script shares:
:func:`_get` (a dotted key of a config) and :func:`_one_line` (an error as one line).

Like ``_compose.py`` this imports nothing of the project (``_shrink.py`` imports it as its neighbour too).
"""

from __future__ import annotations

import os
from typing import Any


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("Set the environment variable HYDRA_FULL_ERROR",
                                                                "object_type=", "reference_type="))]
    return " ".join(lines)


def _get(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=None)


# ----------------------------------------------------------------------------- the data files
def _files(value: Any) -> list[str]:
    from omegaconf import OmegaConf

    if value is None:
        return []
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _data_sources(paths: list[str]) -> list[str] | None:
    """The ``data_source`` values of the validation parquet files; None when one is missing or unreadable."""
    sources: set[str] = set()
    for path in paths:
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(os.path.expanduser(path), columns=["data_source"])
        except Exception:  # noqa: BLE001 - not there yet (made by the prepare step) or not a parquet file
            return None
        sources.update(str(s) for s in table.column("data_source").to_pylist())
    return sorted(sources) if paths else None


def _first_val_row(paths: list[str]) -> dict[str, Any] | None:
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(os.path.expanduser(paths[0])).slice(0, 1).to_pylist()
    except Exception:  # noqa: BLE001 - not there yet (made by the prepare step) or not a parquet file
        return None
    return rows[0] if rows else None


# ----------------------------------------------------------------------------- prompt lengths
def _tokenizer_source(path: str) -> str | None:
    """A local directory with the tokenizer of verl model path ``path``: the directory itself, else the newest
    snapshot of the Hugging Face cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub``) holding a tokenizer; None: neither."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return local
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub")
    snapshots = os.path.join(os.path.expanduser(hub), "models--" + path.replace("/", "--"), "snapshots")
    found = sorted((os.path.join(snapshots, d) for d in (os.listdir(snapshots) if os.path.isdir(snapshots) else [])
                    if os.path.isfile(os.path.join(snapshots, d, "tokenizer_config.json"))), key=os.path.getmtime)
    return found[-1] if found else None


def prompt_lengths(tokenizer: Any, paths: list[str], prompt_key: str, rows: int,
                   chat_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Token counts of the first ``rows`` prompts of the parquet files ``paths`` as verl's ``RLHFDataset`` makes them
    (``apply_chat_template(messages, add_generation_prompt=True)``; a plain string prompt is tokenized as it is):
    ``{"mean", "max", "rows", "file"}``; ``{"error": ONE LINE}`` naming the file and row that fails."""
    import pyarrow.parquet as pq

    counts: list[int] = []
    for path in paths:
        table = pq.read_table(os.path.expanduser(path))
        if prompt_key not in table.column_names:
            return {"error": f"{path}: no column {prompt_key!r} (data.prompt_key); its columns: "
                             f"{', '.join(table.column_names)}"}
        for i, prompt in enumerate(table.column(prompt_key).slice(0, rows - len(counts)).to_pylist()):
            try:
                if isinstance(prompt, str):
                    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                else:
                    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                        **(chat_kwargs or {}))
                    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            except Exception as err:  # noqa: BLE001 - a row verl's dataset would fail on too
                return {"error": f"{path} row {i}: {prompt_key!r} cannot be tokenized with the model's chat template "
                                 f"({type(err).__name__}: {_one_line(str(err))[:300]})"}
            counts.append(len(ids))
        if len(counts) >= rows:
            break
    if not counts:
        return {"error": f"{', '.join(paths)}: no rows"}
    return {"mean": sum(counts) / len(counts), "max": max(counts), "rows": len(counts), "file": paths[0]}


def _token_ids(tokenizer: Any, prompt: Any, chat: dict[str, Any]) -> list[int]:
    """``prompt``'s token ids as verl's ``RLHFDataset`` makes them (a chat through the template, a string as it is)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, **chat)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _byte_bound(tokenizer: Any, prompt: Any, chat: dict[str, Any], overheads: dict[Any, int]) -> int:
    """An upper bound of ``prompt``'s token count without tokenizing it: a byte-level or byte-fallback tokenizer
    makes at most one token per UTF-8 byte of text, plus one per message for a word-start marker, plus the chat
    template's own tokens (measured once per sequence of roles, with empty contents)."""
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "replace")) + 1
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        return 1 << 30  # not a chat verl can read: tokenized, and its error named
    roles = tuple(str(m.get("role")) for m in prompt)
    if roles not in overheads:
        try:
            overheads[roles] = len(_token_ids(tokenizer, [{"role": r, "content": ""} for r in roles], chat))
        except Exception:  # noqa: BLE001 - a template that refuses empty turns: tokenize these rows
            overheads[roles] = 1 << 30
    text = sum(len(str(m.get("content") or "").encode("utf-8", "replace")) + 2 for m in prompt)
    return overheads[roles] + text


OVERLONG_TOKENIZED_CAP = 20_000  # rows tokenized at most by the length check (the byte bound clears the rest)


def overlong_prompts(tokenizer: Any, paths: list[str], prompt_key: str, limit: int,
                     chat: dict[str, Any] | None = None, batch_rows: int = 65_536,
                     cap: int = OVERLONG_TOKENIZED_CAP) -> dict[str, Any]:
    """Every prompt of ``paths`` longer than ``limit`` tokens (``data.max_prompt_length``), read one column in
    batches (bounded memory); only rows whose byte bound (:func:`_byte_bound`) exceeds ``limit`` are tokenized, at
    most ``cap`` of them. ``{"rows": N read, "tokenized": K, "count": over, "first": [[file, row, tokens], ...3],
    "longest": [file, row, tokens] or None, "capped": bool}``."""
    import pyarrow.parquet as pq

    chat = chat or {}
    overheads: dict[Any, int] = {}
    out: dict[str, Any] = {"rows": 0, "tokenized": 0, "count": 0, "first": [], "longest": None, "capped": False}
    for path in paths:
        local = os.path.expanduser(path)
        try:
            pf = pq.ParquetFile(local)
            if prompt_key not in pf.schema_arrow.names:
                continue  # the column check names it
            batches = pf.iter_batches(batch_size=batch_rows, columns=[prompt_key])
        except Exception:  # noqa: BLE001 - not parquet: the data check names it
            continue
        row = 0
        for batch in batches:
            for prompt in batch.column(0).to_pylist():
                if _byte_bound(tokenizer, prompt, chat, overheads) > limit:
                    if out["tokenized"] >= cap:
                        out["capped"] = True
                    else:
                        out["tokenized"] += 1
                        try:
                            n = len(_token_ids(tokenizer, prompt, chat))
                        except Exception:  # noqa: BLE001 - the first rows' measurement names such a row
                            n = 0
                        if n > limit:
                            out["count"] += 1
                            if len(out["first"]) < 3:
                                out["first"].append([path, row, n])
                            if out["longest"] is None or n > out["longest"][2]:
                                out["longest"] = [path, row, n]
                row += 1
        out["rows"] += row
    return out


def chat_kwargs(cfg: Any) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` as a plain dict (what verl's dataset passes to ``apply_chat_template``)."""
    from omegaconf import OmegaConf

    kwargs = _get(cfg, "data.apply_chat_template_kwargs")
    return OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else dict(kwargs or {})


def measure_prompts(cfg: Any, rows: int) -> dict[str, Any]:
    """:func:`prompt_lengths` of ``data.train_files`` with the tokenizer of ``actor_rollout_ref.model.path`` (a local
    directory or the Hugging Face cache; nothing is downloaded); ``{"error": ...}`` when either is missing."""
    path = str(_get(cfg, "actor_rollout_ref.model.tokenizer_path") or _get(cfg, "actor_rollout_ref.model.path"))
    source = _tokenizer_source(path)
    if source is None:
        return {"error": f"no tokenizer of {path!r} here (no local directory, not in the Hugging Face cache)"}
    files = [f for f in _files(_get(cfg, "data.train_files")) if os.path.isfile(os.path.expanduser(f))]
    if not files:
        return {"error": "data.train_files: not there yet"}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - a broken tokenizer directory: no measurement
        return {"error": f"tokenizer of {path!r}: {type(err).__name__}: {_one_line(str(err))[:300]}"}
    prompt_key = str(_get(cfg, "data.prompt_key") or "prompt")
    measured = {**prompt_lengths(tokenizer, files, prompt_key, rows, chat_kwargs(cfg)), "tokenizer": source}
    limit = _get(cfg, "data.max_prompt_length")
    if isinstance(limit, int) and limit > 0 and "error" not in measured:
        every = files + [f for f in _files(_get(cfg, "data.val_files")) if os.path.isfile(os.path.expanduser(f))]
        measured["overlong"] = {**overlong_prompts(tokenizer, list(dict.fromkeys(every)), prompt_key, limit,
                                                   chat_kwargs(cfg)),
                                "limit": limit, "truncation": str(_get(cfg, "data.truncation") or "error"),
                                "filter": bool(_get(cfg, "data.filter_overlong_prompts"))}
    return measured
