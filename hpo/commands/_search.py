"""``verl-hpo search``: run (or continue) a study of an experiment file."""

from __future__ import annotations

import argparse

from hpo.backends import load_space
from hpo.commands._args import budget_arg, ray_arg, storage_args, tracking_args
from hpo.commands._base import Invocation, make_studies_dir, spaces_dir
from hpo.commands._speed_from import SpeedFrom
from hpo.commands._study import StudyRun, run_study


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--space", required=True, help="search_spaces/<NAME>.yaml or a path")
    s.add_argument("--study", help="study name (default: the space name)")
    s.add_argument("--n-trials", type=int, help="finished trials the study runs to (default: study.n_trials)")
    s.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="space field (study.n_trials=4, params.kl_coef.high=0.1, trial.timeout_s=60) or fixed "
                        "trainer override (trainer.total_training_steps=10); repeatable")
    tracking_args(s)
    budget_arg(s)
    ray_arg(s)
    storage_args(s)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    from hpo.storages import check_storage_url, check_study_name, default_storage_url

    overrides = list(args.override)
    if args.n_trials is not None:
        overrides.append(f"study.n_trials={args.n_trials}")
    speed = SpeedFrom(args.storage, inv.studies_dir)  # a throughput study's confirmed speed settings, for every trial
    space = load_space(args.space, overrides, spaces_dir(), thorough=True, speed_from=speed)  # read, checked once
    study_name = (check_study_name(args.study) if args.study is not None
                  else check_study_name(space.name, "space name"))
    inv.storage_url = args.storage or default_storage_url(inv.studies_dir, study_name)
    check_storage_url(inv.storage_url)  # first: a bad storage leaves no studies directory behind
    make_studies_dir(inv.studies_dir)  # one line naming the directory, not the storage, when it cannot be made
    return run_study(StudyRun(study_name, space, storage=args.storage, budget=args.budget,
                              tracking=tuple(args.tracking), tracking_optional=args.tracking_optional,
                              ray_address=args.ray_address, speed_info=speed.info), inv)
