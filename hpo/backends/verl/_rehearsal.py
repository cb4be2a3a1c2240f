"""verl's ``rehearsal`` feature (:class:`~hpo.backends.Rehearsal`): the flags of ``verl-hpo rehearse`` that are
verl's (:meth:`VerlRehearsal.add_arguments`) and the run (:meth:`VerlRehearsal.run`: the flags checked, then
``--recheck`` or the experiment loaded with every corner composed and rehearsed by :mod:`hpo.backends.verl._rehearse`,
imported only then)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from hpo.experiment import Space, SpaceError

# Ranges of the numeric flags, checked before any corner is composed (a minute, more on a busy host).
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


class VerlRehearsal:
    """``verl-hpo rehearse`` of a verl experiment: its pipeline shrunk to a small model on this CPU (exit 0 it would
    run, 1 it would fail, 3 a corner could not finish here)."""

    def add_arguments(self, rh: argparse._ActionsContainer) -> None:
        rh.add_argument("--tokenizer", type=Path, default=None, metavar="DIR",
                        help="the model's tokenizer (tokenizer.json, tokenizer_config.json) when neither the model "
                             "path nor the Hugging Face cache has it")
        rh.add_argument("--format", choices=("text", "md"), default="text",
                        help="md: a report to paste into a ticket")
        rh.add_argument("--quick", action="store_true", help="the default point only, without the kill and resume: a "
                                                             "first look in a third of the time")
        rh.add_argument("--parallel", type=int, default=None, metavar="N",
                        help="corners run at once (default: two when this host has the free cores, else one); each "
                             "is a trainer run of its own, so host memory adds up (~7 GB each for a 135M-parameter "
                             "model)")
        rh.add_argument("--recheck", action="store_true",
                        help="run nothing: the checks again on this experiment's last rehearsal (after fixing e.g. "
                             "the objective's name)")
        rh.add_argument("--corner-timeout", type=float, default=None, metavar="S",
                        help="seconds each corner's run may take before it is reported as not finished here (exit "
                             "3, not a failure); default trial.timeout_s, else 1800")
        rh.add_argument("--gpus", type=int, default=None, metavar="N",
                        help="estimate each corner's GPU memory for trials of N GPUs (default trial.gpus_per_trial)")
        rh.add_argument("--gpu-memory", default=None, metavar="SIZE",
                        help="the real study's GPU size for that estimate, e.g. 80GiB (default: this host's GPU, "
                             "else 80)")
        rh.add_argument("--reward-timeout", type=float, default=120.0, metavar="S",
                        help="seconds the reward function may take over all its calls of the reward check (default "
                             "120)")

    def run(self, space: Space, args: argparse.Namespace) -> int:
        """The flags (one line each, before any corner is composed), then ``--recheck`` on the quick load, or the
        experiment loaded with every corner composed by verl and rehearsed; a check that ran out of its time on this
        host is exit 3, not rehearsed and not failed."""
        from hpo.backends._check import load_space
        from hpo.backends.verl import _rehearse

        problem = flag_problem(args)
        if problem is not None:
            raise SpaceError(problem)
        if args.tokenizer is not None and not args.tokenizer.expanduser().is_dir():
            raise SpaceError(f"--tokenizer {_shown(args.tokenizer)}: not a directory")
        gpu_bytes = None if args.gpu_memory is None else _rehearse.parse_size(args.gpu_memory)
        if args.gpu_memory is not None and gpu_bytes is None:
            raise SpaceError(f"--gpu-memory {_shown(repr(args.gpu_memory))}: not a GPU size {_rehearse.SIZE_RANGE} "
                             "(e.g. 80GiB, 141G, 24576MiB)")
        if args.recheck:  # reruns checks on kept runs: the quick load, not every corner composed by the trainer
            return int(_rehearse.recheck(space, args.studies_dir, fmt=args.format))
        try:
            space = load_space(args.space, list(args.override), args.spaces_dir, thorough=True)
        except SpaceError as err:
            if not getattr(err, "unfinished", False):
                raise
            # the trainer's check ran out of its time on this host: not rehearsed, not failed (exit 3, as a corner's)
            print(f"NOT FINISHED HERE: {err}; not rehearsed, not failed", file=sys.stderr)
            return 3
        tokenizer = None if args.tokenizer is None else args.tokenizer.expanduser().resolve()
        return int(_rehearse.rehearse(space, args.studies_dir, tokenizer=tokenizer, fmt=args.format,
                                      quick=args.quick, parallel=args.parallel, reward_timeout_s=args.reward_timeout,
                                      timeout_s=args.corner_timeout, gpus=args.gpus, gpu_bytes=gpu_bytes))
