"""Tuned keys that interact: a value of one parameter is valid when some combination of the other parameters' values
makes it valid (a micro-batch of 8 needs a mini-batch of at least 8), not when it passes against the base config
alone.

:func:`check_combinations` asks a trainer's rule (``rejects(values)``: why the trainer refuses these tuned values
together, or None) about every combination of the parameters' candidate values (:func:`candidates`: every choice, an
integer range's every value when it has at most :data:`MAX_INT_VALUES`, else its ends; a float range's ends). A value
that no combination accepts can never run: the space is refused with one line naming it and the other tuned value
it conflicts with. A combination the trainer refuses while each of its values is valid in another is left in the
space: the driver skips it when a trial draws it (``fail_reason=infeasible``, never launched:
:meth:`hpo.backends.Backend.infeasible`).

Up to :data:`MAX_COMBINATIONS` combinations are tried exhaustively; a larger space tries, for each value, up to
:data:`MAX_PER_VALUE` combinations of the others (its corners first, then drawn with a fixed seed) and refuses a value
only when none of those is valid (said in its line)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hpo.experiment._schema import Param

MAX_INT_VALUES = 16  # an integer range with at most this many values is tried at each (divisibility rules)
MAX_COMBINATIONS = 512  # every combination of a space this small is tried
MAX_PER_VALUE = 64  # ... else this many combinations of the other parameters for each value

Rejects = Callable[[dict[str, Any]], "str | None"]
ErrorFn = Callable[[str, str], Exception]


def candidates(p: Param) -> list[Any]:
    """The values of ``p`` the combination check tries: every choice; every value of a small integer range (its ends
    otherwise); a float range's ends."""
    if p.type == "int" and p.low is not None and p.high is not None:
        step = int(p.step or 1)
        values = range(int(p.low), int(p.high) + 1, step)
        if len(values) <= MAX_INT_VALUES:
            return list(values)
    return p.corner_values()


def _shown(p: Param, v: Any) -> str:
    return f"params.{p.name}={v!r}"


def _combos_with(params: Sequence[Param], values: list[list[Any]], i: int, v: Any) -> Iterator[tuple[Any, ...]]:
    """Combinations with parameter ``i`` at ``v`` (all of them when few, else its others' corners then draws)."""
    others = [vals for j, vals in enumerate(values) if j != i]
    n = 1
    for vals in others:
        n *= len(vals)
    if n <= MAX_PER_VALUE:
        for rest in itertools.product(*others):
            yield (*rest[:i], v, *rest[i:])
        return
    corner = [[vals[0], vals[-1]] if len(vals) > 1 else vals for vals in others]
    tried = 0
    for rest in itertools.islice(itertools.product(*corner), MAX_PER_VALUE // 2):
        tried += 1
        yield (*rest[:i], v, *rest[i:])
    rng = random.Random(0)
    for _ in range(MAX_PER_VALUE - tried):
        rest = tuple(rng.choice(vals) for vals in others)
        yield (*rest[:i], v, *rest[i:])


def check_combinations(params: Sequence[Param], rejects: Rejects, error: ErrorFn) -> None:
    """Refuse (``error(where, msg)``: one line) a parameter value that no combination of the others' candidate values
    makes valid by ``rejects`` (see the module docstring)."""
    if not params:
        return
    values = [candidates(p) for p in params]
    total = 1
    for vals in values:
        total *= len(vals)
    exhaustive = total <= MAX_COMBINATIONS
    cache: dict[tuple[Any, ...], str | None] = {}

    def why(combo: tuple[Any, ...]) -> str | None:
        key = tuple(repr(v) for v in combo)
        if key not in cache:
            cache[key] = rejects({p.name: v for p, v in zip(params, combo, strict=True)})
        return cache[key]

    if exhaustive:  # one pass over every combination answers every value
        valid: list[set[str]] = [set() for _ in params]
        for combo in itertools.product(*values):
            if why(combo) is None:
                for i, v in enumerate(combo):
                    valid[i].add(repr(v))
    for i, p in enumerate(params):
        for v in values[i]:
            if exhaustive and repr(v) in valid[i]:
                continue
            last: tuple[tuple[Any, ...], str] | None = None
            for combo in _combos_with(params, values, i, v):
                reason = why(combo)
                if reason is None:
                    last = None
                    break
                last = (combo, reason)
            if last is not None:
                raise error(f"params.{p.name}", _refusal(params, i, v, *last, exhaustive))


def _refusal(params: Sequence[Param], i: int, v: Any, combo: tuple[Any, ...], reason: str, exhaustive: bool) -> str:
    """The line for value ``v`` of parameter ``i``, which no combination makes valid: the other tuned value of the
    last combination tried that the trainer's reason names (none: the value is refused whatever the others are),
    and the reason."""
    if len(params) == 1:
        return f"value {v!r} is rejected by the trainer: {reason}"
    others = [j for j in range(len(params)) if j != i]
    named = [j for j in others if params[j].key.rsplit(".", 1)[-1] in reason]
    every = ("every other combination of the tuned keys' values" if exhaustive else
             f"each of the {MAX_PER_VALUE} combinations of the other tuned keys' values tried")
    if not named:  # the value alone: whatever the others are
        return f"value {v!r} is rejected by the trainer with {every.replace(' other', '', 1)}: {reason}"
    return f"value {v!r} conflicts with {_shown(params[named[0]], combo[named[0]])}, and with {every}: {reason}"
