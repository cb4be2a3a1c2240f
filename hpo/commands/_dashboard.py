"""``verl-hpo dashboard``: write a study's dashboard page (one self-contained HTML file)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpo.analysis import OutputRefused, check_output_path
from hpo.commands._args import storage_args
from hpo.commands._base import Invocation, fail, open_existing


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("--study", required=True)
    d.add_argument("--out", type=Path, help="default <studies-dir>/<study>/dashboard.html; any path of yours that "
                                            "is new or a regular file (it is replaced)")
    storage_args(d)


def run(args: argparse.Namespace, inv: Invocation) -> int:
    from hpo.reporting import dashboard_command, dashboard_path
    from hpo.storages import check_study_name

    # the page is written beside its path and renamed over it: whatever is there (a FIFO, a link, /dev/full) would
    # be replaced, so only a new path or a regular file is taken; checked before the storage is opened
    out = args.out if args.out is not None else dashboard_path(inv.studies_dir, check_study_name(args.study))
    flag = "--out" if args.out is not None else "dashboard page"
    try:
        check_output_path(out, flag)
    except OutputRefused as err:
        return fail(str(err))
    refused = open_existing(args, inv)
    if refused is not None:
        return refused
    try:
        return dashboard_command(args.study, inv.storage_url, inv.studies_dir, out)
    except OutputRefused as err:  # something not a regular file put there while the page was built
        return fail(str(err))
    except OSError as err:  # making the page's directory or writing it (a full disk): not the storage's fault
        if not _is_about(err, out):
            raise
        return fail(f"{flag} {out}: cannot write {err.filename} ({err.strerror or err})", 1)


def _is_about(err: OSError, out: Path) -> bool:
    """Whether ``err`` is about the page: its file, a file beside it, or a directory above it."""
    if not isinstance(err.filename, str):
        return False
    where = Path(err.filename)
    return where.parent == out.parent or where in (out.parent, *out.parent.parents)
