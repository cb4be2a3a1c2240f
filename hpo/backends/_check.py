"""An experiment checked by its backend before a study is made: the default trainer's keys and corners through
``verl_core.config`` (in :func:`hpo.experiment.load_space`), a verl space's corners composed by verl itself."""

from __future__ import annotations

import typing
from pathlib import Path

from hpo.experiment._space import SPACES_DIR, Space, load_space_origin, located_error


def check_space(space: Space, origin: dict[str, str] | None = None) -> None:
    """SpaceError (one line) when the backend rejects the space; a verl space is composed corner by corner."""
    if space.trial.is_verl:
        from hpo.backends.verl import VerlConfigError, check_verl_space, default_python

        try:
            check_verl_space(space, space.trial.python or default_python())
        except VerlConfigError as err:
            raise located_error(space, origin or {}, err.where, str(err)) from None


def load_checked_space(name_or_path: str, overrides: typing.Sequence[str] = (),
                       spaces_dir: Path = SPACES_DIR) -> Space:
    """Read, override, parse and check an experiment file with its backend (what ``search`` and ``validate`` do)."""
    space, origin = load_space_origin(name_or_path, overrides, spaces_dir)
    check_space(space, origin)
    return space
