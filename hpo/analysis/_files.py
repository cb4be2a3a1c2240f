"""Reading a file that a user or a trial names: a regular file only, and never more than a size limit.

A path can name a FIFO (``open`` waits for a writer for ever), a device (``/dev/zero`` never ends), a directory,
or a symlink to any of them. :func:`open_regular` opens without blocking and refuses anything but a regular file
(a symlink to one is fine); :func:`read_bounded` then reads at most ``limit + 1`` bytes, so a file over the limit,
or one that grows while it is read, is refused without being held in memory. Every refusal is a
:class:`FileRefused` whose message is one line naming the file. It lives in the bottom layer so that every part of
the driver (experiment files, the CLI's own flags, the logs a trial writes) reads files the same way.
"""

from __future__ import annotations

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


def open_regular(path: str | Path, name: str) -> int:
    """A read-only descriptor of ``path`` (the caller closes it). ``name`` starts the error line (``--space x.yaml``).
    FileRefused unless it is a regular file; OSError (FileNotFoundError, ...) as ``os.open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO opens at once
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


def read_bounded(path: str | Path, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (see the module docstring)."""
    fd = open_regular(path, name)
    try:
        data = _read_upto(fd, limit + 1)
        size = max(len(data), os.fstat(fd).st_size)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(f"{name}: {size} bytes; at most {limit} are read")
    return data


def read_tail(path: str | Path, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a regular file (a log a trial may have replaced by a FIFO or a device)."""
    fd = open_regular(path, str(path))
    try:
        return _read_upto(fd, max_bytes, max(0, os.fstat(fd).st_size - max_bytes))
    finally:
        os.close(fd)


def check_regular(path: str | Path, name: str, limit: int | None = None) -> None:
    """For a file another library opens by name: FileRefused unless it is a regular file of at most ``limit``
    bytes; OSError when it cannot be opened."""
    fd = open_regular(path, name)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if limit is not None and size > limit:
        raise FileRefused(f"{name}: {size} bytes; at most {limit} are read")
