"""``verl-hpo confirm``: re-run a study's top configurations with fresh seeds, as tagged trials of the study."""

from __future__ import annotations

import argparse

from hpo.commands._args import budget_arg, storage_args, tracking_args, trust_args
from hpo.commands._base import Invocation
from hpo.commands._study import Confirmation, run_stored


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--study", required=True)
    c.add_argument("--top", type=int, default=None, metavar="K",
                   help="configurations to confirm, best first (default: the experiment's study.confirm.top_k; "
                        "not used when a proxy search's check held: its race takes study.fidelity.proxy.confirm_top)")
    c.add_argument("--seeds", type=int, default=None, metavar="S",
                   help="fresh seeds per configuration (default: study.confirm.seeds); never a tuning seed")
    c.add_argument("--baseline-runs", nargs="+", action="extend", default=[], metavar="PATH[:seed=N]",
                   help="your own runs of study.baseline (verl's file-logger JSONL, or a run directory holding one "
                        "and a record of its overrides) imported as the baseline's runs on their seeds instead of "
                        "run here, after checking they ran the study's experiment; :seed=N names a file's seed")
    trust_args(c)
    tracking_args(c)
    budget_arg(c)
    storage_args(c)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    return run_stored(args, inv, confirm=Confirmation(args.top, args.seeds, tuple(args.baseline_runs)))
