"""``verl-hpo resume``: continue a stored study until it has its target of finished trials."""

from __future__ import annotations

import argparse

from hpo.commands._args import budget_arg, ray_arg, storage_args, tracking_args, trust_args
from hpo.commands._base import Command, Invocation, open_existing
from hpo.commands._study import run_study


def add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("--study", required=True)
    r.add_argument("--n-trials", type=int, help="raise (or lower) the study's target")
    ray_arg(r)
    trust_args(r)
    tracking_args(r)
    budget_arg(r)
    storage_args(r)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    refused = open_existing(args, inv)
    if refused is not None:
        return refused
    return run_study(None, args.study, inv, args)


RESUME = Command("resume", "continue a study until it has n_trials finished trials", add_arguments, run)
