"""Where the driver writes: the output paths a user names, checked before anything is written there, and the names the
tool itself uses directly under the studies directory, which no study may take.

A page or report is written beside its target and renamed over it (a reader never sees half a file), and a rename
replaces whatever has the name: a FIFO, a symbolic link, a device node (``--out /dev/full`` as root replaced the
device). :func:`check_output_path` therefore refuses a path that exists and is not a regular file (a link is refused
whatever it points to: the link is what a rename would replace). :func:`check_dir_creatable` and
:func:`make_output_dir` say, in one line naming the directory, why the directory a file goes in cannot be made.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["ARTIFACTS_DIR", "BASELINES_DIR", "OutputRefused", "REHEARSALS_DIR", "STORAGE_SUFFIXES",
           "STUDIES_DIR_NAMES", "check_dir_creatable", "check_output_path", "file_kind", "make_output_dir",
           "reserved_study_name"]

# What the tool keeps directly under the studies directory besides each study's ``<name>/`` and ``<name>.db``:
REHEARSALS_DIR = "rehearsals"  # <studies>/rehearsals/<experiment>/ (verl-hpo rehearse; emptied by the next one)
BASELINES_DIR = ".baselines"  # <studies>/.baselines/<key>/<seed>.json (baseline runs a host keeps)
ARTIFACTS_DIR = "mlflow-artifacts"  # <studies>/mlflow-artifacts/ (MLflow's artifacts on a database backend)
STUDIES_DIR_NAMES = frozenset({REHEARSALS_DIR, BASELINES_DIR, ARTIFACTS_DIR})
# <study>.db and its sidecars (the driver's lock, SQLite's journal files): a study named ``x.db`` would make its
# directory where study ``x`` keeps its database
STORAGE_SUFFIXES = (".db", ".db.lock", ".db-journal", ".db-wal", ".db-shm")


class OutputRefused(ValueError):
    """One line: the flag, the path and why nothing is written there."""


def reserved_study_name(name: str) -> str | None:
    """Why ``name`` cannot be a study (its directory or database would be one of the tool's own entries of the
    studies directory), else None. Compared case-insensitively: on a case-insensitive filesystem ``Rehearsals``
    is ``rehearsals``."""
    low = name.casefold()
    if low in STUDIES_DIR_NAMES:
        return f"{name!r} is verl-hpo's own directory in the studies directory"
    suffix = next((s for s in STORAGE_SUFFIXES if low.endswith(s)), None)
    if suffix is not None:
        return f"a name ending in {suffix!r} is verl-hpo's own name for a study's database file in the studies " \
            "directory"
    return None


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a character device``, ... for an ``st_mode``."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def check_output_path(path: Path, flag: str) -> Path:
    """``path`` when nothing is there or a regular file is (which the write replaces); OutputRefused when it is
    anything else, a symbolic link included, or when a directory above it cannot be made."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        check_dir_creatable(path.parent, flag, shown=path)
        return path
    except NotADirectoryError:
        check_dir_creatable(path.parent, flag, shown=path)
        raise OutputRefused(f"{flag} {path}: a directory above it is not a directory") from None
    except OSError as err:
        raise OutputRefused(f"{flag} {path}: cannot be checked ({err.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        check_dir_creatable(path.parent, flag, shown=path)
        return path
    kind = file_kind(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        kind += f" (to {os.readlink(path)})"
    hint = "give the page's file name (e.g. report.html)" if stat.S_ISDIR(st.st_mode) else \
        "name a new file or a regular one (it is replaced)"
    raise OutputRefused(f"{flag} {path}: is {kind}, not a regular file; {hint}")


def check_dir_creatable(directory: Path, flag: str, *, shown: str | Path | None = None, writable: bool = True
                        ) -> None:
    """OutputRefused unless ``directory`` is a directory or can be made one: its nearest existing ancestor is a
    directory (not a regular file, not a FIFO) and, with ``writable``, files can be made in it. Nothing is
    created. ``shown`` is the path the user typed (default ``directory``)."""
    at = directory
    while True:
        try:
            st = os.stat(at)
            break
        except (FileNotFoundError, NotADirectoryError):
            if at == at.parent:
                return
            at = at.parent
        except OSError as err:
            raise OutputRefused(f"{flag} {shown or directory}: {at} cannot be checked ({err.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputRefused(f"{flag} {shown or directory}: {at} is {file_kind(st.st_mode)}, not a directory")
    if writable and not os.access(at, os.W_OK | os.X_OK):
        what = "cannot create files in" if at == directory else f"cannot create {directory} in"
        raise OutputRefused(f"{flag} {shown or directory}: {what} {at} (permission denied or read-only)")


def make_output_dir(directory: Path, flag: str, *, shown: str | Path | None = None) -> None:
    """Make ``directory`` and its parents (nothing when it exists); OutputRefused naming it and the OS error when
    that fails."""
    check_dir_creatable(directory, flag, shown=shown)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputRefused(f"{flag} {shown or directory}: cannot create directory {directory} "
                            f"({err.strerror or err})") from None
