"""The flags several subcommands share, each group added by one function (same names, defaults and help
everywhere)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpo.commands._base import ENV_STUDIES_DIR
from hpo.experiment import TRACKING_FLAG_HELP


def trust_args(sp: argparse.ArgumentParser) -> None:
    """``--space`` and ``--trust-stored-experiment``: may the stored experiment's code run here."""
    sp.add_argument("--space", default=None, metavar="NAME|PATH",
                    help="local experiment file (a path, or a name as search takes it) to check the stored one "
                         "against (default: the file the study was made from, if it is here)")
    sp.add_argument("--trust-stored-experiment", action="store_true",
                    help="run the stored experiment's commands, environment and user code even when no local "
                         "file matches (only for storages nobody else can write)")


def tracking_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--tracking", action="append", default=[], metavar="SPEC", help=TRACKING_FLAG_HELP)
    sp.add_argument("--tracking-optional", action="store_true",
                    help="a tracker whose package is missing or whose server does not answer is a warning and "
                         "the study runs without it (default: an error before the study starts)")


def ray_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ray-address", default=None, metavar="URL",
                    help="trial.executor ray: the cluster's dashboard (http://head:8265); default "
                         "trial.ray.address, else $RAY_ADDRESS")


def budget_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--budget", type=float, default=None, metavar="RUNS",
                    help="full-run equivalents the search and its confirmation may spend together (default: "
                         "study.budget; none)")


def storage_args(sp: argparse.ArgumentParser) -> None:
    """``--storage`` and ``--studies-dir``."""
    sp.add_argument("--storage", help="Optuna storage URL (default sqlite:///<studies-dir>/<study>.db); any "
                                      "SQLAlchemy URL, or redis://... (JournalStorage, needs redis)")
    sp.add_argument("--studies-dir", type=Path, default=None,
                    help=f"where studies and trial logs live (default ${ENV_STUDIES_DIR} or ./studies)")

