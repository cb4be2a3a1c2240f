"""What a composed verl config and its data files hold, read in verl's interpreter for ``_compose.py`` (its
neighbour): the data files a config names, the validation files' ``data_source`` values and first row, and the token
counts of the training prompts as verl's ``RLHFDataset`` makes them (:func:`measure_prompts`: the model's own
tokenizer and chat template, from a local directory or the Hugging Face cache, never downloaded; every prompt against
``data.max_prompt_length``, :func:`overlong_prompts`). Also the two helpers every verl-side script shares:
:func:`_get` (a dotted key of a config) and :func:`_one_line` (an error as one line).

Every data file is read by :func:`iter_batches` as verl 0.9.1's ``RLHFDataset`` takes it: by its name's ending,
``.parquet`` as parquet, ``.json`` and ``.jsonl`` as JSON (one object per line, else one JSON list), in batches of
bounded size, so that a file of millions of rows is never loaded whole.

Like ``_compose.py`` this imports nothing of the project (``_shrink.py`` imports it as its neighbour too; the driver
imports it for :func:`iter_batches`).
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
def data_format(path: str) -> str | None:
    """``"parquet"`` or ``"json"`` as verl 0.9.1's ``RLHFDataset`` decides by the name's ending; None: it raises
    ``Unsupported file format``."""
    if path.endswith(".parquet"):
        return "parquet"
    return "json" if path.endswith((".json", ".jsonl")) else None


JSON_CHUNK_BYTES = 16 << 20  # JSON read this much at a time (cut at a line's end), as the datasets library does
BATCH_BYTES = 32 << 20  # parquet read about this many uncompressed bytes at a time


def _json_tables(path: str) -> Any:
    """The tables of a JSON file as the datasets library reads it for verl: chunks of whole lines, each read by
    pyarrow (its own schema); a file that is one JSON list (not one object per line) is loaded whole."""
    import io
    import json

    import pyarrow as pa
    import pyarrow.json as paj

    with open(path, "rb") as f:
        first = True
        while True:
            chunk = f.read(JSON_CHUNK_BYTES)
            if not chunk:
                return
            chunk += f.readline()  # to the end of the line
            try:
                table = paj.read_json(io.BytesIO(chunk))
            except pa.ArrowInvalid:
                if not first:
                    raise
                f.seek(0)
                rows = json.load(f)
                if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                    raise ValueError(f"{path}: neither JSON lines nor a JSON list of objects") from None
                yield pa.Table.from_pylist(rows)
                return
            first = False
            yield table


def iter_batches(path: str, columns: list[str] | None = None, batch_rows: int = 65_536) -> Any:
    """The rows of the data file ``path`` (``~`` expanded) as pyarrow record batches, in order, at most ``batch_rows``
    rows (and about :data:`BATCH_BYTES`) each; ``columns``: only these, those of them the file has (a JSON file's
    batches can differ: a key only in later lines). ValueError for a name verl does not read, pyarrow's errors for
    a file that is not what its name says."""
    local = os.path.expanduser(path)
    fmt = data_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(local)
        meta = pf.metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if columns is None and meta.num_rows:  # whole rows: as many as fit in BATCH_BYTES
            batch_rows = max(256, min(batch_rows, BATCH_BYTES * meta.num_rows // max(1, size)))
        names = pf.schema_arrow.names
        yield from pf.iter_batches(batch_size=batch_rows, columns=None if columns is None else
                                   [c for c in columns if c in names])
        return
    if fmt is None:
        raise ValueError(f"{path}: verl 0.9.1 reads .parquet, .json and .jsonl files only (RLHFDataset: "
                         "'Unsupported file format')")
    for table in _json_tables(local):
        if columns is not None:
            table = table.select([c for c in columns if c in table.column_names])
        yield from table.to_batches(max_chunksize=batch_rows)


def column_or_nulls(batch: Any, name: str) -> Any:
    """Column ``name`` of a record batch, or nulls when the batch lacks it."""
    import pyarrow as pa

    i = batch.schema.get_field_index(name)
    return batch.column(i) if i >= 0 else pa.nulls(batch.num_rows)


def _files(value: Any) -> list[str]:
    from omegaconf import OmegaConf

    if value is None:
        return []
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _data_sources(paths: list[str]) -> list[str] | None:
    """The ``data_source`` values of every row of the validation files; None when one is missing or unreadable."""
    import pyarrow.compute as pc

    sources: set[str] = set()
    for path in paths:
        try:
            for batch in iter_batches(path, ["data_source"]):
                sources.update(str(s) for s in pc.unique(column_or_nulls(batch, "data_source")).to_pylist())
        except Exception:  # noqa: BLE001 - not there yet (made by the prepare step) or not a data file
            return None
    return sorted(sources) if paths else None


def _first_val_row(paths: list[str]) -> dict[str, Any] | None:
    try:
        for batch in iter_batches(paths[0], batch_rows=1):
            rows = batch.slice(0, 1).to_pylist()
            return rows[0] if rows else None
    except Exception:  # noqa: BLE001 - not there yet (made by the prepare step) or not a data file
        return None
    return None


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
    """Token counts of the first ``rows`` prompts of the data files ``paths`` as verl's ``RLHFDataset`` makes them
    (``apply_chat_template(messages, add_generation_prompt=True)``; a plain string prompt is tokenized as it is):
    ``{"mean", "max", "rows", "file"}``; ``{"error": ONE LINE}`` naming the file and row that fails."""
    counts: list[int] = []
    for path in paths:
        i = -1
        for batch in iter_batches(path, batch_rows=min(rows, 65_536)):
            if prompt_key not in batch.schema.names:
                return {"error": f"{path}: no column {prompt_key!r} (data.prompt_key); its columns: "
                                 f"{', '.join(batch.schema.names)}"}
            error = _count_tokens(tokenizer, batch.column(prompt_key).slice(0, rows - len(counts)).to_pylist(),
                                  chat_kwargs or {}, counts, path, i + 1, prompt_key)
            if error:
                return {"error": error}
            i += batch.num_rows
            if len(counts) >= rows:
                break
        if len(counts) >= rows:
            break
    if not counts:
        return {"error": f"{', '.join(paths)}: no rows"}
    return {"mean": sum(counts) / len(counts), "max": max(counts), "rows": len(counts), "file": paths[0]}


def _count_tokens(tokenizer: Any, prompts: list[Any], chat_kwargs: dict[str, Any], counts: list[int], path: str,
                  first_row: int, prompt_key: str) -> str | None:
    """Append the token count of each prompt to ``counts``; the line naming the row that fails, else None."""
    for i, prompt in enumerate(prompts, first_row):
        try:
            counts.append(len(_token_ids(tokenizer, prompt, chat_kwargs)))
        except Exception as err:  # noqa: BLE001 - a row verl's dataset would fail on too
            return (f"{path} row {i}: {prompt_key!r} cannot be tokenized with the model's chat template "
                    f"({type(err).__name__}: {_one_line(str(err))[:300]})")
    return None


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
        return HUGE  # not a chat verl can read: tokenized, and its error named
    roles = tuple(str(m.get("role")) for m in prompt)
    text = sum(len(str(m.get("content") or "").encode("utf-8", "replace")) + 2 for m in prompt)
    return _overhead(tokenizer, roles, chat, overheads) + text


OVERLONG_TOKENIZED_CAP = 20_000  # rows tokenized at most by the length check (the byte bound clears the rest)
HUGE = 1 << 30  # the byte bound of a prompt that is not a chat verl can read: it is tokenized, and its error named


def chat_rows(column: Any) -> dict[str, Any] | None:
    """A prompt column of chat messages (a list of structs with ``role`` and text ``content``) taken apart, for
    columnar checks of every row: ``offsets`` (numpy, row i's messages are ``offsets[i]:offsets[i+1]`` of the
    flattened ones), ``null_rows`` (numpy bool), ``messages`` (the flattened structs), ``roles`` (strings, a null role
    as ``"None"``), ``content_bytes`` (numpy, UTF-8 bytes of each message's content, 0 when null),
    ``bad_message`` (numpy bool: a null message). None when the column is something else (plain text, multimodal
    content lists): the caller reads it row by row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type):
        return None
    fields = {kind.value_type.field(i).name: kind.value_type.field(i).type
              for i in range(kind.value_type.num_fields)}
    content = fields.get("content")
    if "role" not in fields or content is None or not (pa.types.is_string(content) or
                                                        pa.types.is_large_string(content) or pa.types.is_null(content)):
        return None
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    messages = pc.list_flatten(column)
    text = pc.struct_field(messages, "content")
    size = pc.binary_length(text) if not pa.types.is_null(content) else pa.array([0] * len(messages))
    roles = pc.fill_null(pc.cast(pc.struct_field(messages, "role"), pa.string()), "None")
    return {"offsets": offsets, "null_rows": np.asarray(pc.is_null(column)), "messages": messages, "roles": roles,
            "content_bytes": np.asarray(pc.fill_null(size, 0), dtype=np.int64),
            "bad_message": np.asarray(pc.is_null(messages)) if messages.null_count else np.zeros(len(messages), bool)}


def per_row(values: Any, offsets: Any) -> Any:
    """The sum over each row's messages of a per-message numpy array."""
    import numpy as np

    total = np.concatenate([[0], np.cumsum(values)])
    return total[offsets[1:]] - total[offsets[:-1]]


def row_keys(strings: Any, offsets: Any, sep: str = "\x1f") -> Any:
    """Each row's per-message strings joined by ``sep`` (a row without messages: ``""``), as a pyarrow array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), strings)
    return pc.binary_join(lists, sep)


def byte_bounds(column: Any, tokenizer: Any, chat: dict[str, Any], overheads: dict[Any, int]) -> Any:
    """:func:`_byte_bound` of every row of a prompt column as a numpy array, computed by columns for chats and
    text (a row that is no chat verl can read: :data:`HUGE`); None for another kind of column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return np.where(np.asarray(pc.is_null(column)), HUGE,
                        np.asarray(pc.fill_null(pc.binary_length(column), 0), dtype=np.int64) + 1)
    chats = chat_rows(column)
    if chats is None:
        return None
    offsets = chats["offsets"]
    text = per_row(chats["content_bytes"] + 2, offsets)
    keys = row_keys(chats["roles"], offsets).dictionary_encode()
    over = np.array([_overhead(tokenizer, tuple(k.split("\x1f")) if k else (), chat, overheads)
                     for k in keys.dictionary.to_pylist()] or [0], dtype=np.int64)
    bounds = over[np.asarray(keys.indices, dtype=np.int64)] + text
    broken = chats["null_rows"] | (per_row(chats["bad_message"].astype(np.int64), offsets) > 0)
    return np.where(broken, HUGE, bounds)


def _overhead(tokenizer: Any, roles: tuple[str, ...], chat: dict[str, Any], overheads: dict[Any, int]) -> int:
    """The chat template's own tokens for a sequence of roles (measured once, with empty contents)."""
    if roles not in overheads:
        try:
            overheads[roles] = len(_token_ids(tokenizer, [{"role": r, "content": ""} for r in roles], chat))
        except Exception:  # noqa: BLE001 - a template that refuses empty turns: tokenize these rows
            overheads[roles] = HUGE
    return overheads[roles]


def overlong_prompts(tokenizer: Any, paths: list[str], prompt_key: str, limit: int,
                     chat: dict[str, Any] | None = None, batch_rows: int = 65_536,
                     cap: int = OVERLONG_TOKENIZED_CAP) -> dict[str, Any]:
    """Every prompt of ``paths`` longer than ``limit`` tokens (``data.max_prompt_length``), read one column in
    batches (bounded memory); only rows whose byte bound (:func:`byte_bounds`, by columns; :func:`_byte_bound` row
    by row for other columns) exceeds ``limit`` are tokenized, at most ``cap`` of them. ``{"rows": N read,
    "tokenized": K, "count": over, "first": [[file, row, tokens], ...3], "longest": [file, row, tokens] or None,
    "capped": bool}``."""
    import numpy as np

    chat = chat or {}
    overheads: dict[Any, int] = {}
    out: dict[str, Any] = {"rows": 0, "tokenized": 0, "count": 0, "first": [], "longest": None, "capped": False}
    for path in paths:
        row = 0
        try:
            for batch in iter_batches(path, [prompt_key], batch_rows):
                if prompt_key not in batch.schema.names:
                    row += batch.num_rows
                    continue  # the column check names it
                column = batch.column(0)
                bounds = byte_bounds(column, tokenizer, chat, overheads)
                if bounds is None:
                    bounds = np.array([_byte_bound(tokenizer, p, chat, overheads) for p in column.to_pylist()])
                for i in np.flatnonzero(bounds > limit).tolist():
                    _tokenize_long(tokenizer, column[i].as_py(), chat, limit, cap, out, path, row + i)
                row += batch.num_rows
        except Exception:  # noqa: BLE001 - not a data file verl reads: the data check names it
            pass
        out["rows"] += row
    return out


def _tokenize_long(tokenizer: Any, prompt: Any, chat: dict[str, Any], limit: int, cap: int, out: dict[str, Any],
                   path: str, row: int) -> None:
    if out["tokenized"] >= cap:
        out["capped"] = True
        return
    out["tokenized"] += 1
    try:
        n = len(_token_ids(tokenizer, prompt, chat))
    except Exception:  # noqa: BLE001 - verl's own data path names such a row
        n = 0
    if n > limit:
        out["count"] += 1
        if len(out["first"]) < 3:
            out["first"].append([path, row, n])
        if out["longest"] is None or n > out["longest"][2]:
            out["longest"] = [path, row, n]


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
