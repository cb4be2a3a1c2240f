"""The baseline runs a host keeps (``<studies>/.baselines/<key>/<seed>.json``) as files read like any untrusted file.

Every level below the studies directory is opened with ``O_NOFOLLOW`` relative to its parent's descriptor (an
``openat`` walk), so a ``.baselines`` or key directory that is a symlink is never followed, for reading or writing;
a record must be a regular file of at most :data:`MAX_KEPT_BYTES`. A write goes to an ``O_EXCL`` temporary file in
the key directory and is renamed over the record in one step; the temporary file is removed whatever fails (a
directory where the record should be, a full disk). What a record holds is checked by its reader
(:func:`hpo.study._confirm.cached_baseline`); :func:`file_digest` gives the digest a record keeps of the metrics file
it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_KEPT_BYTES = 1_000_000
MAX_DIGESTED_BYTES = 1 << 30  # a metrics file larger than this is not digested (its run is not kept)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class KeptRefused(OSError):
    """A kept file or directory that is not what the store writes; ``str(err)`` is one line."""


@contextlib.contextmanager
def _walk(root: Path, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """A descriptor of ``root/parts...``, each part opened without following a symlink (made when ``create``)."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]  # the studies directory: the user's path
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fds[-1])
            try:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            except OSError as err:
                if err.errno in (40, 20):  # ELOOP: a symlink; ENOTDIR: a file
                    raise KeptRefused(f"{root.joinpath(*parts[:parts.index(part) + 1])} is not a directory of "
                                      "the baseline store (a symlink or a file): not followed") from None
                raise
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def read_kept(studies_dir: Path, parts: tuple[str, ...], name: str) -> Any:
    """The JSON in ``studies_dir/parts.../name``; None when there is none; KeptRefused for anything that is not a
    regular file of at most :data:`MAX_KEPT_BYTES` holding JSON (NaN and infinities refused)."""
    try:
        with _walk(studies_dir, parts, create=False) as folder:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            except FileNotFoundError:
                return None
            except OSError as err:
                raise KeptRefused(f"{'/'.join(parts)}/{name}: not a regular file ({err.strerror})") from None
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise KeptRefused(f"{'/'.join(parts)}/{name}: not a regular file")
                data = f.read(MAX_KEPT_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_KEPT_BYTES:
        raise KeptRefused(f"{'/'.join(parts)}/{name}: over {MAX_KEPT_BYTES} bytes")

    def refuse(const: str) -> Any:
        raise ValueError(f"{const} is not a number a kept run holds")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise KeptRefused(f"{'/'.join(parts)}/{name}: not a kept run ({type(err).__name__})") from None


def write_kept(studies_dir: Path, parts: tuple[str, ...], name: str, record: dict[str, Any]) -> None:
    """Write ``record`` as ``studies_dir/parts.../name`` whole or not at all, leaving no temporary file; KeptRefused
    when a level is a symlink or a file, OSError when the disk refuses."""
    text = json.dumps(record, allow_nan=False).encode()
    with _walk(studies_dir, parts, create=True) as folder:
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise


def file_digest(path: Path) -> str | None:
    """The sha256 of a regular file (symlinks followed: the trial's own path), None when it is gone, not regular or
    over :data:`MAX_DIGESTED_BYTES`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DIGESTED_BYTES:
            return None
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
