"""The baseline runs a host keeps (``<studies>/.baselines/<key>/<seed>.json``) as files read like any untrusted file,
and what a kept record must hold and point at to be reused (:func:`checked_record`, :func:`kept_metrics`,
:func:`stored_run_problem`; :func:`hpo.study._confirm.cached_baseline` adds what needs the experiment).

Every level below the studies directory is opened with ``O_NOFOLLOW`` relative to its parent's descriptor (an
``openat`` walk), so a ``.baselines`` or key directory that is a symlink is never followed, for reading or writing;
a record must be a regular file of at most :data:`MAX_KEPT_BYTES`. A write goes to an ``O_EXCL`` temporary file in
the key directory and is renamed over the record in one step; the temporary file is removed whatever fails (a
directory where the record should be, a full disk). What a record holds is checked by its reader
(:func:`checked_record`). :func:`read_study_file` reads a file of a study's trial the same way (every level from the
studies directory down opened without following a link, a regular file, a size cap).

A record names the study and trial it came from and its metrics file relative to that trial's directory; the file is
reused only from there (:func:`kept_metrics`): ``<studies>/<study>/trials/<n>/<file>`` of the studies directory in use,
read as above, with the sha256 kept, in a directory holding the driver's marker for that study and trial. A file
anywhere else on the host, a link inside the trial directory, or a trial directory that is a link is never read (issue
53 item 10: a forged record naming a flat-0 curve elsewhere, with its true sha256, made the search "pay" three times
what it did). Where the named study is in the storage of the study being confirmed (a shared PostgreSQL, Redis or
SQLite URL), its trial must also be a finished baseline run on that seed with that value, not itself reused
(:func:`stored_run_problem`). By default each study has its own SQLite file, so the named study is usually not there:
that check is then skipped (opening another study's database would be reading one more file anyone could replace),
and the trial's own files vouch for the run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from optuna.storages import BaseStorage
from optuna.trial import TrialState

from hpo.record._attrs import ATTR_CONFIRM_SEED, TRIAL_MARKER, is_baseline

MAX_KEPT_BYTES = 1_000_000
MAX_METRICS_BYTES = 256 << 20  # a metrics file larger than this is not read (its run is not kept, nor reused)
MAX_MARKER_BYTES = 64_000
KEPT_ATTRS = ("last_step", "total_steps", "test_value", "test_metric", "stop_reason", "diagnosis")
_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a study's directory (hpo.storages: check_study_name)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class KeptRefused(OSError):
    """A kept file or directory that is not what the store writes; ``str(err)`` is one line."""


@contextlib.contextmanager
def _walk(root: Path, parts: tuple[str, ...], create: bool, where: str = " of the baseline store") -> Iterator[int]:
    """A descriptor of ``root/parts...``, each part opened without following a symlink (made when ``create``)."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]  # the studies directory: the user's path
    try:
        for i, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fds[-1])
            try:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink; a file
                    raise KeptRefused(f"{root.joinpath(*parts[:i + 1])} is not a directory{where} "
                                      "(a symlink or a file): not followed") from None
                raise
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def _read(root: Path, parts: tuple[str, ...], name: str, cap: int, where: str, shown: str) -> bytes | None:
    """The bytes of ``root/parts.../name`` (``shown`` in errors), None when a level or the file is missing;
    KeptRefused for a symlink at any level, anything not a regular file, over ``cap`` bytes."""
    for part in (*parts, name):  # one name per level: never a path, never up
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise KeptRefused(f"{shown}: {part!r} is not a file name")
    try:
        with _walk(root, parts, create=False, where=where) as folder:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            except FileNotFoundError:
                return None
            except OSError as err:
                why = "a symlink: not followed" if err.errno == errno.ELOOP else f"not a regular file ({err.strerror})"
                raise KeptRefused(f"{shown}: {why}") from None
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise KeptRefused(f"{shown}: not a regular file")
                if info.st_size > cap:
                    raise KeptRefused(f"{shown}: over {cap} bytes")
                data = f.read(cap + 1)
    except FileNotFoundError:
        return None
    if len(data) > cap:
        raise KeptRefused(f"{shown}: over {cap} bytes")
    return data


def read_study_file(studies_dir: Path, parts: tuple[str, ...], name: str, cap: int = MAX_METRICS_BYTES
                    ) -> bytes | None:
    """The bytes of ``studies_dir/parts.../name`` (a file of a study's trial: ``(study, "trials", number)``), no
    level followed if it is a symlink; None when it is gone; KeptRefused (one line naming the path) for a symlink, a
    file where a directory goes, a FIFO or anything else not a regular file, or over ``cap`` bytes."""
    return _read(studies_dir, parts, name, cap, "", str(studies_dir.joinpath(*parts, name)))


def read_kept(studies_dir: Path, parts: tuple[str, ...], name: str) -> Any:
    """The JSON in ``studies_dir/parts.../name``; None when there is none; KeptRefused for anything that is not a
    regular file of at most :data:`MAX_KEPT_BYTES` holding JSON (NaN and infinities refused)."""
    shown = f"{'/'.join(parts)}/{name}"
    data = _read(studies_dir, parts, name, MAX_KEPT_BYTES, " of the baseline store", shown)
    if data is None:
        return None

    def refuse(const: str) -> Any:
        raise ValueError(f"{const} is not a number a kept run holds")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise KeptRefused(f"{shown}: not a kept run ({type(err).__name__})") from None


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


# ----------------------------------------------------------------------------- what a record holds and names
def _number(x: Any) -> float | None:
    """A finite float from a JSON number (never a boolean, never one too large for a float)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        v = float(x)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def checked_record(raw: Any, key: str, seed: int) -> tuple[dict[str, Any] | None, str]:
    """A kept record's fields, each type- and range-checked, or None and why not."""
    if not isinstance(raw, dict):
        return None, f"a JSON {type(raw).__name__}, not a kept run"
    value, trial, study = _number(raw.get("value")), raw.get("trial"), raw.get("study")
    if value is None:
        return None, f"value {str(raw.get('value'))[:40]!r} is not a finite number"
    if isinstance(trial, bool) or not isinstance(trial, int) or not 0 <= trial < 2**31:
        return None, f"trial {str(trial)[:40]!r} is not a trial number"
    if not isinstance(study, str) or not _STUDY_NAME.fullmatch(study):
        return None, f"study {str(study)[:40]!r} is not a study name"
    if raw.get("key") != key or raw.get("seed") != seed:
        return None, "kept for another experiment or seed"
    inter_raw = raw.get("intermediate_values")
    if not isinstance(inter_raw, dict) or len(inter_raw) > 100_000:
        return None, "intermediate values are not a mapping of steps"
    inter: dict[int, float] = {}
    for k, v in inter_raw.items():
        x = _number(v)
        if not (isinstance(k, str) and k.isdigit() and len(k) < 10) or x is None:
            return None, f"intermediate value {str(k)[:20]!r}: {str(v)[:20]!r} is not a step and a finite number"
        inter[int(k)] = x
    metrics, digest = raw.get("metrics"), raw.get("metrics_sha256")
    if not isinstance(metrics, str) or not isinstance(digest, str) or len(digest) != 64:
        return None, "no digest of the metrics file it came from (kept by an older verl-hpo)"
    attrs = {k: v for k, v in dict(raw.get("user_attrs") or {}).items()
             if k in KEPT_ATTRS and isinstance(v, (int, float, str)) and not isinstance(v, bool)
             and (not isinstance(v, float) or math.isfinite(v)) and (not isinstance(v, str) or len(v) <= 4000)} \
        if isinstance(raw.get("user_attrs"), dict) else {}
    return {"value": value, "intermediate_values": inter, "user_attrs": attrs, "study": study, "trial": trial,
            "metrics": metrics, "metrics_sha256": digest}, ""


def trial_parts(study: str, number: int) -> tuple[str, str, str]:
    """A study's trial directory under the studies directory (the driver's layout: ``<study>/trials/<n>``)."""
    return (study, "trials", str(int(number)))


def metrics_inside(studies_dir: Path, rec: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """The checked record's metrics file as names below its trial directory, or () and why it is not in it. A record
    names it relative to that directory; one kept before, by an absolute path that must lie in that directory of
    this studies directory."""
    trial_dir = trial_parts(rec["study"], rec["trial"])
    named = PurePosixPath(rec["metrics"])
    inside: tuple[str, ...] = named.parts if not named.is_absolute() else ()
    for root in (studies_dir.absolute(), studies_dir.resolve()) if named.is_absolute() else ():
        if named.is_relative_to(root.joinpath(*trial_dir)):
            inside = named.relative_to(root.joinpath(*trial_dir)).parts
            break
    if not inside or any(p in ("", ".", "..") for p in inside):
        return (), f"its metrics file {rec['metrics'][:300]} is not in study {rec['study']}'s trial {rec['trial']} " \
                   "directory"
    return inside, ""


def kept_metrics(studies_dir: Path, rec: dict[str, Any], inside: tuple[str, ...]) -> tuple[bytes | None, str]:
    """The bytes of the checked record's metrics file (``inside`` its trial directory: :func:`metrics_inside`), read
    without following a link at any level, when they are the ones kept (their sha256) in a directory the driver made
    for that study's trial (its marker); else None and why."""
    parts = (*trial_parts(rec["study"], rec["trial"]), *inside[:-1])
    shown = studies_dir.joinpath(*parts, inside[-1])
    try:
        data = read_study_file(studies_dir, parts, inside[-1])
        marker = read_study_file(studies_dir, parts[:3], TRIAL_MARKER, MAX_MARKER_BYTES)
    except KeptRefused as err:
        return None, str(err)
    except OSError as err:
        return None, f"its metrics file {shown} cannot be read ({err.strerror or err})"
    if data is None or hashlib.sha256(data).hexdigest() != rec["metrics_sha256"]:
        return None, f"its metrics file {shown} " + ("is gone" if data is None else "changed since it was kept")
    try:
        made = json.loads(marker.decode("utf-8")) if marker is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        made = None
    if not isinstance(made, dict) or made.get("study") != rec["study"] or made.get("trial") != rec["trial"]:
        return None, f"{studies_dir.joinpath(*parts[:3])} is not the directory the driver made for " \
                     f"{rec['study']}#{rec['trial']}"
    return data, ""


def stored_run_problem(storage: BaseStorage | None, rec: dict[str, Any], seed: int) -> str:
    """Where the checked record's study is in ``storage``: why its trial is not a finished baseline run on ``seed``
    with the record's value, not itself reused ("" when it is, or when the study is not there)."""
    if storage is None:
        return ""
    name, number = rec["study"], rec["trial"]
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return ""  # kept by a study of another storage (by default, each study's own SQLite file)
    try:
        t = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, number))
    except KeyError:
        return f"study {name} has no trial {number}"
    v = t.values[0] if t.values else None
    if (t.state != TrialState.COMPLETE or not is_baseline(t) or t.system_attrs.get(ATTR_CONFIRM_SEED) != seed
            or t.user_attrs.get("baseline_reused") or v is None
            or not math.isclose(v, rec["value"], rel_tol=1e-9, abs_tol=1e-12)):
        return f"{name}#{number} is not a finished baseline run on seed {seed} with value {rec['value']:.6g}"
    return ""
