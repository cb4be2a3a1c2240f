"""``--override key=value``: a command line's changes to an experiment, applied to its raw mapping before parsing.

A key whose first part is a field of the file (``study.n_trials=4``, ``params.lr.high=1e-3``) sets that field; any
other dotted key (or ``overrides.<key>``) is a fixed trainer override; past ``study.fidelity.proxy.overrides.`` or
``study.baseline.`` the rest is one trainer key (``...overrides.actor_rollout_ref.model.path=DIR``,
``study.baseline.actor_rollout_ref.actor.optim.lr=1e-6``). The value is YAML (read by the hardened
reader, :mod:`hpo.experiment._yaml`; text that is not YAML stays text). :func:`apply_overrides` returns which field
each text set, so that a later error about that field names the ``--override`` rather than the file
(:class:`~hpo.experiment._errors.ErrorContext`).
"""

from __future__ import annotations

import typing
from typing import Any

import yaml

from hpo.experiment._errors import SpaceError, shown_override
from hpo.experiment._schema import TOP_FIELDS
from hpo.experiment._yaml import YamlTooComplex, load_yaml_text, yaml_problem

# fields that are mappings of dotted trainer keys: past the prefix, a key is one trainer key, not a path
KEYED_BY_TRAINER_KEYS = ("study.fidelity.proxy.overrides.", "study.baseline.")


def _set_path(raw: dict[str, Any], path: list[str], value: Any) -> None:
    node = raw
    for p in path[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    node[path[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, str]:
    """Apply ``--override`` texts in place: space fields (``study.n_trials=4``, ``params.x.high=1``)
    or, for any other dotted key, a fixed trainer override. Returns {field path: override text}."""
    origin: dict[str, str] = {}
    for text in overrides:
        key, sep, rhs = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpaceError(f"--override '{shown_override(text)}': expected key=value")
        try:
            value = load_yaml_text(rhs) if rhs.strip() else ""
        except (YamlTooComplex, yaml.constructor.ConstructorError) as err:  # a bomb, a cycle, a duplicate key
            raise SpaceError(f"--override '{shown_override(text)}':{yaml_problem(err)}") from None
        except yaml.YAMLError:
            value = rhs
        head = key.split(".")[0]
        if key.startswith(KEYED_BY_TRAINER_KEYS) and key not in KEYED_BY_TRAINER_KEYS:  # the rest is one trainer key
            prefix = next(k for k in KEYED_BY_TRAINER_KEYS if key.startswith(k))
            _set_path(raw, [*prefix.rstrip(".").split("."), key[len(prefix):]], value)
            origin[key] = text
        elif head in TOP_FIELDS and head != "overrides":
            _set_path(raw, key.split("."), value)
            origin[key] = text
        else:
            key = key.removeprefix("overrides.")
            if not isinstance(raw.get("overrides"), dict):
                raw["overrides"] = {} if raw.get("overrides") is None else raw["overrides"]
            if isinstance(raw["overrides"], dict):
                raw["overrides"][key] = value
            origin[f"overrides.{key}"] = text
    return origin
