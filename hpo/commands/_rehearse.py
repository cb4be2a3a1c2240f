"""``verl-hpo rehearse``: run an experiment's own pipeline shrunk to a small model on this CPU, and report what would
fail a real study (verl: exit 0 it would run, 1 it would fail, 3 a corner could not finish here). The rehearsal is the
trial's backend's ``rehearsal`` feature (:func:`hpo.backends.rehearsal_of`): its flags are the trainer's own (an
argument group per trainer that has one, :meth:`~hpo.backends.Rehearsal.add_arguments`), its run too; this command
holds the flags every rehearsal shares and loads the experiment (the quick load: a second)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpo.backends import backend_named, backends_that, load_space
from hpo.commands._base import ENV_STUDIES_DIR, Invocation, spaces_dir


def add_arguments(rh: argparse.ArgumentParser) -> None:
    rh.add_argument("--space", required=True,
                    help="search_spaces/<NAME>.yaml or a path (a trainer whose backend has a rehearsal)")
    rh.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="as for search (e.g. "
                    "actor_rollout_ref.model.path=/local/model/dir)")
    rh.add_argument("--studies-dir", type=Path, default=None,
                    help=f"its files go to <studies-dir>/rehearsals/<space> (default ${ENV_STUDIES_DIR} or ./studies)")
    able, _ = backends_that(lambda b: b.rehearsal is not None)  # the shipped and registered trainers' (no plugin)
    for name in able:
        rehearsal = backend_named(name).rehearsal
        assert rehearsal is not None
        rehearsal.add_arguments(rh.add_argument_group(f"trial.backend: {name}"))


def run(args: argparse.Namespace, inv: Invocation) -> int:
    from hpo.backends import rehearsal_of

    space = load_space(args.space, list(args.override), spaces_dir())  # the quick load (a second)
    tool = rehearsal_of(space)  # SpaceError: a trainer without a rehearsal
    return tool.run(space, argparse.Namespace(**{**vars(args), "spaces_dir": spaces_dir(),
                                                 "studies_dir": inv.studies_dir.resolve()}))
