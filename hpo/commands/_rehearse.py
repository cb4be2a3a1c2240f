"""``verl-hpo rehearse``: run a verl experiment's own pipeline shrunk to a small model on this CPU, and report what
would fail a real study (exit 0 it would run, 1 it would fail, 3 a corner could not finish here). The rehearsal
itself is the trial's backend's (:func:`hpo.backends.rehearsal_of`)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from hpo.backends import load_space
from hpo.commands._base import ENV_STUDIES_DIR, Invocation, Subcommand, fail, spaces_dir
from hpo.experiment import SpaceError


def add_arguments(rh: argparse.ArgumentParser) -> None:
    rh.add_argument("--space", required=True,
                    help="search_spaces/<NAME>.yaml or a path (a trainer whose backend has a rehearsal)")
    rh.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="as for search (e.g. "
                    "actor_rollout_ref.model.path=/local/model/dir)")
    rh.add_argument("--tokenizer", type=Path, default=None, metavar="DIR",
                    help="the model's tokenizer (tokenizer.json, tokenizer_config.json) when neither the model path "
                         "nor the Hugging Face cache has it")
    rh.add_argument("--format", choices=("text", "md"), default="text", help="md: a report to paste into a ticket")
    rh.add_argument("--quick", action="store_true", help="the default point only, without the kill and resume: a "
                                                         "first look in a third of the time")
    rh.add_argument("--parallel", type=int, default=None, metavar="N",
                    help="corners run at once (default: two when this host has the free cores, else one); each is "
                         "a trainer run of its own, so host memory adds up (~7 GB each for a 135M-parameter model)")
    rh.add_argument("--recheck", action="store_true", help="run nothing: the checks again on this experiment's last "
                                                           "rehearsal (after fixing e.g. the objective's name)")
    rh.add_argument("--corner-timeout", type=float, default=None, metavar="S",
                    help="seconds each corner's run may take before it is reported as not finished here (exit 3, "
                         "not a failure); default trial.timeout_s, else 1800")
    rh.add_argument("--gpus", type=int, default=None, metavar="N",
                    help="estimate each corner's GPU memory for trials of N GPUs (default trial.gpus_per_trial)")
    rh.add_argument("--gpu-memory", default=None, metavar="SIZE",
                    help="the real study's GPU size for that estimate, e.g. 80GiB (default: this host's GPU, else 80)")
    rh.add_argument("--reward-timeout", type=float, default=120.0, metavar="S",
                    help="seconds the reward function may take over all its calls of the reward check (default 120)")
    rh.add_argument("--studies-dir", type=Path, default=None,
                    help=f"its files go to <studies-dir>/rehearsals/<space> (default ${ENV_STUDIES_DIR} or ./studies)")


# Ranges of rehearse's numeric flags, checked before the experiment is loaded (loading composes every corner).
MAX_PARALLEL = 16  # corners at once (a rehearsal has three; each is a trainer run of ~7 GB of host memory)
MAX_GPUS = 4096  # GPUs per trial of the real study, for the memory estimate
MAX_SECONDS = 7 * 86400.0  # --corner-timeout, --reward-timeout: a week


def _shown(value: object) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def flag_problem(args: argparse.Namespace) -> str | None:
    """The first numeric flag out of its range, as an error line; None when all are in range."""
    if args.parallel is not None and not 1 <= args.parallel <= MAX_PARALLEL:
        return (f"--parallel {_shown(args.parallel)}: must be 1 or more (corners run at once)" if args.parallel < 1
                else f"--parallel {_shown(args.parallel)}: at most {MAX_PARALLEL} (corners run at once; a rehearsal "
                     "has three)")
    for flag, value in (("--reward-timeout", args.reward_timeout), ("--corner-timeout", args.corner_timeout)):
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
            return f"{flag} {_shown(f'{value:g}')}: must be a positive number of seconds, at most {MAX_SECONDS:.0f} " \
                   "(a week)"
    if args.gpus is not None and not 1 <= args.gpus <= MAX_GPUS:
        return f"--gpus {_shown(args.gpus)}: must be from 1 to {MAX_GPUS} (GPUs per trial of the real study)"
    return None


def run(args: argparse.Namespace, inv: Invocation) -> int:
    from hpo.backends import rehearsal_of

    problem = flag_problem(args)  # before loading: a load composes every corner (a minute, more on a busy host)
    if problem is not None:
        return fail(problem)
    space = load_space(args.space, list(args.override), spaces_dir())  # the quick load (a second)
    tool = rehearsal_of(space)  # SpaceError: a trainer without a rehearsal
    if args.tokenizer is not None and not args.tokenizer.expanduser().is_dir():
        return fail(f"--tokenizer {_shown(args.tokenizer)}: not a directory")
    gpu_bytes = None if args.gpu_memory is None else tool.parse_size(args.gpu_memory)
    if args.gpu_memory is not None and gpu_bytes is None:
        return fail(f"--gpu-memory {_shown(repr(args.gpu_memory))}: not a GPU size "
                    f"{getattr(tool, 'SIZE_RANGE', 'in range')} (e.g. 80GiB, 141G, 24576MiB)")
    if args.recheck:  # reruns checks on kept runs: the quick load, not every corner composed by the trainer
        return int(tool.recheck(space, inv.studies_dir.resolve(), fmt=args.format))
    try:
        space = load_space(args.space, list(args.override), spaces_dir(), thorough=True)
    except SpaceError as err:
        if not getattr(err, "unfinished", False):
            raise
        # the trainer's check ran out of its time on this host: not rehearsed, not failed (exit 3, as a corner's)
        print(f"NOT FINISHED HERE: {err}; not rehearsed, not failed", file=sys.stderr)
        return 3
    tokenizer = None if args.tokenizer is None else args.tokenizer.expanduser().resolve()
    return int(tool.rehearse(space, inv.studies_dir.resolve(), tokenizer=tokenizer, fmt=args.format,
                             quick=args.quick, parallel=args.parallel,
                             reward_timeout_s=args.reward_timeout,
                             timeout_s=args.corner_timeout, gpus=args.gpus, gpu_bytes=gpu_bytes))


REHEARSE = Subcommand("rehearse", "an experiment of a trainer that has a rehearsal: run its own pipeline (config, "
                                  "data, reward, objective, corners, a resume) shrunk to a small model on this CPU, "
                                  "and report what would fail a real study; exit 0 it would run, 1 it would fail, 3 a "
                                  "corner could not finish on this machine (not a failure)", add_arguments, run)
