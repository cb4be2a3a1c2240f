"""What a rehearsal keeps for ``--recheck`` (``<home>/rehearsal.json``): the experiment's fingerprint, the swaps, the
findings made before the corners ran and each corner's attempts. The file is read back as untrusted input: every
field is checked for its type and range (:func:`load_state`), and a bad one is one line naming the file and the
field; the corners' trial directories are the home's own (``<home>/trials/<index>-<name>``), never a path read from
the file."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.analysis import FileRefused, read_bounded
from hpo.backends.verl._launch import verl_metrics_path
from hpo.backends.verl._rehearse_checks import LEVELS, CornerOutcome, Finding, RehearsalCorner, read_records
from hpo.execution import RunResult
from hpo.experiment import SpaceError

if TYPE_CHECKING:
    from hpo.experiment import Space

MARKER = ".verl-hpo-rehearsal"  # in a rehearsal directory: what the driver made and may replace
STATE = "rehearsal.json"  # what --recheck reads: the experiment's fingerprint, the swaps, each corner's attempts
MAX_STATE_BYTES = 16 << 20
MAX_CORNERS = 64  # a rehearsal runs three; the file may say anything
MAX_ATTEMPTS = 8  # a corner runs one or two
MAX_TEXT = 1 << 20  # characters of any one text of the file
MAX_WALL_S = 1e9  # seconds of one attempt (~30 years)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a corner's name: default, low, high (it names its trial directory)


def fingerprint(space: Space) -> str:
    """What decides a rehearsal's runs: the config, the fixed overrides, the parameters, the baseline and the trial
    section (not the objective, early stopping or the study's search settings, which --recheck may change)."""
    import dataclasses
    import hashlib

    decides = {"config": space.config, "overrides": space.overrides, "baseline": space.study.baseline,
               "params": [dataclasses.asdict(p) for p in space.params], "trial": dataclasses.asdict(space.trial)}
    return hashlib.sha256(json.dumps(decides, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_state(home: Path, space: Space, swaps: Sequence[str], outcomes: Sequence[CornerOutcome], quick: bool,
               before: Sequence[Finding]) -> None:
    corners = [{"name": o.corner.name, "values": o.corner.values, "trial_dir": str(o.trial_dir), "index": o.index,
                "resumed_from": o.resumed_from,
                "results": [{"exit_code": r.exit_code, "stop": r.stop, "wall_time_s": r.wall_time_s,
                             "final_exception": r.final_exception, "stderr_tail": r.stderr_tail[-2000:],
                             "kernel_oom": r.kernel_oom} for r in o.results]} for o in outcomes]
    (home / STATE).write_text(json.dumps({"fingerprint": fingerprint(space), "quick": quick, "swaps": list(swaps),
                                          "before": [f.__dict__ for f in before], "corners": corners}, default=str))


@dataclass(frozen=True)
class State:
    """A rehearsal's state as read back: what --recheck needs to run the checks again."""

    quick: bool
    swaps: list[str]
    before: list[Finding]
    outcomes: list[CornerOutcome]


class _Bad(Exception):
    """A field of the state file that is not what the rehearsal writes: ``where`` and what it should be."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def _get(obj: dict[str, Any], key: str, where: str, optional: bool = False) -> Any:
    if key not in obj and not optional:
        raise _Bad(f"{where}.{key}" if where else key, "missing")
    return obj.get(key)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _Bad(where, f"a text of {len(value)} characters (at most {MAX_TEXT})" if isinstance(value, str) else
                   f"{_shown(value)} is not a text")
    return value


def _text_or_none(value: Any, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _Bad(where, f"{_shown(value)} is not an integer from {lo} to {hi}")
    return value


def _int_or_none(value: Any, where: str, lo: int, hi: int) -> int | None:
    return None if value is None else _int(value, where, lo, hi)


def _list(value: Any, where: str, most: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        raise _Bad(where, f"{'a list of ' + str(len(value)) if isinstance(value, list) else _shown(value)}: not a "
                   f"list of at most {most}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(where, f"a JSON {type(value).__name__}, not an object")
    return value


def _finding(raw: Any, where: str) -> Finding:
    obj = _object(raw, where)
    check = _text(_get(obj, "check", where), f"{where}.check")
    level = _text(_get(obj, "level", where), f"{where}.level")
    if level not in LEVELS:
        raise _Bad(f"{where}.level", f"{_shown(level)} is not one of {', '.join(LEVELS)}")
    return Finding(check, level, _text(_get(obj, "message", where), f"{where}.message"))


def _result(raw: Any, where: str) -> RunResult:
    obj = _object(raw, where)
    wall = _get(obj, "wall_time_s", where)
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not 0 <= wall <= MAX_WALL_S:
        raise _Bad(f"{where}.wall_time_s", f"{_shown(wall)} is not a number of seconds from 0 to {MAX_WALL_S:g}")
    oom = obj.get("kernel_oom", False)
    if not isinstance(oom, bool):
        raise _Bad(f"{where}.kernel_oom", f"{_shown(oom)} is not true or false")
    stop = _text_or_none(_get(obj, "stop", where), f"{where}.stop")
    if stop is not None and len(stop) > 64:
        raise _Bad(f"{where}.stop", f"{_shown(stop)} is not a reason (at most 64 characters)")
    return RunResult(_int_or_none(_get(obj, "exit_code", where), f"{where}.exit_code", -255, 255), stop, 0.0,
                     float(wall), None, None, _text(_get(obj, "stderr_tail", where), f"{where}.stderr_tail"),
                     final_exception=_text_or_none(_get(obj, "final_exception", where), f"{where}.final_exception"),
                     kernel_oom=oom)


def _values(raw: Any, where: str) -> dict[str, Any]:
    obj = _object(raw, where)
    for key, value in obj.items():
        if len(key) > 256 or not (value is None or isinstance(value, (bool, int, float, str))):
            raise _Bad(f"{where}.{key[:64]}", f"{_shown(value)} is not a parameter value (a number, a text, true, "
                       "false or null)")
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise _Bad(f"{where}.{key[:64]}", f"a text of {len(value)} characters (at most {MAX_TEXT})")
    return dict(obj)


def _outcome(raw: Any, where: str, trials: Path) -> CornerOutcome:
    obj = _object(raw, where)
    name = _text(_get(obj, "name", where), f"{where}.name")
    if not _NAME.match(name):
        raise _Bad(f"{where}.name", f"{_shown(name)} is not a corner's name (letters, digits, _ and -)")
    index = _int(_get(obj, "index", where), f"{where}.index", 0, MAX_CORNERS - 1)
    resumed = _int_or_none(_get(obj, "resumed_from", where, optional=True), f"{where}.resumed_from", 0, 10**9)
    corner = RehearsalCorner(name, _values(_get(obj, "values", where), f"{where}.values"), [])
    outcome = CornerOutcome(corner, trials / f"{index}-{name}", index, resumed_from=resumed)
    for attempt, r in enumerate(_list(_get(obj, "results", where), f"{where}.results", MAX_ATTEMPTS)):
        outcome.results.append(_result(r, f"{where}.results[{attempt}]"))
        outcome.records.append(read_records(verl_metrics_path(outcome.trial_dir, attempt)))
    return outcome


def _each(raw: Any, where: str, most: int, one: Callable[[Any, str], Any]) -> list[Any]:
    return [one(x, f"{where}[{i}]") for i, x in enumerate(_list(raw, where, most))]


def load_state(home: Path, space: Space) -> State:
    """The state of the rehearsal in ``home`` for ``space``, every field checked. SpaceError (one line naming the
    file and, for a bad field, the field): no finished rehearsal there, the experiment changed since, a file that
    is not what the rehearsal writes."""
    path = home / STATE
    try:
        if not (home / MARKER).is_file():
            raise FileNotFoundError
        state = json.loads(read_bounded(path, STATE, MAX_STATE_BYTES))
    except (OSError, FileRefused, ValueError, RecursionError):
        raise SpaceError(f"{space.source}: no finished rehearsal in {home}: run verl-hpo rehearse first") from None
    if not isinstance(state, dict):
        raise SpaceError(f"{space.source}: the rehearsal state {path} is malformed (a JSON "
                         f"{type(state).__name__}, not an object): rehearse again")
    if state.get("fingerprint") != fingerprint(space):
        raise SpaceError(f"{space.source}: config, overrides, params or trial changed since the rehearsal in {home}: "
                         "rehearse again (--recheck only reruns the checks)")
    try:
        quick = _get(state, "quick", "")
        if not isinstance(quick, bool):
            raise _Bad("quick", f"{_shown(quick)} is not true or false")
        swaps = _each(_get(state, "swaps", ""), "swaps", 1000, _text)
        before = _each(_get(state, "before", ""), "before", 10_000, _finding)
        trials = home / "trials"
        outcomes = _each(_get(state, "corners", ""), "corners", MAX_CORNERS, lambda r, w: _outcome(r, w, trials))
    except _Bad as bad:
        raise SpaceError(f"{space.source}: the rehearsal state {path} is malformed ({bad}): rehearse again") from None
    return State(quick, swaps, before, outcomes)
