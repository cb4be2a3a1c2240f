"""What every subcommand shares: :class:`Subcommand` (one row of the CLI's dispatch table), :class:`Invocation` (the
studies directory and storage of this run, which the error lines name), :func:`fail` (the one ``error: ...`` line),
the command line that goes on with a study (:func:`follow_up`), and the exit codes of a stop by a signal."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from hpo.analysis import OutputRefused, check_dir_creatable, make_output_dir
from hpo.experiment import SPACES_DIR, SpaceError

EXIT_SIGNAL: dict[int, int] = {int(signal.SIGINT): 130, int(signal.SIGTERM): 143, int(signal.SIGHUP): 129}
ENV_STUDIES_DIR = "VERL_HPO_STUDIES_DIR"
ENV_SPACES_DIR = "VERL_HPO_SPACES_DIR"
MAX_ERROR_CHARS = 2000


@dataclass
class Invocation:
    """This run of ``verl-hpo``: where studies live, and the storage URL once the subcommand knows it (``""`` until
    then); the CLI's error lines mask that URL's password and name the storage."""

    studies_dir: Path
    storage_url: str = ""


@dataclass(frozen=True)
class Subcommand:
    """A subcommand: its name and one-line help (``verl-hpo --help``), and the module of :mod:`hpo.commands` that
    holds its flags (``add_arguments(parser)``) and what it runs (``run(args, inv)``, the exit code). The module is
    imported when the subcommand is parsed: ``verl-hpo --help`` or a refused ``best`` loads no trainer backend, no
    study loop and no Optuna that it does not use."""

    name: str
    help: str
    module: str  # e.g. "_search": hpo.commands._search

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self._module().add_arguments(parser)

    def run(self, args: argparse.Namespace, inv: Invocation) -> int:
        code: int = self._module().run(args, inv)
        return code

    def _module(self) -> ModuleType:
        return importlib.import_module(f"hpo.commands.{self.module}")


def default_studies_dir(arg: Path | None = None) -> Path:
    """``--studies-dir``, else ``$VERL_HPO_STUDIES_DIR``, else ``./studies``."""
    return arg if arg is not None else Path(os.environ.get(ENV_STUDIES_DIR, "studies"))


def spaces_dir() -> Path:
    """Where a bare space name is looked up first: ``$VERL_HPO_SPACES_DIR``, else ``./search_spaces``; a name not
    there is then looked up among the shipped ones (:func:`hpo.experiment._space.resolve_space_path`)."""
    return Path(os.environ.get(ENV_SPACES_DIR, str(SPACES_DIR)))


def _studies_dir_flag(path: Path) -> str:
    return "--studies-dir" if os.environ.get(ENV_STUDIES_DIR) is None or path != default_studies_dir() \
        else f"${ENV_STUDIES_DIR}"


def check_studies_dir(path: Path) -> None:
    """SpaceError (exit 2, one line naming it) when the studies directory is, or would have to be made under,
    something that is not a directory (a regular file): every subcommand, before any storage is opened."""
    try:
        check_dir_creatable(path, _studies_dir_flag(path), writable=False)
    except OutputRefused as err:
        raise SpaceError(str(err)) from None


def make_studies_dir(path: Path) -> None:
    """Make the studies directory (and its parents); SpaceError naming the directory and the OS error when that
    fails (a read-only directory, a path under a regular file), not a storage error."""
    try:
        make_output_dir(path, _studies_dir_flag(path))
    except OutputRefused as err:
        raise SpaceError(str(err)) from None


def follow_up(cmd: str, study_name: str, storage_url: str, studies_dir: Path) -> str:
    """A complete command line to go on with this study: ``--studies-dir`` unless it is the default, ``--storage``
    (its password masked) unless it is the study's default SQLite file there (issue 43: a hint that finds nothing)."""
    from hpo.storages import default_storage_url, mask_url

    line = f"verl-hpo {cmd} --study {study_name}"
    if studies_dir.resolve() != default_studies_dir().resolve():
        line += f" --studies-dir {shlex.quote(str(studies_dir.resolve()))}"  # works from any directory
    if storage_url and storage_url != default_storage_url(studies_dir, study_name):
        line += f" --storage {shlex.quote(mask_url(storage_url))}"
    return line


def fail(msg: str, code: int = 2) -> int:
    """Print the one ``error: ...`` line (a long one cut short) and return ``code``."""
    if len(msg) > MAX_ERROR_CHARS:  # a value echoed from hostile input: the line stays readable
        msg = f"{msg[:MAX_ERROR_CHARS]}... ({len(msg)} characters)"
    print(f"error: {msg}", file=sys.stderr)
    return code


def check_numbers(args: argparse.Namespace) -> int | None:
    """``--n-trials``, ``--top``, ``--seeds`` and ``--budget`` of any subcommand, checked before any study exists:
    the exit code of the first bad one, else None."""
    for flag, n in (("--n-trials", getattr(args, "n_trials", None)), ("--top", getattr(args, "top", None)),
                    ("--seeds", getattr(args, "seeds", None))):
        if n is not None and n <= 0:
            return fail(f"{flag} {n}: must be positive")
    budget = getattr(args, "budget", None)
    if budget is not None and not (math.isfinite(budget) and budget >= 1):
        return fail(f"--budget {budget:g}: must be a finite number of full-run equivalents, at least 1 (one "
                    "trial's full length)")
    return None


def open_existing(args: argparse.Namespace, inv: Invocation) -> int | None:
    """The storage of the existing study ``--study`` into ``inv`` (checked): the exit code when its SQLite file is
    not there, else None."""
    from hpo.storages import check_storage_url, check_study_name, default_storage_url, sqlite_path

    check_study_name(args.study)
    inv.storage_url = args.storage or default_storage_url(inv.studies_dir, args.study)
    check_storage_url(inv.storage_url)
    db = sqlite_path(inv.storage_url)
    if db is not None and not db.is_file():
        return fail(f"no study {args.study!r}: {db} does not exist (start one with verl-hpo search)")
    return None
