"""``verl-hpo best``: the best trial of a study as trainer overrides (what it prints: :mod:`hpo.reporting._best`)."""

from __future__ import annotations

import argparse

from hpo.commands._args import storage_args
from hpo.commands._base import Invocation, fail, follow_up, open_existing


def add_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--study", required=True)
    b.add_argument("--format", choices=("overrides", "yaml", "command", "schedule"), default="overrides",
                   help="schedule: a pbt study's winning lineage and hyperparameter schedule as JSON")
    b.add_argument("--trial", type=int, default=None, help="print this trial's overrides instead of the best")
    storage_args(b)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    refused = open_existing(args, inv)
    if refused is not None:
        return refused
    from hpo.reporting import NoBest, print_best
    from hpo.study import load_stored, quiet_optuna

    quiet_optuna()
    space, study = load_stored(args.study, inv.storage_url, None)
    try:
        return print_best(space, study, args.study, args.format, args.trial,
                          lambda cmd: follow_up(cmd, args.study, inv.storage_url, inv.studies_dir))
    except NoBest as err:
        return fail(str(err), err.code)
