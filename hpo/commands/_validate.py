"""``verl-hpo validate``: check an experiment file without running it (the space, every corner against the trainer
config, each corner's memory estimate)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpo.analysis import FileRefused, check_regular
from hpo.backends import load_space
from hpo.commands._args import storage_args
from hpo.commands._base import Invocation, fail, spaces_dir
from hpo.commands._speed_from import SpeedFrom
from hpo.experiment import Space, SpaceError

MAX_METRICS_BYTES = 256 << 20  # validate --metrics: a long run's metrics file is tens of MB


def add_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("--space", required=True, help="search_spaces/<NAME>.yaml or a path")
    v.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="as for search")
    v.add_argument("--metrics", type=Path, default=None, metavar="JSONL",
                   help="a previous run's metrics file; its largest response and prompt lengths (as the trainer "
                        "logs them) are the expected lengths (a corner is refused only when it does not "
                        "fit at those; the worst case only warns)")
    storage_args(v)  # where study.speed_from's throughput study lives


def run(args: argparse.Namespace, inv: Invocation) -> int:
    from hpo.backends import resolve_devices, validate_space

    # study.speed_from checked as search checks it (a complete confirmation), its settings said and applied
    speed = SpeedFrom(args.storage, inv.studies_dir, say=print)
    space = load_space(args.space, list(args.override), spaces_dir(), thorough=True, speed_from=speed)
    from hpo.backends import backend_of

    backend_of(space).check_launch(space, as_planned=True)  # e.g. a GPU study's interpreter has CUDA torch
    lengths = None
    if args.metrics is not None:
        try:  # a regular file (not a FIFO, not /dev/zero) of bounded size, then the trainer's backend reads it
            check_regular(args.metrics.expanduser(), f"--metrics {args.metrics}", MAX_METRICS_BYTES)
            lengths = _sequence_lengths(space, args.metrics)
        except FileRefused as err:
            return fail(str(err))
        except OSError as err:
            return fail(f"--metrics {args.metrics}: unreadable ({err.strerror or err})")
    return validate_space(space, resolve_devices(space.trial), sys.stdout, lengths=lengths)


def _sequence_lengths(space: Space, path: Path) -> Any:
    """The expected sequence lengths in a previous run's metrics file, read by the trainer's memory model; SpaceError
    (one line) for a trainer without one."""
    from hpo.backends import backend_of

    backend = backend_of(space)
    if backend.memory is None:
        raise SpaceError(f"--metrics {path}: trial.backend {backend.name} has no memory estimate to read lengths for")
    return backend.memory.sequence_lengths(path)
