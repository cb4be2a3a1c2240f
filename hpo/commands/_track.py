"""``verl-hpo track``: log to MLflow / W&B what this host's drivers of a study could not (their spools), e.g. after a
tracking server was down past ``tracking.flush_s``."""

from __future__ import annotations

import argparse

from hpo.commands._args import storage_args
from hpo.commands._base import Invocation, fail, open_existing
from hpo.experiment import TRACKING_FLAG_HELP, SpaceError


def add_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--study", required=True)
    t.add_argument("--tracking", action="append", default=[], metavar="SPEC", help=TRACKING_FLAG_HELP)
    storage_args(t)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    refused = open_existing(args, inv)
    if refused is not None:
        return refused
    from hpo.experiment import apply_flags
    from hpo.study import load_stored, quiet_optuna
    from hpo.tracking import catch_up, checked_tracking

    quiet_optuna()
    space, _ = load_stored(args.study, inv.storage_url, None)
    spec = apply_flags(space.tracking, args.tracking, SpaceError)
    if not spec.enabled:
        return fail(f"study {args.study!r} has no tracking section; name a tracker with --tracking mlflow=URI "
                    "or --tracking wandb")
    spec = checked_tracking(spec, space.source, False, lambda line: None)
    return catch_up(spec, args.study, inv.storage_url, inv.studies_dir)
