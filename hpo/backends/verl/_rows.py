"""What verl's own data path and the reward found on every row of a verl experiment, before launch, for ``validate``
(:func:`hpo.backends.verl._memory.validate_verl`) and the rehearsal's first step: the check runs in verl's interpreter
(``_compose_datapath.check_rows``, asked for by :func:`row_check_request`) and its reply becomes lines here
(:func:`row_lines`), each a problem (a study would lose rows or fail), a note or an ok line.

Its time limits, each overridable by an environment variable of seconds (a busy host, a slow reward):
:data:`ROWS_ENV` (verl's data path, row by row, every split together; the rows left unchecked are said),
:data:`REWARD_CALL_ENV` (one call of the reward function: over it, the function is named as hung) and
:data:`REWARD_ENV` (all the reward's calls: when spent, the rest are not called, which is a note). Nothing here
imports torch, hydra or verl.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._compose_datapath import ROWS_BUDGET_S
from hpo.backends.verl._compose_reward import BUDGET_S, CALL_S, STEP_MARKER
from hpo.backends.verl._launch import override_key
from hpo.experiment import SpaceError

if TYPE_CHECKING:
    from hpo.experiment import Space

ROWS_ENV = "VERL_HPO_ROWS_TIMEOUT_S"
REWARD_CALL_ENV = "VERL_HPO_REWARD_CALL_TIMEOUT_S"
REWARD_ENV = "VERL_HPO_REWARD_TIMEOUT_S"
MAX_SECONDS = 86400.0


def env_seconds(name: str, default: float, what: str) -> float:
    """Seconds from ``$name`` (``default`` when unset); SpaceError (one line naming it and ``what`` it bounds) for a
    value that is not a number of seconds above 0 and at most a day."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:
        raise SpaceError(f"{name}={raw[:40]!r}: must be a number of seconds above 0 and at most {MAX_SECONDS:.0f} "
                         f"({what})")
    return value


def row_check_request(reward_s: float | None = None) -> dict[str, Any]:
    """The ``check_rows`` request of ``_compose.py``: the time limits (``reward_s``: all the reward's calls, e.g.
    ``rehearse --reward-timeout``; else :data:`REWARD_ENV` or its default). SpaceError for a bad variable."""
    budget = reward_s if reward_s is not None else env_seconds(REWARD_ENV, BUDGET_S, "what the reward's calls may take "
                                                                                  "in all before launch")
    return {"rows_s": env_seconds(ROWS_ENV, ROWS_BUDGET_S, "how long verl's data path may take on the rows"),
            "reward_call_s": min(budget, env_seconds(REWARD_CALL_ENV, CALL_S, "how long one call of the reward "
                                                                            "function may take before launch")),
            "reward_s": budget}


def field_of(space: Space, key: str) -> str:
    """The experiment field that sets verl key ``key`` (``overrides.<key>``, ``params.<name>``), else the key."""
    fixed = next((k for k in space.overrides if override_key(k) == key), None)
    if fixed is not None:
        return f"overrides.{fixed}"
    param = next((p for p in space.params if override_key(p.key) == key), None)
    return f"params.{param.name}" if param is not None else key


def row_lines(space: Space, rows: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """``(level, field, line)`` of the check's reply: level ``problem``, ``note`` or ``ok``; field the experiment
    field each problem is about (the line itself names the file and row)."""
    if not rows:
        return []
    out: list[tuple[str, str, str]] = []
    for line in rows.get("problems") or []:
        key, _, rest = str(line).partition(": ")
        out.append(("problem", field_of(space, key), rest))
    out += [("note", "", str(n)) for n in rows.get("notes") or []]
    reward = rows.get("reward")
    if isinstance(reward, Mapping):
        where = field_of(space, "reward.custom_reward_function.path")
        if reward.get("problem"):
            out.append(("problem", where, str(reward["problem"])))
        elif reward.get("calls"):
            sampled = (f"; {reward['other_truth_rows']} rows hold further values, of which a random sample was "
                       "scored" if reward.get("other_truth_rows") else "")
            out.append(("ok", "", f"reward: {reward.get('where')} returned finite numbers in {reward['calls']} calls "
                                  f"on {reward.get('targets')} rows, the first of each distinct ground truth of the "
                                  f"data{sampled} (scores {reward.get('min', 0):g} to {reward.get('max', 0):g}; "
                                  f"{float(reward.get('seconds') or 0) * 1000:.2g} ms a call)"))
        if reward.get("note"):
            out.append(("note", "", f"reward: {reward['note']}"))
        if reward.get("printed_dropped_bytes"):
            out.append(("note", "", f"reward: {reward['where']} printed {reward['printed_bytes']} bytes in "
                                    f"{reward['calls']} calls: a trial's logs grow with every call"))
    return out


def hung_reward(stderr: str | bytes | None) -> bool:
    """Whether a check that ran out of its time was calling the reward function (its stderr's last marker)."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else (stderr or "")
    marks = [ln.strip() for ln in text.splitlines() if ln.startswith(STEP_MARKER)]
    return bool(marks) and marks[-1] == STEP_MARKER
