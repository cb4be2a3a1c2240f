"""``verl-hpo search | resume | worker | confirm | validate | rehearse | dashboard | track | best``.

Exit codes: 0 done; 2 bad input (one ``error: ...`` line on stderr, no study created or touched);
1 runtime error; 130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP (running trials queued for ``resume``;
a second signal forces the exit at once, and a signal that arrives once the study is done changes nothing).

Untrusted input: study names are checked (:func:`hpo.storages._storage.check_study_name`), files are written only
under the studies directory, storage passwords are masked wherever a URL is shown, and a stored experiment
that runs code is run only when it matches a local file or the user says so (:mod:`hpo.experiment._trust`).

Here: the parser and the dispatch table; each subcommand (its flags and what it runs) is a module of
:mod:`hpo.commands`, and :func:`main` turns the errors any of them may raise into the exit codes above.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from hpo.commands import (
    BEST,
    CONFIRM,
    DASHBOARD,
    EXIT_SIGNAL,
    REHEARSE,
    RESUME,
    SEARCH,
    TRACK,
    VALIDATE,
    WORKER,
    Invocation,
    Subcommand,
    check_numbers,
    check_studies_dir,
    default_studies_dir,
    fail,
    follow_up,
)
from hpo.experiment import SpaceError

__all__ = ["COMMANDS", "EXIT_SIGNAL", "build_parser", "follow_up", "main"]

# the dispatch table, in the order of ``verl-hpo --help``
COMMANDS: dict[str, Subcommand] = {c.name: c for c in (SEARCH, RESUME, WORKER, CONFIRM, VALIDATE, REHEARSE,
                                                        DASHBOARD, TRACK, BEST)}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + message)
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``verl-hpo``: every subcommand with its help; with ``only`` (the subcommand this run names), the
    flags of that one alone (each subcommand's module is imported to add its flags: the others are not loaded)."""
    p = _Parser(prog="verl-hpo", description="Hyperparameter search over RL post-training runs of LLMs (Optuna).")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for command in COMMANDS.values():
        parser = sub.add_parser(command.name, help=command.help)
        if only is None or only == command.name:
            command.add_arguments(parser)
    return p


def _named(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` names: its first word that is not a flag (``verl-hpo`` itself takes only ``-h``)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_named(argv)).parse_args(argv)
    inv = Invocation(default_studies_dir(getattr(args, "studies_dir", None)), getattr(args, "storage", None) or "")
    try:
        refused = check_numbers(args)  # before any study exists
        if refused is not None:
            return refused
        if hasattr(args, "studies_dir"):  # a regular file named as the studies directory: not the storage's fault
            check_studies_dir(inv.studies_dir)
        return COMMANDS[args.cmd].run(args, inv)
    except SpaceError as err:
        if not inv.storage_url:
            return fail(str(err))
        from hpo.storages import scrub

        return fail(scrub(str(err), inv.storage_url))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        code = _runtime_error(err, inv)
        if code is None:
            raise
        return code


def _runtime_error(err: Exception, inv: Invocation) -> int | None:
    """A storage that cannot be used (past ``study.storage_retry_s``) or a Ray cluster that refuses the job: one
    line, exit 1; None for anything else (raised again). Their modules are imported here, once an error is there: a
    run that never opened a storage or a cluster does not load them."""
    from hpo.storages import STORAGE_ERRORS, storage_error_line

    if isinstance(err, STORAGE_ERRORS):  # StorageUnavailable, StorageInternalError, ...
        return fail(storage_error_line(err, inv.storage_url), 1)
    if isinstance(err, RuntimeError):
        from hpo.execution.ray_jobs import RayClusterError

        if isinstance(err, RayClusterError):
            return fail(str(err), 1)
    return None


if __name__ == "__main__":
    sys.exit(main())
