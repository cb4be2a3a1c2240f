"""Which :class:`~hpo.backends._base.Backend` runs a trial: ``trial.backend`` looked up in a registry of factories
(imported on first use, so the driver loads only the backend it runs). A new trainer registers itself here
(``docs/layout.md``, "Adding a backend")."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from hpo.backends._base import Backend
from hpo.experiment._space import BACKEND_NAMES, DEFAULT_COMMAND, Space, TrialSpec

# trial.backend -> "module:attribute" of a zero-argument factory (a Backend subclass)
_FACTORIES: dict[str, str | Callable[[], Backend]] = {
    "verl_core": "hpo.backends.verl_core:VerlCoreBackend",
    "verl": "hpo.backends.verl:VerlBackend",
    "trl": "hpo.backends.trl:TrlBackend",
    "command": "hpo.backends._base:Backend",
}
_CACHE: dict[str, Backend] = {}


def register(name: str, factory: str | Callable[[], Backend]) -> None:
    """Make ``trial.backend: <name>`` run trials through ``factory`` (a Backend subclass or "module:attribute"): the
    experiment schema accepts the name from then on, in this process."""
    _FACTORIES[name] = factory
    _CACHE.pop(name, None)
    if name not in BACKEND_NAMES and name != "command":
        BACKEND_NAMES.append(name)


def known_backends() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def backend_named(name: str) -> Backend:
    """The backend registered as ``name`` (KeyError when none is)."""
    if name not in _CACHE:
        factory = _FACTORIES[name]
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        _CACHE[name] = factory()
    return _CACHE[name]


def trial_backend(trial: TrialSpec) -> Backend:
    """The backend of a trial section: ``trial.backend``, except that ``verl_core`` with a ``trial.command`` of
    its own is a custom command (the driver cannot load that program's config)."""
    name = trial.backend
    if name == "verl_core" and tuple(trial.command) != DEFAULT_COMMAND:
        name = "command"
    return backend_named(name)


def backend_of(space: Space) -> Backend:
    """The backend that runs the trials of ``space``."""
    return trial_backend(space.trial)
