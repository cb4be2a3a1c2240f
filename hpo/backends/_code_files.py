"""The user-code files an override names, for the trainers whose keys name code in two forms: a key ending in one of
``path_keys`` holds one path (verl's and verl_core's ``[reward.]custom_reward_function.path``), a key ending in one
of ``entry_keys`` a list of ``name=path:function`` entries (verl_core's ``evaluation.custom``). Each backend's
``Backend.code_files`` passes its own keys; :func:`hpo.experiment._limits.check_code_files` checks the files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def code_files(key: str, value: Any, path_keys: Sequence[str], entry_keys: Sequence[str] = ()) -> list[str]:
    """The files the override ``key=value`` names: ``[value]`` for a path key, the ``path`` of each
    ``name=path:function`` entry for an entry key; none for any other key (or a value of another type)."""
    if isinstance(value, str) and any(key.endswith(k) for k in path_keys):
        return [value]
    if isinstance(value, list) and any(key.endswith(k) for k in entry_keys):
        return [str(v).partition("=")[2].rpartition(":")[0] for v in value]
    return []
