"""A verl experiment shrunk for a CPU rehearsal, made in verl's interpreter: what ``verl-hpo rehearse``
(:mod:`hpo.backends.verl._rehearse`) runs before it launches verl's ``main_ppo`` on the CPU.

    <verl's python> hpo/backends/verl/_shrink.py < request.json

Request: ``{"config_dir": DIR or null, "config_name": NAME, "overrides": [the default corner's overrides],
"out": DIR, "train_rows": N, "val_rows": M, "tokenizer": DIR or null, "models": {KEY: config.json as a dict},
"set_keys": [override keys as the space writes them], "reward_timeout_s": S}``. With the config composed as
``main_ppo`` would compose it:

1. **Models**: for each model path ``KEY`` (the actor's, a critic's), a model of the same architecture built from
   its ``config.json`` with 2 layers, hidden size 128 and 2 heads of 64 (random weights, float32), saved with the
   model's own tokenizer (``tokenizer`` when given, else the model's local directory or its Hugging Face cache
   snapshot; nothing is downloaded) under ``out/models/<i>``.
2. **Data**: the training rows with the longest prompts (every row read once, a column at a time; the first rows
   when ``data.filter_overlong_prompts`` may drop the longest) and the first validation rows (prompts as they are)
   written to ``out/data/{train,val}.parquet``, after checking the columns verl 0.9.1 reads (``data.prompt_key``,
   ``data_source``, ``reward_model.ground_truth``) and tokenizing every kept prompt with the chat template.
3. **Reward**: the reward function (``reward.custom_reward_function``, loaded with verl's own
   ``get_custom_reward_fn``; else verl's ``default_compute_score``) called on every kept validation row and on the
   training rows with the most unusual ground truths (:func:`scan_rows`) with a few
   responses (empty, the ground truth, GSM8K's and a boxed answer format); each call must return a finite number or
   a dict with a finite ``"score"``, as verl's reward managers use it. The calls together get ``reward_timeout_s``
   (default 120; a SIGALRM stops a function that loops) and what they print is kept up to 64 KiB, the rest counted.
4. **Keys no code reads**: each ``set_keys`` entry that verl's config does not have (added with ``+``), is not under a
   free-form mapping (``override_config``, ``*_kwargs``), and whose name no file of the verl package mentions.

Reply (the one line on stdout): ``{"status": "ok", "models": {KEY: {...}}, "data": {...}, "reward": {...},
"unread": [KEY, ...], "problems": [{"check": ..., "message": ONE LINE}]}``, or ``{"status": "error", "message"}``.
Like ``_compose.py`` this imports nothing of the project but its neighbours ``_compose``, ``_compose_checks`` and
``_compose_data`` (on ``sys.path`` when run as a script).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import os
import re
import sys
from typing import Any

from _compose import serve
from _compose_checks import load_error
from _compose_data import _files, _get, _one_line, _tokenizer_source, chat_kwargs, prompt_lengths

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
    """The first ``rows`` rows of ``paths`` written to ``out``, after the column checks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables: list[Any] = []
    for path in paths:
        local = os.path.expanduser(path)
        if not os.path.isfile(local):
            return {"problem": problem("data", f"data.{split}_files: {path}: no such file")}
        try:
            table = pq.read_table(local)
        except Exception as err:  # noqa: BLE001 - not a parquet file
            return {"problem": problem("data", f"data.{split}_files: {path}: not readable as parquet "
                                               f"({type(err).__name__}: {_one_line(str(err))[:200]})")}
        head = table.slice(0, 1).to_pylist()
        bad = _check_columns(path, table.column_names, prompt_key, head[0] if head else None)
        if bad:
            return {"problem": problem("data", f"data.{split}_files: {bad}")}
        tables.append(table.slice(0, rows - sum(t.num_rows for t in tables)))
        if sum(t.num_rows for t in tables) >= rows:
            break
    if not tables or sum(t.num_rows for t in tables) == 0:
        return {"problem": problem("data", f"data.{split}_files: no rows")}
    table = pa.concat_tables(tables, promote_options="default")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    pq.write_table(table, out)
    return {"file": out, "rows": table.num_rows, "from": paths}


def _prompt_size(prompt: Any) -> int:
    """A prompt's size in UTF-8 bytes of its text (a chat: its messages' contents), to rank rows by length."""
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "replace"))
    if isinstance(prompt, list):
        return sum(len(str(m.get("content") if isinstance(m, dict) else m).encode("utf-8", "replace"))
                   for m in prompt)
    return 0


UNUSUAL_TRUTHS = 8  # training rows whose ground truth is the least like the others, scored by the reward check


def scan_rows(paths: list[str], rows: int, prompt_key: str, batch_rows: int = 65_536) -> dict[str, Any]:
    """One columnar pass over every row of ``paths`` (the prompt and ``reward_model`` columns, ``batch_rows`` at a
    time): the ``rows`` rows with the longest prompts (``longest``: ``[[file index, row], ...]`` in file order) and
    up to :data:`UNUSUAL_TRUTHS` rows with the most unusual ground truths (``unusual``: the first row of each type
    that is not the most common one, then the longest and the shortest), and ``total``: rows read."""
    import heapq
    from collections import Counter

    import pyarrow.parquet as pq

    heap: list[tuple[int, int, int]] = []  # (size, -file, -row): the smallest size leaves first; ties keep the first
    types: Counter[str] = Counter()
    first_of: dict[str, tuple[int, int]] = {}
    long_truth: list[tuple[int, int, int]] = []
    short_truth: list[tuple[int, int, int]] = []
    total = 0
    for f, path in enumerate(paths):
        pf = pq.ParquetFile(os.path.expanduser(path))
        row = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=[prompt_key, "reward_model"]):
            prompts = batch.column(0).to_pylist()
            truths = batch.column(1).to_pylist()
            for prompt, rm in zip(prompts, truths, strict=True):
                item = (_prompt_size(prompt), -f, -row)
                if len(heap) < rows:
                    heapq.heappush(heap, item)
                elif item > heap[0]:
                    heapq.heapreplace(heap, item)
                truth = rm.get("ground_truth") if isinstance(rm, dict) else None
                kind = type(truth).__name__
                types[kind] += 1
                first_of.setdefault(kind, (f, row))
                size = len(str(truth))
                for keep, key in ((long_truth, size), (short_truth, -size)):
                    entry = (key, -f, -row)
                    if len(keep) < 2:
                        heapq.heappush(keep, entry)
                    elif entry > keep[0]:
                        heapq.heapreplace(keep, entry)
                row += 1
        total += row
    common = types.most_common(1)[0][0] if types else None
    unusual = [first_of[k] for k, _ in types.most_common() if k != common]
    unusual += [(-f, -r) for _, f, r in sorted(long_truth, reverse=True)]
    unusual += [(-f, -r) for _, f, r in sorted(short_truth, reverse=True)]
    return {"longest": sorted((-f, -r) for _, f, r in heap), "unusual": list(dict.fromkeys(unusual))[:UNUSUAL_TRUTHS],
            "total": total}


def write_rows(paths: list[str], picks: list[tuple[int, int]], out: str, label: bool = False,
               batch_rows: int = 65_536) -> int:
    """The rows ``picks`` (``(file index, row)``) of ``paths`` written to ``out`` in that order, read a batch at a time;
    ``label``: a column ``__row`` keeps each row's ``"file:row"`` for the lines that name it. The number written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted: dict[int, dict[int, int]] = {}
    for i, (f, r) in enumerate(picks):
        wanted.setdefault(f, {})[r] = i
    found: dict[int, dict[str, Any]] = {}
    for f, rows in wanted.items():
        pf = pq.ParquetFile(os.path.expanduser(paths[f]))
        start = 0
        for batch in pf.iter_batches(batch_size=batch_rows):
            inside = [r for r in rows if start <= r < start + batch.num_rows]
            if inside:
                for r in inside:
                    found[rows[r]] = {**batch.slice(r - start, 1).to_pylist()[0],
                                      **({"__row": f"{os.path.basename(paths[f])}:{r}"} if label else {})}
            start += batch.num_rows
            if start > max(rows):
                break
    table = pa.Table.from_pylist([found[i] for i in sorted(found)])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    pq.write_table(table, out)
    return table.num_rows


# ----------------------------------------------------------------------------- reward
def _responses(truth: Any) -> list[str]:
    text = str(truth)
    return ["", text, f"The answer is {text}.\n#### {text}", f"\\boxed{{{text}}}"]


def _score(result: Any) -> tuple[float | None, str | None]:
    """(the score verl would use, None) or (None, what is wrong with ``result``)."""
    value = result
    if isinstance(result, dict):
        if "score" not in result:
            return None, f"a dict without 'score' (keys {', '.join(map(str, result))[:80]})"
        value = result["score"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"{type(value).__name__} {str(value)[:60]!r}"
    if not math.isfinite(float(value)):
        return None, f"{float(value)}"
    return float(value), None


REWARD_TIMEOUT_S = 120.0  # the whole reward check (``reward_timeout_s`` of the request: rehearse --reward-timeout)
OUTPUT_CAP = 64 * 1024  # bytes of what the user's function prints that are kept (the rest is counted, dropped)


class _RewardTimeout(BaseException):
    """Raised in the reward check by SIGALRM: the user's function did not return in time (a loop?)."""


class _CappedSink:
    """A text stream that keeps the first :data:`OUTPUT_CAP` bytes written to it and counts the rest."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.size = 0
        self.dropped = 0

    def write(self, text: str) -> int:
        n = len(text.encode("utf-8", "replace"))
        if self.size < OUTPUT_CAP:
            self.kept.append(text[:OUTPUT_CAP - self.size])
        else:
            self.dropped += n
        self.size += n
        return len(text)

    def flush(self) -> None:
        pass


def check_reward(cfg: Any, val_file: str, timeout_s: float = REWARD_TIMEOUT_S,
                 train_file: str | None = None) -> dict[str, Any]:
    """Call the reward function on every row of ``val_file`` (see the module docstring), within ``timeout_s`` in all
    (a SIGALRM ends a call that loops) and with what it prints kept up to :data:`OUTPUT_CAP` bytes (the rest counted
    and dropped), so a looping or chatty function costs the rehearsal ``timeout_s`` and 64 KiB at most."""
    import contextlib
    import signal

    sink = _CappedSink()
    try:  # verl's own modules load before the clock starts: only the user's code is timed
        import pyarrow.parquet  # noqa: F401
        import verl.trainer.ppo.reward  # noqa: F401
        import verl.utils.reward_score  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - _check_reward says what does not load
        pass

    def expired(signum: int, frame: Any) -> None:
        raise _RewardTimeout

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            out = _check_reward(cfg, val_file, train_file)
    except _RewardTimeout:
        where = out_where(cfg)
        out = {"where": where, "calls": sink_calls[0], "problem": problem("reward", (
            f"reward function {where} did not return within {timeout_s:g} s (the rehearsal's limit, --reward-timeout) "
            f"on {sink_calls[1]}: does it loop or wait on something?"))}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if sink.size:
        out["printed_bytes"] = sink.size
        out["printed_dropped_bytes"] = sink.dropped
    return out


sink_calls: list[Any] = [0, "its first call"]  # calls made so far, the row being scored (for the timeout's line)


def out_where(cfg: Any) -> str:
    path = _get(cfg, "reward.custom_reward_function.path")
    name = _get(cfg, "reward.custom_reward_function.name")
    return f"{path}:{name}" if path else "verl's default_compute_score"


def _check_reward(cfg: Any, val_file: str, train_file: str | None = None) -> dict[str, Any]:
    import pyarrow.parquet as pq

    path = _get(cfg, "reward.custom_reward_function.path")
    name = _get(cfg, "reward.custom_reward_function.name")
    where = f"{path}:{name}" if path else "verl's default_compute_score"
    try:
        from verl.trainer.ppo.reward import get_custom_reward_fn
        from verl.utils.reward_score import default_compute_score

        fn = get_custom_reward_fn(cfg) or default_compute_score
    except Exception as err:  # noqa: BLE001 - a file that does not load, a missing function
        return {"where": where, "problem": problem("reward", f"reward.custom_reward_function: {where} does not load: "
                                                             f"{load_error(err)}")}
    calls, scores = 0, list[float]()
    rows = [(f"validation row {i}", row) for i, row in enumerate(pq.read_table(val_file).to_pylist())]
    if train_file:  # the training rows with the most unusual ground truths
        rows += [(f"training row {row.pop('__row', '?')}", row) for row in pq.read_table(train_file).to_pylist()]
    for label, row in rows:
        row.pop("__row", None)
        truth = (row.get("reward_model") or {}).get("ground_truth")
        for response in _responses(truth):
            extra = {**(row.get("extra_info") or {}), "num_turns": 2, "rollout_reward_scores": {}}
            shown = f"{label} (data_source={row.get('data_source')!r}, response {response[:40]!r})"
            sink_calls[:] = [calls, shown]
            try:
                result = fn(data_source=row.get("data_source"), solution_str=response, ground_truth=truth,
                            extra_info=extra)
                if inspect.iscoroutine(result):
                    result = asyncio.run(result)
            except Exception as err:  # noqa: BLE001 - the user's function failing is what this looks for
                return {"where": where, "calls": calls, "problem": problem("reward", (
                    f"reward function {where} raised on {shown}: {type(err).__name__}: "
                    f"{_one_line(str(err))[:300]}"))}
            calls += 1
            score, wrong = _score(result)
            if score is None or wrong is not None:
                return {"where": where, "calls": calls, "problem": problem("reward", (
                    f"reward function {where} returned {wrong} on {shown}: verl needs a finite number (or a dict "
                    "with a finite 'score')"))}
            scores.append(score)
    return {"where": where, "calls": calls, "min": min(scores) if scores else None,
            "max": max(scores) if scores else None}


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
    reply["reward"] = check_reward(cfg, data["val"]["file"], float(request.get("reward_timeout_s") or
                                                                   REWARD_TIMEOUT_S), unusual)
    if "problem" in reply["reward"]:
        reply["problems"].append(reply["reward"].pop("problem"))
    return reply


if __name__ == "__main__":
    sys.exit(serve(run))
