"""Reading a file that a user or a trial names: a regular file only, and never more than a size limit.

A path can name a FIFO (``open`` waits for a writer for ever), a device (``/dev/zero`` never ends), a directory,
or a symlink to any of them. :func:`open_regular` opens without blocking and refuses anything but a regular file
(a symlink to one is fine, unless ``follow=False``); :func:`read_bounded` then reads at most ``limit + 1`` bytes,
so a file over the limit, or one that grows while it is read, is refused without being held in memory. Every
refusal is a :class:`FileRefused` whose message is one line naming the file.

A file the user names may be a link to their real file (``follow=True``, the default). A file under a trial's
directory is someone else's output: :func:`read_trial_file` reads it with ``follow=False`` (the file itself must not
be a symbolic link; a FIFO, a device or a link there is refused, never opened through). Nothing here blocks: a
FIFO is opened with ``O_NONBLOCK`` and refused, and only regular files are ever read.

It lives in the bottom layer so that every part of the driver (experiment files, the CLI's own flags, the logs a
trial writes) reads files the same way.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 1 << 20  # an experiment file is a few KB; a larger one is refused before it is parsed
READ_CHUNK_BYTES = 1 << 16

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class FileRefused(ValueError):
    """A named file that is not read: not a regular file, or over its size limit. ``str(err)`` is one line."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | Path, name: str, follow: bool = True) -> int:
    """A read-only descriptor of ``path`` (the caller closes it). ``name`` starts the error line (``--space x.yaml``).
    FileRefused unless it is a regular file (``follow=False``: nor a symbolic link); OSError (FileNotFoundError,
    ...) as ``os.open`` raises it. A special file is refused from its ``stat`` before it is opened (opening some
    devices does something)."""
    try:
        mode = os.stat(path, follow_symlinks=follow).st_mode
    except OSError:
        mode = stat.S_IFREG  # let os.open raise it (or find the file made meanwhile)
    if stat.S_ISLNK(mode):
        raise FileRefused(f"{name}: is a symbolic link, not followed")
    if not stat.S_ISREG(mode):
        raise FileRefused(f"{name}: is {_kind(mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)  # a FIFO opens at once
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if not follow and err.errno == errno.ELOOP:  # swapped for a link since the stat
            raise FileRefused(f"{name}: is a symbolic link, not followed") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"{name}: is {_kind(mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_upto(fd: int, n: int, offset: int = 0) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = os.pread(fd, min(READ_CHUNK_BYTES, n - got), offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_bounded(path: str | Path, name: str, limit: int = MAX_FILE_BYTES, follow: bool = True) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (see the module docstring)."""
    fd = open_regular(path, name, follow)
    try:
        size = os.fstat(fd).st_size
        data = _read_upto(fd, limit + 1) if size <= limit else None  # too large: not read at all
    finally:
        os.close(fd)
    if data is None or len(data) > limit:  # or it grew while it was read
        raise FileRefused(f"{name}: {max(size, len(data or b''))} bytes; at most {limit} are read")
    return data


def read_trial_file(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A file under a trial's directory (or another file a trial, a previous run or another host wrote): the
    whole of it when it is a regular file, not a symbolic link, of at most ``limit`` bytes; else FileRefused
    naming ``path``; OSError (FileNotFoundError, ...) when it cannot be opened."""
    return read_bounded(path, str(path), limit, follow=False)


def read_tail(path: str | Path, max_bytes: int, follow: bool = True) -> bytes:
    """The last ``max_bytes`` of a regular file (a log a trial may have replaced by a FIFO or a device)."""
    fd = open_regular(path, str(path), follow)
    try:
        return _read_upto(fd, max_bytes, max(0, os.fstat(fd).st_size - max_bytes))
    finally:
        os.close(fd)


def check_regular(path: str | Path, name: str, limit: int | None = None, follow: bool = True) -> None:
    """For a file another library opens by name: FileRefused unless it is a regular file of at most ``limit``
    bytes; OSError when it cannot be opened."""
    fd = open_regular(path, name, follow)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if limit is not None and size > limit:
        raise FileRefused(f"{name}: {size} bytes; at most {limit} are read")
