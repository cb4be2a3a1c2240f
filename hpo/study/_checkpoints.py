"""Trial checkpoints on disk: kept while a trial can be resumed, then deleted, except the best K (issue 21).

A verl trial saves at its last step (fp32 weights plus Adam state: ~6-8 GB at 0.5B, ~100 GB at 7B), and a retry of
an interrupted trial continues from an earlier attempt's checkpoint, so a checkpoint is worth keeping only while its
trial is running or interrupted. Once a trial is finished (:func:`clean_after`), the ``checkpoints/`` directories
of the trial and of every attempt of its retry chain are deleted, unless ``trial.keep_checkpoints`` = K > 0 and the
trial is among the study's K best finished trials; a trial that falls out of the best K loses its checkpoints then.

Only directories inside trial directories the driver made (they hold its marker) are ever deleted, never through a
symbolic link. The size of each trial's checkpoints is recorded before deletion (user attr ``checkpoint_gb``;
``checkpoint_kept`` says whether they stay); :func:`disk_usage` sums what the study's trials hold now.

A checkpoint a trial wrote is read only through :func:`checkpoint_problem` and :func:`clone_tree`, which follow no
symbolic link below the directory the driver names (a trial may make any component of its ``checkpoints/`` a link
to a directory of its choosing) and refuse special files (a FIFO would hang the copy).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import stat
import threading
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.record import ATTR_RETRY_HISTORY, TRIAL_MARKER, is_failed, is_proxy, is_tie_run

CHECKPOINTS = "checkpoints"
COPY_CHUNK = 64 * 2**20


class CheckpointUnusable(Exception):
    """A checkpoint that cannot be used: gone, not a directory, or a symbolic link or special file in it or on the
    way to it; ``str(err)`` is one line naming the path."""


def _open_dir(name: str, dir_fd: int | None, shown: str, follow: bool = False) -> int:
    """An fd of the directory ``name`` (relative to ``dir_fd``), not through a symbolic link unless ``follow``."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    except FileNotFoundError:
        raise CheckpointUnusable(f"{shown} is gone") from None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a link to a directory gives ENOTDIR with O_DIRECTORY
            try:
                link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            raise CheckpointUnusable(f"{shown} is {'a symbolic link' if link else 'not a directory'}") from None
        raise CheckpointUnusable(f"{shown}: {err.strerror}") from None


def open_tree(root: Path, parts: Sequence[str]) -> int:
    """An fd of the directory ``root/parts[0]/parts[1]/...``: ``root`` is the driver's, and no component below it
    may be a symbolic link (CheckpointUnusable). The caller closes it."""
    fd = _open_dir(str(root), None, str(root), follow=True)  # the user may keep the studies dir behind a link
    shown = root
    for part in parts:
        shown = shown / part
        try:
            fd, old = _open_dir(part, fd, str(shown)), fd
        except CheckpointUnusable:
            os.close(fd)
            raise
        os.close(old)
    return fd


def checkpoint_problem(root: Path, parts: Sequence[str]) -> str | None:
    """Why ``root/parts...`` is no usable checkpoint directory (gone, a symbolic link on the way), or None. Cheap:
    the components only (:func:`clone_tree` checks every file)."""
    try:
        os.close(open_tree(root, parts))
    except CheckpointUnusable as err:
        return str(err)
    return None


def clone_tree(root: Path, parts: Sequence[str], dst: Path, link: bool) -> None:
    """``dst`` as a copy of the directory ``root/parts...`` (:func:`open_tree`): each file hard-linked when
    ``link`` (else, or where the filesystem cannot, copied: a reflink where it makes one), written under a
    temporary name and renamed, so a half-made copy is never used. No symbolic link is followed and none, nor a
    special file, is copied: CheckpointUnusable (nothing left at ``dst``)."""
    fd = open_tree(root, parts)
    tmp = dst.parent / f".{dst.name}.tmp{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        _clone_dir(fd, tmp, link, root.joinpath(*parts))
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def _clone_dir(fd: int, dst: Path, link: bool, shown: Path) -> None:
    dst.mkdir()
    with os.scandir(fd) as it:
        names = [e.name for e in it]
    for name in names:
        where = shown / name
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise CheckpointUnusable(f"{where} is a symbolic link")
        if stat.S_ISDIR(mode):
            sub = _open_dir(name, fd, str(where))
            try:
                _clone_dir(sub, dst / name, link, where)
            finally:
                os.close(sub)
        elif stat.S_ISREG(mode):
            _clone_file(fd, name, dst / name, link, where)
        else:
            raise CheckpointUnusable(f"{where} is not a regular file")


def _clone_file(fd: int, name: str, dst: Path, link: bool, shown: Path) -> None:
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as err:
        raise CheckpointUnusable(f"{shown}: {err.strerror}") from None
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):  # swapped since it was listed
            raise CheckpointUnusable(f"{shown} is not a regular file")
        if link:
            try:
                os.link(name, dst, src_dir_fd=fd, follow_symlinks=False)
                got = os.lstat(dst)
                if (got.st_ino, got.st_dev) == (st.st_ino, st.st_dev):
                    return
                dst.unlink()  # the name was swapped under us: copy what was opened
            except OSError:
                pass
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
        try:
            _copy_bytes(src, out)
        finally:
            os.close(out)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(src)


def _copy_bytes(src: int, out: int) -> None:
    """All of ``src`` into ``out``: copy_file_range (a reflink on btrfs / XFS), else read and write."""
    try:
        while os.copy_file_range(src, out, COPY_CHUNK):
            pass
        return
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
            raise
    os.lseek(src, 0, os.SEEK_SET)
    os.lseek(out, 0, os.SEEK_SET)
    os.ftruncate(out, 0)
    while block := os.read(src, COPY_CHUNK):
        view = memoryview(block)
        while view:
            view = view[os.write(out, view):]


def dir_bytes(path: Path) -> int:
    """Bytes allocated below ``path`` (symbolic links not followed); 0 when it is missing."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def chain(t: FrozenTrial) -> list[int]:
    """The trial and every earlier attempt it retries (their checkpoints are where a retry resumes from)."""
    history = t.system_attrs.get(ATTR_RETRY_HISTORY)
    earlier = [int(n) for n in history if isinstance(n, int)] if isinstance(history, list) else []
    return [*earlier, t.number]


def checkpoint_dirs(trials_dir: Path, numbers: Iterable[int], shared: Path | None = None) -> list[Path]:
    """``<trials_dir>/<n>/checkpoints`` of the given trials that exist in a driver-made trial directory; with
    ``shared`` (a Ray-job study's ``trial.ray.shared_dir/<study>``) also ``<shared>/<n>/checkpoints`` where the
    driver made ``<shared>/<n>`` (its marker; the trial directory's ``checkpoints`` is then a link, never followed)."""
    out = []
    for n in numbers:
        for root in (trials_dir, shared):
            if root is None:
                continue
            trial_dir = root / str(n)
            ckpt = trial_dir / CHECKPOINTS
            if (trial_dir / TRIAL_MARKER).is_file() and not trial_dir.is_symlink() and ckpt.is_dir() \
                    and not ckpt.is_symlink():
                out.append(ckpt)
    return out


def clean_after(study: optuna.Study, trial: FrozenTrial, value: float | None, trials_dir: Path, keep: int,
                finished: Iterable[FrozenTrial], shared: Path | None = None, held: Collection[int] = (),
                released: Iterable[FrozenTrial] = ()) -> tuple[float, bool, float]:
    """``trial`` has just finished with ``value`` (None: no finite value) and is about to be told: delete the
    checkpoints of its chain unless it is among the ``keep`` best of itself and ``finished`` (the study's other
    finished search trials), and those of a trial it pushed out of the best ``keep``. Returns (GB its checkpoints
    held, whether they are kept, GB freed in all). ``shared``: see :func:`checkpoint_dirs`. A proxy search's
    (``study.fidelity.proxy``) proxy and target runs are ranked apart, the best ``keep`` of each: a proxy value is not
    a target value. ``held``: trial numbers whose checkpoints stay whatever ``keep`` says (a proxy search's promoted
    runs the race may still continue: :func:`hpo.study._continuation.held_checkpoints`); ``released``: trials whose
    checkpoints go now unless they are among the best ``keep`` (promoted runs the race will not continue)."""
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    proxy = is_proxy(trial)
    scored = [(t.values[0], t) for t in finished if t.number != trial.number and t.state == TrialState.COMPLETE
              and t.values and math.isfinite(t.values[0]) and not is_failed(t) and is_proxy(t) == proxy
              and not is_tie_run(t)]
    if value is not None and math.isfinite(value):
        scored.append((value, trial))
    scored.sort(key=lambda vt: -vt[0] if maximize else vt[0])
    best = [t for _, t in scored[:keep]] if keep > 0 else []
    kept_numbers = {n for t in best for n in chain(t)}
    mine = checkpoint_dirs(trials_dir, chain(trial), shared)
    size = sum(dir_bytes(d) for d in mine)
    kept = trial.number in {t.number for t in best} or trial.number in held
    stay = kept_numbers | set(held)
    drop = [] if kept else mine
    if keep > 0:  # a trial that fell out of the best K loses its checkpoints now
        drop += [d for _, t in scored if t.number != trial.number for d in checkpoint_dirs(trials_dir, chain(t), shared)
                 if int(d.parent.name) not in stay]
    drop += [d for t in released if t.number != trial.number for d in checkpoint_dirs(trials_dir, chain(t), shared)
             if int(d.parent.name) not in stay and d not in drop]
    freed = 0
    for d in drop:
        freed += dir_bytes(d)
        shutil.rmtree(d, ignore_errors=True)
    return size / 2**30, kept, freed / 2**30


def disk_usage(trials_dir: Path) -> float:
    """GB the study's trial directories hold now (checkpoints, logs, metrics)."""
    return dir_bytes(trials_dir) / 2**30
