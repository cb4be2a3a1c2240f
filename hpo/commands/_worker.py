"""``verl-hpo worker``: join a stored study (its stored experiment) and run its trials on this host until the
study's target is reached; one per host or GPU box."""

from __future__ import annotations

import argparse

from hpo.commands._args import budget_arg, ray_arg, storage_args, tracking_args, trust_args
from hpo.commands._base import Invocation, fail
from hpo.commands._study import run_stored
from hpo.experiment import MAX_N_JOBS, StudySpec


def add_arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("--study", required=True)
    w.add_argument("--n-jobs", type=int, default=None, help=f"trials this worker runs at once, at most {MAX_N_JOBS} "
                                                            "(default: the experiment's trial.n_jobs)")
    w.add_argument("--devices", default=None, metavar="0,1,..",
                   help="GPU ids this worker may use (default: the experiment's trial.devices, else detected)")
    ray_arg(w)
    trust_args(w)
    tracking_args(w)
    budget_arg(w)
    storage_args(w)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    if args.n_jobs is not None and not 1 <= args.n_jobs <= MAX_N_JOBS:  # before the study is opened or a trial runs
        digits = str(args.n_jobs)
        shown = digits if len(digits) <= 20 else f"{digits[:12]}... ({len(digits)} digits)"
        return fail(f"--n-jobs {shown}: must be positive" if args.n_jobs <= 0 else
                    f"--n-jobs {shown}: at most {MAX_N_JOBS} trials at once per worker (each is a thread of this "
                    "process beside its trial's own); run more workers, on this host or others, for more")
    # a worker (often started by a scheduler) waits for a database that is starting or restarting
    return run_stored(args, inv, n_jobs=args.n_jobs, devices=args.devices, ray_address=args.ray_address,
                      wait_s=StudySpec().storage_retry_s)
