"""A small local GSM8K-format dataset for verl runs, so that a verl study needs no download.

    python -m hpo.backends.verl._data [--config NAME] [key=value ...]     # the prepare step of a verl space

Writes the shipped set (:data:`DEFAULT_DIR`: ``train.parquet``, ``test.parquet``) when ``data.train_files`` /
``data.val_files`` name it and it is missing; any other missing file (a list names several) is an error, exit 2:
a mistyped path to your own data must not be silently replaced by synthetic problems. The shipped set has verl's
row format, as ``examples/data_preprocess/gsm8k.py`` writes them: ``data_source`` ``openai/gsm8k`` (so verl scores
them with its GSM8K rule reward, ``verl/utils/reward_score/gsm8k.py``), ``prompt`` (one user message: the
question and verl's instruction to answer after ``####``), ``ability`` ``math``, ``reward_model``
``{style: rule, ground_truth}`` and ``extra_info`` ``{split, index, answer, question}``. The problems are
two-step grade-school word problems from templates with seeded numbers (no validation question is in the
training set); their worked answers end in ``#### <number>`` as GSM8K's do. Paths may use ``~`` and
``${oc.env:VAR}`` as the verl config does. Imports only pyarrow (no torch).
"""

from __future__ import annotations

import os
import random
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k.py
SIZES = {"train": 512, "test": 128}
VAL_RESERVED = 256  # the first problems of the stream, kept for validation
_NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Mark")


def _apples(r: random.Random) -> tuple[str, str]:
    name, a, b = r.choice(_NAMES), r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b - 1)
    total = a + b
    return (f"{name} has {a} apples. {name} buys {b} more and then gives {c} to a friend. "
            f"How many apples does {name} have now?",
            f"After buying, {name} has {a}+{b}=<<{a}+{b}={total}>>{total} apples.\n"
            f"After giving some away, {name} has {total}-{c}=<<{total}-{c}={total - c}>>{total - c} apples.\n"
            f"#### {total - c}")


def _boxes(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(3, 24), r.randint(2, 12), r.randint(1, 20)
    total = a * b
    return (f"A box holds {a} pencils. A teacher buys {b} boxes and finds {c} more pencils in a drawer. "
            "How many pencils does the teacher have?",
            f"The boxes hold {a}*{b}=<<{a}*{b}={total}>>{total} pencils.\n"
            f"With the drawer, that is {total}+{c}=<<{total}+{c}={total + c}>>{total + c} pencils.\n"
            f"#### {total + c}")


def _pages(r: random.Random) -> tuple[str, str]:
    name, a, b, c = r.choice(_NAMES), r.randint(5, 40), r.randint(2, 14), r.randint(3, 50)
    total = a * b
    return (f"{name} reads {a} pages every day for {b} days and then {c} pages on the last evening. "
            f"How many pages did {name} read in total?",
            f"Over {b} days {name} reads {a}*{b}=<<{a}*{b}={total}>>{total} pages.\n"
            f"In total {total}+{c}=<<{total}+{c}={total + c}>>{total + c} pages.\n"
            f"#### {total + c}")


def _cookies(r: random.Random) -> tuple[str, str]:
    b, k, extra = r.randint(2, 12), r.randint(2, 15), r.randint(1, 10)
    a = b * k
    return (f"A baker makes {a} cookies and shares them equally among {b} children. Each child then buys {extra} "
            "more cookies. How many cookies does each child have now?",
            f"Each child gets {a}/{b}=<<{a}/{b}={k}>>{k} cookies.\n"
            f"After buying more, each child has {k}+{extra}=<<{k}+{extra}={k + extra}>>{k + extra} cookies.\n"
            f"#### {k + extra}")


def _prices(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(5, 45), r.randint(10, 80), r.randint(2, 6)
    shirts = a * c
    return (f"A shirt costs ${a} and a pair of pants costs ${b}. How much do {c} shirts and one pair of pants "
            "cost together?",
            f"The shirts cost {c}*{a}=$<<{c}*{a}={shirts}>>{shirts}.\n"
            f"Together with the pants that is {shirts}+{b}=$<<{shirts}+{b}={shirts + b}>>{shirts + b}.\n"
            f"#### {shirts + b}")


TEMPLATES: tuple[Callable[[random.Random], tuple[str, str]], ...] = (_apples, _boxes, _pages, _cookies, _prices)


def problems(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` distinct (question, worked answer) pairs, the templates in turn."""
    r = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    while len(out) < count:
        question, answer = TEMPLATES[len(out) % len(TEMPLATES)](r)
        if question not in seen:
            seen.add(question)
            out.append((question, answer))
    return out


def rows(split: str, n: int) -> list[dict[str, Any]]:
    """``n`` rows of verl's GSM8K format. One seeded stream of distinct problems: the ``test`` split takes its
    first ``n`` (at most :data:`VAL_RESERVED`), ``train`` those after them, so no validation question is trained on."""
    if split == "test" and n > VAL_RESERVED:
        raise ValueError(f"at most {VAL_RESERVED} validation rows, got n={n}")
    start = 0 if split == "test" else VAL_RESERVED
    out = []
    for i, (question, answer) in enumerate(problems(start + n)[start:]):
        solution = answer.rsplit("#### ", 1)[1]
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": solution},
            "extra_info": {"split": split, "index": i, "answer": answer, "question": question},
        })
    return out


def write_parquet(path: Path, split: str, n: int | None = None) -> Path:
    """Write one split (``train`` or ``test``) to ``path``, atomically (a partial file is never seen)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = SIZES.get(split, 128) if n is None else n
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows(split, n)), tmp)
    os.replace(tmp, path)
    return path


# Where the shipped space (search_spaces/verl_grpo_gsm8k.yaml) keeps the set; the only files written here.
DEFAULT_DIR = "~/.cache/verl_hpo/gsm8k_small"


def default_dir() -> Path:
    return Path(os.path.expanduser(DEFAULT_DIR))
DEFAULT_FILES = {"train.parquet": "train", "test.parquet": "test"}
ARITH_DIR = "~/.cache/verl_hpo/verl_arith"  # the arith task for verl on the CPU (hpo.backends.verl._arith)
ARITH_FILES = ("train.parquet", "val.parquet", "test.parquet")
_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


def resolve_path(text: str) -> Path:
    """``~`` and ``${oc.env:VAR[,default]}`` as OmegaConf resolves them in verl's config."""
    def env(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1), m.group(2))
        if value is None:
            raise ValueError(f"{text!r}: environment variable {m.group(1)} is not set")
        return value.strip().strip("'\"")

    return Path(os.path.expanduser(_ENV.sub(env, text.strip().strip("'\""))))


def split_list(value: str | Sequence[Any] | None) -> list[str]:
    """The paths of a ``data.*_files`` value: one path, a hydra/YAML list string ``[a, 'b']``, or a list (a YAML
    list in an experiment file); None is no path."""
    if value is None:
        return []
    if not isinstance(value, str):
        return [str(v) for v in value]
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return [text] if text else []
    return [t.strip().strip("'\"") for t in text[1:-1].split(",") if t.strip()]


def is_shipped(path: Path) -> bool:
    """A file of a shipped set, which a prepare step writes: this module's GSM8K-format set, or the arith task's
    (:mod:`hpo.backends.verl._arith`)."""
    return ((path.parent == default_dir() and path.name in DEFAULT_FILES)
            or (path.parent == Path(os.path.expanduser(ARITH_DIR)) and path.name in ARITH_FILES))


def missing_files(key: str, value: str | Sequence[str] | None) -> str | None:
    """One line naming the first file of ``key`` that does not exist and will not be written here, else None
    (remote paths such as ``hdfs://`` are left to verl)."""
    for text in split_list(value):
        if "://" in text:
            continue
        path = resolve_path(text)
        if not path.exists() and not is_shipped(path):
            return (f"{key}: {path} does not exist (only the shipped sets in {default_dir()} and {ARITH_DIR} are "
                    "generated; point the key at your parquet files)")
    return None


def missing_reward(value: str | None) -> str | None:
    """One line naming the reward function's file (``reward.custom_reward_function.path``) when it is not a regular
    file and no prepare step of this project writes it (the arith task's ``reward.py``), with the ``.py`` files beside
    where it was looked for when there are any (a typo); else None. Remote paths are left to verl."""
    text = str(value or "").strip().strip("'\"")
    if not text or "://" in text:
        return None
    try:
        path = resolve_path(text)
    except ValueError as err:
        return str(err)
    if path.is_file() or path == Path(os.path.expanduser(ARITH_DIR)) / "reward.py":
        return None
    why = "is not a regular file" if path.exists() else "does not exist"
    near = sorted(p.name for p in path.parent.glob("*.py"))[:5] if path.parent.is_dir() else []
    beside = f"; {path.parent} holds {', '.join(near)}" if near else ""
    return (f"{path} {why} (the reward function's file; a relative path is read from the experiment file's "
            f"directory, or from the current one when typed with --override){beside}")


def ensure(train: str | None, val: str | None) -> list[Path]:
    """Write the files of the shipped set that the config names and that do not exist yet; returns the paths
    written. ValueError (one line) for any other missing file."""
    for key, text in (("data.train_files", train), ("data.val_files", val)):
        problem = missing_files(key, text)
        if problem:
            raise ValueError(problem)
    written = []
    for text in (train, val):
        for item in split_list(text):
            path = resolve_path(item) if "://" not in item else None
            if path is not None and is_shipped(path) and not path.exists():
                written.append(write_parquet(path, DEFAULT_FILES[path.name]))
    return written


def prepare_args(args: Sequence[str], keys: Sequence[str]) -> dict[str, str]:
    """``{key: value}`` of the overrides among a prepare step's arguments (the driver passes ``--config NAME`` and
    the experiment's overrides) whose key, ``+`` prefixes dropped, is one of ``keys``."""
    found: dict[str, str] = {}
    i = 0
    while i < len(args):
        if args[i] == "--config":  # the config; the paths are in the overrides
            i += 2
            continue
        key, sep, value = args[i].partition("=")
        if sep and key.lstrip("+") in keys:
            found[key.lstrip("+")] = value
        i += 1
    return found


def run_prepare(write: Callable[[], list[Path]]) -> int:
    """A prepare step's exit: 0 with a line per file written, 2 with one ``error:`` line."""
    try:
        written = write()
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    files = prepare_args(list(sys.argv[1:] if argv is None else argv), ("data.train_files", "data.val_files"))
    return run_prepare(lambda: ensure(files.get("data.train_files"), files.get("data.val_files")))


if __name__ == "__main__":
    sys.exit(main())


ROW_BATCH = 65_536  # rows read at a time by bad_rows: three columns of them, whatever the file's size


def bad_rows(key: str, value: str | Sequence[str] | None, prompt_key: str = "prompt") -> str | None:
    """One line naming the first data file of ``key`` with rows verl cannot use, else None: a missing column
    (``prompt_key``, ``data_source``, ``reward_model``), or rows whose prompt is null or empty, whose ``data_source``
    is null, or whose ``reward_model.ground_truth`` is null (the first rows and how many). Every row of every local
    data file (parquet, json, jsonl: as verl reads them, ``_compose_data.iter_batches``) is read, three columns at a
    time in batches of :data:`ROW_BATCH` (a file of millions of rows is never loaded whole); a path that is not a
    regular file, or not readable as its name says, is left to verl's own data path (``validate``)."""
    from hpo.analysis import FileRefused, check_regular
    from hpo.backends.verl._compose_data import data_format

    for text in split_list(value):
        if "://" in text:
            continue
        path = resolve_path(text)
        if data_format(str(path)) is None:
            return (f"{key}: {path}: verl 0.9.1 reads .parquet, .json and .jsonl files only (its RLHFDataset raises "
                    "'Unsupported file format' on any other name)")
        try:
            check_regular(path, str(path))
        except (OSError, FileRefused):
            continue
        problem = _bad_rows_of(key, path, prompt_key)
        if problem:
            return problem
    return None


def _bad_rows_of(key: str, path: Path, prompt_key: str) -> str | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from hpo.backends.verl._compose_data import column_or_nulls, iter_batches

    columns = [prompt_key, "data_source", "reward_model"]
    found: dict[str, list[int]] = {}
    counts: dict[str, int] = {}
    seen: set[str] = set()
    offset = 0
    try:
        if path.name.endswith(".parquet"):  # its columns are known before any row is read
            import pyarrow.parquet as pq

            seen = set(pq.ParquetFile(path).schema_arrow.names)
            if any(c not in seen for c in columns):
                return _no_column(key, path, columns, seen, prompt_key)
        for batch in iter_batches(str(path), columns, ROW_BATCH):
            seen.update(batch.schema.names)
            prompt, source, reward = (column_or_nulls(batch, c) for c in columns)
            checks = {f"{prompt_key} is null or empty": _empty(prompt, pc), "data_source is null": pc.is_null(source)}
            if pa.types.is_struct(reward.type) and reward.type.get_field_index("ground_truth") >= 0:
                truth = pc.struct_field(reward, "ground_truth")
                checks["reward_model.ground_truth is null"] = pc.or_(pc.is_null(reward), pc.is_null(truth))
            elif "reward_model" in batch.schema.names and not pa.types.is_null(reward.type):
                return (f"{key}: {path}: reward_model is {reward.type}, not a struct with a ground_truth field "
                        "(verl's reward manager reads reward_model['ground_truth'])")
            for what, mask in checks.items():
                rows = pc.indices_nonzero(pc.fill_null(mask, True)).to_pylist()
                if rows:
                    found.setdefault(what, []).extend(offset + r for r in rows[:3])
                    counts[what] = counts.get(what, 0) + len(rows)
            offset += batch.num_rows
    except (OSError, ValueError, pa.ArrowException):
        return None  # not what its name says: verl's own data path names it (validate)
    if offset and any(c not in seen for c in columns):
        return _no_column(key, path, columns, seen, prompt_key)
    for what, rows in found.items():
        return (f"{key}: {path} row {rows[0]}: {what} ({counts[what]} of {offset} rows, the first "
                f"{', '.join(map(str, rows[:3]))})")
    return None


def _no_column(key: str, path: Path, columns: list[str], seen: set[str], prompt_key: str) -> str:
    missing = next(c for c in columns if c not in seen)
    return f"{key}: {path} has no column {missing!r} (verl reads {prompt_key!r}, 'data_source', 'reward_model')"


def _empty(column: Any, pc: Any) -> Any:
    """Null, or an empty list / string, per row of a prompt column (chat messages or text)."""
    import pyarrow as pa

    null = pc.is_null(column)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return pc.or_(null, pc.equal(pc.list_value_length(column), 0))
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pc.or_(null, pc.equal(pc.utf8_length(column), 0))
    return null


def overlong_verdict(overlong: dict[str, Any] | None) -> tuple[str, str] | None:
    """``(level, one line)`` for the prompts longer than ``data.max_prompt_length`` that the compose script found
    (``_compose_data.overlong_prompts`` plus the config's ``limit``, ``truncation`` and ``filter``), as verl 0.9.1
    treats them: dropped at load with ``data.filter_overlong_prompts`` (a note), else cut by the agent loop to their
    last ``rollout.prompt_length`` (= ``data.max_prompt_length``) tokens with a warning in the trial's log
    (``AgentLoopBase._cap_text_prompt_length``), whatever ``data.truncation`` says: verl's RL path stores that key and
    never reads it (a warning: the study runs, on prompts whose beginning the model never sees). None when there are
    none (or nothing was measured)."""
    if not isinstance(overlong, dict) or not overlong.get("count"):
        return None
    limit, count, rows = overlong.get("limit"), int(overlong["count"]), int(overlong.get("rows") or 0)
    first = "; ".join(f"{Path(str(f)).name} row {r}: {n} tokens" for f, r, n in overlong.get("first") or [])
    longest = overlong.get("longest") or ["?", "?", "?"]
    some = (f"{count} of {rows} prompts are longer than data.max_prompt_length={limit} tokens (first: {first}; "
            f"longest: {Path(str(longest[0])).name} row {longest[1]}, {longest[2]} tokens)")
    if overlong.get("capped"):
        some += f" (at least: {overlong.get('tokenized')} rows were tokenized, the rest not)"
    if overlong.get("filter"):
        return "note", f"{some}: data.filter_overlong_prompts drops them when the data loads"
    truncation = str(overlong.get("truncation") or "error")
    return "warning", (f"{some}: verl 0.9.1's agent loop keeps only their last {limit} tokens (it cuts every text "
                       f"prompt over data.max_prompt_length from the left; data.truncation={truncation} is not read "
                       f"by its RL trainer); raise data.max_prompt_length to {longest[2]}, or set "
                       "data.filter_overlong_prompts=true to drop them")
