"""The launcher of a ``trial.backend: trl`` trial: TRL's ``GRPOTrainer`` on a verl-format task, run in TRL's
interpreter (never imported by the driver, which starts it as a script)::

    python _train.py --config CONFIG.yaml --metrics-file METRICS.jsonl [key=value ...]
    python _train.py --prepare --config CONFIG.yaml [key=value ...]   # build the model and data once
    python _train.py --keys                                            # GRPOConfig's field names (JSON)
    python _train.py --check < [[key=value, ...], ...]                 # GRPOConfig of each override set (JSON)

Keys (the config file, then the ``key=value`` overrides, values in YAML syntax): a flat key is a field of
``trl.GRPOConfig`` (``learning_rate``, ``beta``, ``num_generations``, ``max_steps``, ``eval_steps``, ``save_steps``,
``output_dir``, ``resume_from_checkpoint``, ...); a dotted key is the launcher's own (``_keys.LAUNCHER_KEYS``): the
model, the data (verl's parquet rows: ``prompt`` chat messages, ``reward_model.ground_truth``, ``data_source``), the
reward (verl's ``compute_score`` contract; by default ``verl_core``'s rule scorers by ``data_source``) and the
evaluation. ``builtin:tiny_arith`` and ``builtin:arith`` are ``verl_core``'s locally built model and task.

Metrics: every TRL log line becomes ``{"step": N, "data": {...}}`` in ``--metrics-file`` (verl's ``file`` logger
format), its keys as Hugging Face's trackers write them (``train/<key>``; TRL's own evaluation ``eval_<key>`` as
``eval/trl/<key>``), plus the names the driver's diagnosis reads (``actor/entropy``, ``actor/kl_loss``,
``critic/score/mean``, ``response_length/clip_ratio``) and ``timing_s/step``. At step 0 (``eval.before_train``),
every ``eval_steps`` steps and the last step the policy answers every validation prompt greedily:
``eval/reward_mean`` (the objective of the shipped experiment), ``eval/reward_std``, ``eval/response_length_mean``;
with ``data.test_files`` (confirmation runs only) the last step also scores the held-out split: ``test/*``.

User errors (an unknown key, a bad value, a missing file) print one line ``error: ...`` and exit 2. No network:
the Hugging Face hub is switched off before transformers is imported.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.append(str(Path(__file__).resolve().parents[3]))  # verl_core (the task, model, reward) from any interpreter
# this file's sibling: run as a script, its folder is sys.path[0]
from _keys import LAUNCHER_KEYS, flatten, load_mapping, load_value, resolve_env_refs

# What the launcher sets unless the config does: no tracker but the metrics file, a log line per step, CPU-friendly.
DEFAULTS: dict[str, Any] = {"report_to": "none", "logging_steps": 1, "disable_tqdm": True, "save_strategy": "steps",
                            "eval_strategy": "no", "dataloader_num_workers": 0, "log_completions": False}


class UserError(Exception):
    """A problem with the config or its files: one line, exit 2."""


# ----------------------------------------------------------------------------- config
def parse_override(text: str) -> tuple[str, Any]:
    key, sep, rhs = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {text!r}: expected key=value")
    return key.strip(), load_value(rhs)


def load_config(path: str | None, overrides: list[str]) -> dict[str, Any]:
    """The config file's keys, then the overrides (the later wins)."""
    cfg: dict[str, Any] = {}
    if path:
        try:
            raw = load_mapping(Path(path).read_text()) or {}
        except OSError as err:
            raise UserError(f"--config {path}: cannot read ({err.strerror})") from None
        except yaml.YAMLError as err:
            raise UserError(f"--config {path}: invalid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(raw, dict):
            raise UserError(f"--config {path}: expected a mapping of keys, got {type(raw).__name__}")
        cfg.update(flatten(raw))
    for text in overrides:
        key, value = parse_override(text)
        cfg[key] = value
    return cfg


def split_config(cfg: dict[str, Any], fields: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(launcher keys with their defaults, GRPOConfig keyword arguments with the launcher's defaults);
    UserError naming an unknown key (and the nearest known one)."""
    launcher = dict(LAUNCHER_KEYS)
    grpo = dict(DEFAULTS)
    for key, value in cfg.items():
        known = LAUNCHER_KEYS if "." in key else fields
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=1)
            kind = "launcher key" if "." in key else "GRPOConfig field"
            raise UserError(f"{key}: unknown {kind}" + (f" (did you mean {near[0]}?)" if near else ""))
        (launcher if "." in key else grpo)[key] = value
    return launcher, grpo


def grpo_fields() -> list[str]:
    import dataclasses

    from trl import GRPOConfig

    return sorted(f.name for f in dataclasses.fields(GRPOConfig) if f.init)


def grpo_config(grpo: dict[str, Any]) -> Any:
    from trl import GRPOConfig

    try:
        return GRPOConfig(**grpo)
    except (ValueError, TypeError) as err:
        raise UserError(f"GRPOConfig: {str(err).strip().splitlines()[0]}") from None


# ----------------------------------------------------------------------------- model, data, reward
def resolve_model(path: str) -> str:
    from verl_core.config import ConfigError
    from verl_core.resolve import resolve_model_path

    try:
        return resolve_model_path(str(path), "model.path")
    except ConfigError as err:
        raise UserError(str(err)) from None


def resolve_data(path: str, key: str, split: str) -> str:
    from verl_core.config import ConfigError
    from verl_core.resolve import resolve_data_path

    try:
        local = resolve_data_path(str(path), key, split)
    except ConfigError as err:
        raise UserError(str(err)) from None
    if not Path(local).expanduser().is_file():
        raise UserError(f"{key}={path!r}: no such file")
    return str(Path(local).expanduser())


def read_rows(path: str) -> list[dict[str, Any]]:
    """verl-format rows as TRL's dataset: ``prompt`` (chat messages), ``ground_truth``, ``data_source``."""
    import pyarrow.parquet as pq

    out = []
    for row in pq.read_table(path).to_pylist():
        truth = (row.get("reward_model") or {}).get("ground_truth")
        out.append({"prompt": [dict(m) for m in row["prompt"]], "ground_truth": str(truth),
                    "data_source": row.get("data_source") or ""})
    return out


def score_function(launcher: dict[str, Any]) -> Any:
    """verl's contract ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float``."""
    from verl_core.config import ConfigError
    from verl_core.rewards import default_compute_score, load_custom_function

    if not launcher["reward.path"]:
        return default_compute_score
    try:
        return load_custom_function(str(launcher["reward.path"]), str(launcher["reward.name"]))
    except ConfigError as err:
        raise UserError(str(err)) from None


def completion_text(completion: Any) -> str:
    return str(completion[-1]["content"]) if isinstance(completion, list) else str(completion)


def as_score(value: Any) -> float:
    return float(value["score"] if isinstance(value, dict) else value)


# ----------------------------------------------------------------------------- metrics and evaluation
def finite_or_none(value: Any) -> Any:
    """NaN and inf as ``null``, like verl's file logger (orjson)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsFile:
    """Appends ``{"step": N, "data": {...}}`` lines, flushed one by one (the driver tails the file)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, step: int, data: dict[str, Any]) -> None:
        clean = {k: finite_or_none(v) for k, v in data.items() if isinstance(v, (int, float)) or v is None}
        self._file.write(json.dumps({"step": int(step), "data": clean}) + "\n")
        self._file.flush()


def rewrite_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """TRL's log keys as Hugging Face's trackers name them (the driver reads them by the backend's vocabulary,
    ``TrlBackend.metrics``: no renaming into verl's names)."""
    return {(f"eval/trl/{k[5:]}" if k.startswith("eval_") else f"train/{k}"): v for k, v in logs.items()}


class GreedyEval:
    """Greedy answers to every prompt of a split, scored by the task's reward: ``<prefix>/reward_mean``,
    ``reward_std``, ``response_length_mean``."""

    def __init__(self, rows: list[dict[str, Any]], tokenizer: Any, score: Any, max_new_tokens: int,
                 batch: int = 256) -> None:
        self.rows, self.tokenizer, self.score = rows, tokenizer, score
        self.max_new_tokens, self.batch = max_new_tokens, batch
        self.prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                        for r in rows]

    def __call__(self, model: Any, prefix: str) -> dict[str, float]:
        from transformers import GenerationConfig

        gen = GenerationConfig(do_sample=False, max_new_tokens=self.max_new_tokens,
                               pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id)
        was_training = model.training
        model.eval()
        scores: list[float] = []
        lengths: list[int] = []
        try:
            for i in range(0, len(self.prompts), self.batch):
                enc = self.tokenizer(self.prompts[i:i + self.batch], return_tensors="pt", padding=True,
                                     add_special_tokens=False).to(model.device)
                out = model.generate(**enc, generation_config=gen)[:, enc["input_ids"].shape[1]:]
                for row, ids in zip(self.rows[i:i + self.batch], out.tolist(), strict=True):
                    ids = [t for t in ids if t != self.tokenizer.pad_token_id]
                    if self.tokenizer.eos_token_id in ids:
                        ids = ids[:ids.index(self.tokenizer.eos_token_id) + 1]
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                    scores.append(as_score(self.score(row["data_source"], text, row["ground_truth"], None)))
                    lengths.append(len(ids))
        finally:
            model.train(was_training)
        return {f"{prefix}/reward_mean": statistics.fmean(scores), f"{prefix}/reward_std": statistics.pstdev(scores),
                f"{prefix}/response_length_mean": statistics.fmean(lengths)}


def make_callback(metrics: MetricsFile, val: GreedyEval, test: GreedyEval | None, eval_steps: int,
                  max_steps: int, before_train: bool) -> Any:
    from transformers import TrainerCallback

    class ToMetricsFile(TrainerCallback):  # type: ignore[misc]
        """TRL's logs and the greedy evaluations into the metrics file."""

        def __init__(self) -> None:
            self.mark: float | None = None
            self.step_s: dict[int, float] = {}

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if before_train and state.global_step == 0:  # a resumed run's step-0 evaluation is in its replay
                metrics.write(0, val(model, "eval"))
            self.mark = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            now = time.perf_counter()
            if self.mark is not None:
                self.step_s[state.global_step] = now - self.mark
            step, data = state.global_step, {}
            if step % eval_steps == 0 or step >= max_steps:
                data.update(val(model, "eval"))
            if test is not None and step >= max_steps:
                data.update(test(model, "test"))
            if data:
                metrics.write(step, data)
            self.mark = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kw: Any) -> None:
            data = rewrite_logs(dict(logs or {}))
            if state.global_step in self.step_s and "train/loss" in data:
                data["timing_s/step"] = self.step_s[state.global_step]
            metrics.write(state.global_step, data)

    return ToMetricsFile()


# ----------------------------------------------------------------------------- the run
def prepare(launcher: dict[str, Any]) -> None:
    resolve_model(launcher["model.path"])
    for key, split in (("data.train_files", "train"), ("data.val_files", "val"), ("data.test_files", "test")):
        if launcher[key]:
            resolve_data(launcher[key], key, split)


def train(launcher: dict[str, Any], grpo: dict[str, Any], metrics_path: Path) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    hf_logging.disable_progress_bar()
    args = grpo_config(grpo)
    if not args.max_steps or args.max_steps <= 0:
        raise UserError("max_steps: set the trial's steps (a positive integer)")
    eval_steps = int(args.eval_steps or args.max_steps) if isinstance(args.eval_steps, (int, float)) else int(
        args.max_steps)
    model_dir = resolve_model(launcher["model.path"])
    train_rows = read_rows(resolve_data(launcher["data.train_files"], "data.train_files", "train"))
    val_rows = read_rows(resolve_data(launcher["data.val_files"], "data.val_files", "val"))
    test_rows = (read_rows(resolve_data(launcher["data.test_files"], "data.test_files", "test"))
                 if launcher["data.test_files"] else None)
    score = score_function(launcher)

    def reward(completions: list[Any], ground_truth: list[str], data_source: list[str], **_: Any) -> list[float | None]:
        return [as_score(score(ds, completion_text(c), gt, None))
                for c, gt, ds in zip(completions, ground_truth, data_source, strict=True)]

    reward.__name__ = "task_reward"  # TRL logs rewards/<name>/mean
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    max_new = int(args.max_completion_length or 256)
    val = GreedyEval(val_rows, tokenizer, score, max_new)
    test = GreedyEval(test_rows, tokenizer, score, max_new) if test_rows is not None else None
    metrics = MetricsFile(metrics_path)
    callback = make_callback(metrics, val, test, max(1, eval_steps), int(args.max_steps),
                             bool(launcher["eval.before_train"]))
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(train_rows),
                          eval_dataset=Dataset.from_list(val_rows) if args.eval_strategy != "no" else None,
                          processing_class=tokenizer, callbacks=[callback])
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint or None)


def check(override_sets: list[list[str]], config: str | None) -> list[str | None]:
    """For each override set: None when GRPOConfig accepts the config with it, else the one-line problem."""
    fields = set(grpo_fields())
    out: list[str | None] = []
    for overrides in override_sets:
        try:
            _, grpo = split_config(load_config(config, overrides), fields)
            grpo.setdefault("output_dir", "unused")
            grpo_config(grpo)
            out.append(None)
        except UserError as err:
            out.append(str(err))
        except Exception as err:  # noqa: BLE001 - TRL or a library it loads for a key's value (deepspeed=...)
            out.append(f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="_train.py", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="YAML of GRPOConfig fields and launcher keys")
    p.add_argument("--metrics-file", type=Path, default=None, help="JSONL metrics ({'step': N, 'data': {...}})")
    p.add_argument("--prepare", action="store_true", help="build the model and data the config names, then exit")
    p.add_argument("--keys", action="store_true", help="print GRPOConfig's field names as JSON, then exit")
    p.add_argument("--check", action="store_true", help="read a JSON list of override lists on stdin; print the "
                   "problem of each (null: accepted)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):  # never the network
        os.environ[var] = "1"
    try:
        if args.keys:
            print(json.dumps(grpo_fields()))
            return 0
        if args.check:
            print(json.dumps(check(json.load(sys.stdin), args.config)))
            return 0
        try:  # a secret comes as key=${oc.env:VERL_HPO_SECRET_...} with its value in this process's environment
            overrides = resolve_env_refs(args.overrides)
        except ValueError as err:
            raise UserError(str(err)) from None
        cfg = load_config(args.config, overrides)
        threads = cfg.get("runtime.threads", LAUNCHER_KEYS["runtime.threads"])
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)  # before torch loads
        launcher, grpo = split_config(cfg, set(grpo_fields()))
        if args.prepare:
            prepare(launcher)
            print("ready", flush=True)
            return 0
        if args.metrics_file is None:
            raise UserError("--metrics-file is required to train")
        grpo.setdefault("output_dir", str(args.metrics_file.parent / "checkpoints"))
        train(launcher, grpo, args.metrics_file)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
