"""``verl-hpo dashboard``: write a study's dashboard page (one self-contained HTML file)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpo.commands._args import storage_args
from hpo.commands._base import Command, Invocation, fail, open_existing


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("--study", required=True)
    d.add_argument("--out", type=Path, help="default <studies-dir>/<study>/dashboard.html; any path of yours")
    storage_args(d)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    refused = open_existing(args, inv)
    if refused is not None:
        return refused
    from hpo.reporting._dashboard import dashboard_command

    if args.out is not None and args.out.is_dir():  # the user's own path: anywhere they can write
        return fail(f"--out {args.out}: is a directory; give the page's file name (e.g. report.html)")
    return dashboard_command(args.study, inv.storage_url, inv.studies_dir, args.out)


DASHBOARD = Command("dashboard", "write <studies-dir>/<study>/dashboard.html (one self-contained page)",
                    add_arguments, run)
