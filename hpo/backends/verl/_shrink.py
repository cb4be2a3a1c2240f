"""A verl experiment shrunk for a CPU rehearsal, made in verl's interpreter: what ``verl-hpo rehearse``
(:mod:`hpo.backends.verl._rehearse`) runs before it launches verl's ``main_ppo`` on the CPU.

    <verl's python> hpo/backends/verl/_shrink.py < request.json

Request: ``{"config_dir": DIR or null, "config_name": NAME, "overrides": [the default corner's overrides],
"out": DIR, "train_rows": N, "val_rows": M, "tokenizer": DIR or null, "models": {KEY: config.json as a dict},
"set_keys": [override keys as the space writes them], "reward_timeout_s": S, "call_reward": bool}``. With the config
composed as
``main_ppo`` would compose it:

1. **Models**: for each model path ``KEY`` (the actor's, a critic's), a model of the same architecture built from
   its ``config.json`` with 2 layers, hidden size 128 and 2 heads of 64 (random weights, float32), saved with the
   model's own tokenizer (``tokenizer`` when given, else the model's local directory or its Hugging Face cache
   snapshot; nothing is downloaded) under ``out/models/<i>``.
2. **Data**: the training rows with the longest prompts (every row read once, a column at a time; the first rows
   when ``data.filter_overlong_prompts`` may drop the longest) and the first validation rows (prompts as they are)
   with a row of each ``data_source`` they lack (so verl logs the metric of every source the objective may name),
   read as verl reads parquet, json and jsonl, written to ``out/data/{train,val}.parquet``, after checking the
   columns verl 0.9.1 reads (``data.prompt_key``, ``data_source``, ``reward_model.ground_truth``) and tokenizing every
   kept prompt with the chat template.
3. **Reward** (unless ``call_reward`` is false: the rehearsal's first step scored every distinct ground truth of the
   user's files already): ``_compose_reward.call_reward`` on every kept validation row and on the training rows with
   the most unusual ground truths (:func:`scan_rows`): each call within ``_compose_reward.CALL_S`` (at most
   ``reward_timeout_s``; over it the function is named as hung), all of them within ``reward_timeout_s`` (default
   120; when spent, the rest are not called: a note), what they print kept up to 64 KiB, the rest counted.
4. **Keys no code reads**: each ``set_keys`` entry that verl's config does not have (added with ``+``), is not under a
   free-form mapping (``override_config``, ``*_kwargs``), and whose name no file of the verl package mentions.

Reply (the one line on stdout): ``{"status": "ok", "models": {KEY: {...}}, "data": {...}, "reward": {...},
"unread": [KEY, ...], "problems": [{"check": ..., "message": ONE LINE}]}``, or ``{"status": "error", "message"}``.
Like ``_compose.py`` this imports nothing of the project but its neighbours ``_compose``, ``_compose_data``,
``_compose_reward`` and ``_shrink_scan`` (the one pass over every training row: :func:`scan_rows`,
:func:`write_rows`), on ``sys.path`` when run as a script.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from _compose import serve
from _compose_data import (
    _files,
    _get,
    _one_line,
    _tokenizer_source,
    chat_kwargs,
    column_or_nulls,
    iter_batches,
    prompt_lengths,
)
from _compose_reward import CALL_S, call_reward
from _shrink_scan import scan_rows, write_rows

LAYERS = 2
HIDDEN = 128
HEADS = 2  # head_dim 64: vLLM's CPU attention takes 32, 64, 80, ... (16 is "Unsupported CPU attention configuration")
INTERMEDIATE = 256
EXPERTS = 4
REQUIRED_COLUMNS = ("data_source", "reward_model")  # experimental/reward_loop/reward_manager/naive.py
FREE_FORM = re.compile(r"(^|\.)(override_config|[a-z_]*kwargs|extra|custom_[a-z_]+)(\.|$)")


def problem(check: str, message: str) -> dict[str, str]:
    return {"check": check, "message": message}


# ----------------------------------------------------------------------------- models
def tiny_config(config: dict[str, Any], vocab: int) -> dict[str, Any]:
    """``config.json`` of the same architecture with :data:`LAYERS` layers and widths of :data:`HIDDEN`: attention
    heads keep their kind (multi-head or grouped), MoE keeps experts (at most :data:`EXPERTS`), per-layer lists are
    cut to the layers kept; quantization and remote code go."""
    c = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map", "_name_or_path",
                                                        "torch_dtype", "dtype", "transformers_version")}
    heads, kv = int(c.get("num_attention_heads") or HEADS), int(c.get("num_key_value_heads") or 0)
    c.update(num_hidden_layers=LAYERS, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_attention_heads=HEADS,
             vocab_size=max(int(c.get("vocab_size") or 0), vocab), dtype="float32")
    if kv:
        c["num_key_value_heads"] = HEADS if kv >= heads else 1
    if "head_dim" in c:
        c["head_dim"] = HIDDEN // HEADS
    for key in ("layer_types", "mlp_only_layers"):
        if isinstance(c.get(key), list):
            c[key] = c[key][:LAYERS]
    for key in ("max_window_layers", "first_k_dense_replace"):
        if isinstance(c.get(key), int):
            c[key] = min(c[key], 1)
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(c.get(key), int):
            c[key] = min(c[key], EXPERTS)
    if isinstance(c.get("num_experts_per_tok"), int):
        c["num_experts_per_tok"] = min(c["num_experts_per_tok"], 2)
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if isinstance(c.get(key), int):
            c[key] = INTERMEDIATE // 2
    return c


def _shape(c: dict[str, Any]) -> str:
    kv = c.get("num_key_value_heads")
    return (f"{c.get('num_hidden_layers')} layers, hidden {c.get('hidden_size')}, {c.get('num_attention_heads')} "
            f"heads{f' ({kv} kv)' if kv else ''}, vocab {c.get('vocab_size')}")


def build_model(key: str, path: str, config: dict[str, Any], tokenizer_dir: str | None, out: str) -> dict[str, Any]:
    """The tiny model of ``path`` in ``out`` (see the module docstring); ``{"problem": ...}`` when it cannot be."""
    source = tokenizer_dir or _tokenizer_source(path)
    if source is None:
        return {"problem": problem("tokenizer", (
            f"{key}={path}: no tokenizer here (no local directory, not in the Hugging Face cache): fetch its "
            f"tokenizer.json and tokenizer_config.json (https://huggingface.co/{path}) into a directory and pass "
            "--tokenizer DIR"))}
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, set_seed

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - a directory without a usable tokenizer
        return {"problem": problem("tokenizer", f"{key}={path}: the tokenizer in {source} does not load "
                                                f"({type(err).__name__}: {_one_line(str(err))[:300]})")}
    tiny = tiny_config(config, len(tokenizer))
    model_type = tiny.pop("model_type", None)
    try:
        conf = AutoConfig.for_model(model_type, **tiny)
        set_seed(0)
        model = AutoModelForCausalLM.from_config(conf)  # float32: torch's default dtype (the config says float32)
    except Exception as err:  # noqa: BLE001 - an architecture this transformers cannot build without remote code
        return {"problem": problem("model", f"{key}={path}: cannot build a small {model_type} here "
                                            f"({type(err).__name__}: {_one_line(str(err))[:300]})")}
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"dir": out, "tokenizer": source, "architecture": type(model).__name__,
            "from": _shape(config), "to": _shape({**tiny, "vocab_size": conf.vocab_size}),
            "parameters": sum(p.numel() for p in model.parameters())}


# ----------------------------------------------------------------------------- data
def _check_columns(path: str, names: list[str], prompt_key: str, first: dict[str, Any] | None) -> str | None:
    for column, why in ((prompt_key, "data.prompt_key"), *((c, "verl's reward manager") for c in REQUIRED_COLUMNS)):
        if column not in names:
            return f"{path}: no column {column!r} ({why} reads it); its columns: {', '.join(names)}"
    truth = (first or {}).get("reward_model")
    if first is not None and not (isinstance(truth, dict) and "ground_truth" in truth):
        return (f"{path} row 0: reward_model is {type(truth).__name__} {str(truth)[:80]!r}; verl's reward manager "
                "reads reward_model['ground_truth']")
    return None


def take_rows(split: str, paths: list[str], rows: int, prompt_key: str, out: str) -> dict[str, Any]:
    """The first ``rows`` rows of ``paths`` written to ``out``, after the column checks; for the validation split also
    the first row of each ``data_source`` the first rows lack (at most :data:`MORE_SOURCES`), so that verl logs the
    metric of every source the objective may name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kept: list[dict[str, Any]] = []
    sources: set[Any] = set()
    for path in paths:
        local = os.path.expanduser(path)
        if not os.path.isfile(local):
            return {"problem": problem("data", f"data.{split}_files: {path}: no such file")}
        try:
            for batch in iter_batches(path, batch_rows=4096):
                if not kept and batch.num_rows:
                    bad = _check_columns(path, batch.schema.names, prompt_key, batch.slice(0, 1).to_pylist()[0])
                    if bad:
                        return {"problem": problem("data", f"data.{split}_files: {bad}")}
                if len(kept) >= rows:  # past the first rows: only a data_source not seen yet is kept
                    if split != "val" or len(kept) >= rows + MORE_SOURCES:
                        break
                    new = set(column_or_nulls(batch, "data_source").unique().to_pylist()) - sources
                    if not new:
                        continue
                    batch = batch.filter(column_or_nulls(batch, "data_source").is_in(pa.array(list(new))))
                for row in batch.to_pylist():
                    first_of_source = split == "val" and row.get("data_source") not in sources
                    if len(kept) < rows or (first_of_source and len(kept) < rows + MORE_SOURCES):
                        kept.append(row)
                    sources.add(row.get("data_source"))
        except Exception as err:  # noqa: BLE001 - not what its name says
            return {"problem": problem("data", f"data.{split}_files: {path}: not readable as verl reads it "
                                               f"({type(err).__name__}: {_one_line(str(err))[:200]})")}
        if len(kept) >= (rows if split != "val" else rows + MORE_SOURCES):
            break
    if not kept:
        return {"problem": problem("data", f"data.{split}_files: no rows")}
    table = pa.Table.from_pylist(kept)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    pq.write_table(table, out)
    return {"file": out, "rows": table.num_rows, "from": paths}


MORE_SOURCES = 16  # validation rows kept beyond the first ones: one of each data_source they lack


# ----------------------------------------------------------------------------- reward
REWARD_TIMEOUT_S = 120.0  # the whole reward check (``reward_timeout_s`` of the request: rehearse --reward-timeout)


def check_reward(cfg: Any, val_file: str, timeout_s: float = REWARD_TIMEOUT_S,
                 train_file: str | None = None) -> dict[str, Any]:
    """Call the reward function on every row of ``val_file`` and of ``train_file`` (the training rows with the most
    unusual ground truths, each labelled by its ``__row``) with ``_compose_reward.call_reward``: each call within
    ``_compose_reward.CALL_S`` (at most ``timeout_s``; over it the function is named as hung, a problem), all of them
    within ``timeout_s`` (when spent the rest are not called: a note, never a problem), what it prints kept up to
    64 KiB. The reply's ``problem`` is a ``{"check": "reward", "message"}``."""
    import pyarrow.parquet as pq

    targets = []
    for label, path in (("validation", val_file), ("training", train_file)):
        for i, row in enumerate(pq.read_table(path).to_pylist() if path else []):
            where = row.pop("__row", None)
            truth = (row.get("reward_model") or {}).get("ground_truth") \
                if isinstance(row.get("reward_model"), dict) else None
            targets.append({"label": f"{label} row {where if where is not None else i}", "truth": truth,
                            "data_source": row.get("data_source"), "extra_info": row.get("extra_info")})
    out = call_reward(cfg, targets, min(CALL_S, timeout_s), timeout_s)
    if "problem" in out:
        out["problem"] = problem("reward", out["problem"])
    return out


# ----------------------------------------------------------------------------- keys nothing reads
def _verl_source_words() -> set[str]:
    """Every identifier-like word in the verl package's Python files and configs."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    words: set[str] = set()
    for root in spec.submodule_search_locations or [] if spec else []:
        for folder, _, files in os.walk(root):
            for f in files:
                if f.endswith((".py", ".yaml")):
                    with open(os.path.join(folder, f), errors="replace") as fh:
                        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read()))
    return words


def unread_keys(base: Any, set_keys: list[str]) -> list[str]:
    """The keys of ``set_keys`` that verl's config (``base``, composed without them) lacks, that are not under a
    free-form mapping, and whose last name appears in no verl file: nothing in verl can read them."""
    from omegaconf import OmegaConf

    words: set[str] | None = None
    out = []
    for raw in set_keys:
        key = raw.lstrip("+~")
        if OmegaConf.select(base, key, default="<absent>") != "<absent>" or FREE_FORM.search(key):
            continue
        parent = key.rpartition(".")[0]
        node = OmegaConf.select(base, parent, default=None) if parent else base
        if OmegaConf.is_dict(node) and len(node) == 0:
            continue  # an empty mapping in verl's config is one that takes any key
        words = _verl_source_words() if words is None else words
        if key.rpartition(".")[2] not in words:
            out.append(raw)
    return out


# ----------------------------------------------------------------------------- main
def run(request: dict[str, Any]) -> dict[str, Any]:
    import importlib.util

    from hydra import compose, initialize_config_dir

    spec = importlib.util.find_spec("verl")
    assert spec is not None, "verl is not importable in this interpreter"
    config_dir = request.get("config_dir") or os.path.join(list(spec.submodule_search_locations or [])[0],
                                                           "trainer", "config")
    out = request["out"]
    plus = [o for o in request["overrides"] if o.startswith("+")]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name=request["config_name"], overrides=request["overrides"])
        base = compose(config_name=request["config_name"],
                       overrides=[o for o in request["overrides"] if o not in plus])
    reply: dict[str, Any] = {"status": "ok", "models": {}, "problems": [],
                             "unread": unread_keys(base, request.get("set_keys") or [])}
    for i, (key, config) in enumerate(request["models"].items()):
        built = build_model(key, str(_get(cfg, key)), config, request.get("tokenizer"),
                            os.path.join(out, "models", str(i)))
        if "problem" in built:
            reply["problems"].append(built["problem"])
            return reply
        reply["models"][key] = built
    prompt_key = str(_get(cfg, "data.prompt_key") or "prompt")
    data: dict[str, Any] = {}
    for split, rows in (("train", request["train_rows"]), ("val", request["val_rows"])):
        taken = take_rows(split, _files(_get(cfg, f"data.{split}_files")), int(rows), prompt_key,
                          os.path.join(out, "data", f"{split}.parquet"))
        if "problem" in taken:
            reply["problems"].append(taken["problem"])
            return reply
        data[split] = taken
    # every training row read once: the longest prompts replace the first rows (so the real data.max_prompt_length
    # is exercised), and the rows with the most unusual ground truths are scored by the reward check
    train_paths = _files(_get(cfg, "data.train_files"))
    try:
        scan = scan_rows(train_paths, int(request["train_rows"]), prompt_key)
        if not _get(cfg, "data.filter_overlong_prompts"):  # else the longest might all be dropped at load
            data["train"]["rows"] = write_rows(train_paths, scan["longest"], data["train"]["file"])
            data["train"]["picked"] = "longest"
        data["train"]["total"] = scan["total"]
        unusual = os.path.join(out, "data", "reward_train.parquet")
        data["train"]["unusual"] = write_rows(train_paths, scan["unusual"], unusual, label=True)
    except Exception as err:  # noqa: BLE001 - a column of another type than the first row's: named, not a traceback
        reply["problems"].append(problem("data", f"data.train_files: reading every row: {type(err).__name__}: "
                                                 f"{_one_line(str(err))[:300]}"))
        return reply
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(next(iter(reply["models"].values()))["dir"], local_files_only=True)
    for split in ("train", "val"):
        lengths = prompt_lengths(tokenizer, [data[split]["file"]], prompt_key, 10**9, chat_kwargs(cfg))
        if "error" in lengths:
            reply["problems"].append(problem("data", f"data.{split}_files: {lengths['error']}"))
            return reply
        data[split]["prompt_tokens"] = {"mean": lengths["mean"], "max": lengths["max"]}
    reply["data"] = data
    if request.get("call_reward", True):  # else the rehearsal's first step scored every distinct ground truth
        reply["reward"] = check_reward(cfg, data["val"]["file"], float(request.get("reward_timeout_s") or
                                                                       REWARD_TIMEOUT_S), unusual)
        if "problem" in reply["reward"]:
            reply["problems"].append(reply["reward"].pop("problem"))
    return reply


if __name__ == "__main__":
    sys.exit(serve(run))
