"""``verl-hpo resume``: continue a stored study until it has its target of finished trials."""

from __future__ import annotations

import argparse

from hpo.commands._args import budget_arg, ray_arg, storage_args, tracking_args, trust_args
from hpo.commands._base import Invocation
from hpo.commands._study import run_stored


def add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("--study", required=True)
    r.add_argument("--n-trials", type=int, help="raise (or lower) the study's target")
    ray_arg(r)
    trust_args(r)
    tracking_args(r)
    budget_arg(r)
    storage_args(r)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    return run_stored(args, inv, n_trials=args.n_trials, ray_address=args.ray_address)
