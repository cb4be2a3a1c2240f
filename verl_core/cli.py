"""``python -m verl_core train|prepare|keys``.

User errors (bad config, missing model or data) print one line ``error: ...`` to
stderr and exit 2; anything else is a bug or a resource failure and keeps its
traceback (exit 1), which the HPO driver classifies (e.g. ``MemoryError`` -> oom).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from verl_core.config import ConfigError, iter_fields, load_config, shipped_configs


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
    sub.add_parser("keys", help="list every config key with its type and meaning")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "keys":
        for key, tp, f in iter_fields():
            print(f"{key}  [{getattr(tp, '__name__', tp)}]  {f.metadata['help']}")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        cfg = load_config(args.config, args.overrides)
        if args.cmd == "prepare":
            from verl_core.trainer import resolve_data_path, resolve_model_path

            resolve_model_path(cfg.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")
            resolve_data_path(cfg.data.train_files, "data.train_files", "train")
            resolve_data_path(cfg.data.val_files, "data.val_files", "val")
            print("ready", flush=True)
            return 0
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" bars would bury the one-line errors on stderr
        from verl_core.trainer import PPOTrainer

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
