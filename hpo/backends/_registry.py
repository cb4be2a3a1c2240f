"""Which :class:`~hpo.backends._base.Backend` runs a trial: ``trial.backend`` looked up in the one list of trainers the
driver knows, imported on first use (so the driver loads only the backend it runs). The list is:

* the backends shipped here: each subpackage ``hpo/backends/<name>/`` is the backend ``<name>``, its ``BACKEND``
  attribute the class;
* the installed plugins: every entry point of the group ``verl_hpo.backends`` (``<name> = "module:attribute"``, a
  Backend subclass or a zero-argument factory; a shipped name cannot be taken by a plugin);
* what :func:`register` added in this process (tests).

``docs/layout.md``, "Adding a backend". A plugin that does not load is one line (:class:`BackendError`), never a
traceback."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable
from pathlib import Path

from hpo.backends._base import Backend
from hpo.experiment._space import Space, SpaceError, TrialSpec

ENTRY_POINT_GROUP = "verl_hpo.backends"
# the trainer of an experiment that names none (``trial.backend`` unset): the project's own, docs/trainer.md
DEFAULT_BACKEND = "verl_core"
Factory = str | Callable[[], Backend]
_REGISTERED: dict[str, Factory] = {}
_CACHE: dict[str, Backend] = {}


class BackendError(SpaceError):
    """A trainer's backend that cannot be loaded (a broken plugin): one line naming it and why."""


def _shipped() -> dict[str, Factory]:
    """The subpackages of ``hpo/backends/`` (not imported here)."""
    here = [str(Path(__file__).parent)]
    return {m.name: f"{__package__}.{m.name}:BACKEND" for m in pkgutil.iter_modules(here) if m.ispkg}


def _plugins() -> dict[str, tuple[Factory, str]]:
    """The installed entry points of :data:`ENTRY_POINT_GROUP`: name -> ("module:attribute", where it comes from)."""
    out: dict[str, tuple[Factory, str]] = {}
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - unreadable metadata of some distribution: no plugins rather than a crash
        return out
    for ep in eps:
        dist = getattr(ep, "dist", None)
        where = f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}" + (
            f", distribution {dist.name})" if dist is not None else ")")
        out.setdefault(ep.name, (ep.value, where))
    return out


def _factories() -> dict[str, tuple[Factory, str]]:
    shipped = {name: (f, f"hpo.backends.{name}") for name, f in _shipped().items()}
    return {**_plugins(), **{n: (f, f"registered {n}") for n, f in _REGISTERED.items()}, **shipped}


def register(name: str, factory: Factory) -> None:
    """Make ``trial.backend: <name>`` run trials through ``factory`` (a Backend subclass or "module:attribute"), in
    this process only (an installed plugin uses the entry point group instead)."""
    _REGISTERED[name] = factory
    _CACHE.pop(name, None)


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)
    _CACHE.pop(name, None)


def known_backends() -> tuple[str, ...]:
    """Every trainer ``trial.backend`` may name: the shipped ones, then the plugins and the registered ones."""
    factories = _factories()
    shipped = _shipped()
    return (*sorted(shipped, key=lambda n: (n != DEFAULT_BACKEND, n)),
            *sorted(n for n in factories if n not in shipped))


def backend_named(name: str) -> Backend:
    """The backend registered as ``name`` ("command": the base class, a plain command; "": the default trainer,
    :data:`DEFAULT_BACKEND`); KeyError when none is, :class:`BackendError` when it does not load."""
    name = name or DEFAULT_BACKEND
    if name not in _CACHE:
        if name == Backend.name:
            _CACHE[name] = Backend()
            return _CACHE[name]
        factory, where = _factories()[name]
        try:
            if isinstance(factory, str):
                module, _, attr = factory.partition(":")
                obj = importlib.import_module(module)
                for part in attr.split("."):
                    obj = getattr(obj, part)
                factory = obj  # type: ignore[assignment]
            backend = factory()  # type: ignore[operator]
        except Exception as err:  # noqa: BLE001 - a plugin's error is one line, not a traceback
            why = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise BackendError(f"trial.backend {name}: the backend from {where} does not load: "
                               f"{type(err).__name__}: {why}"[:500]) from None
        if not isinstance(backend, Backend):
            raise BackendError(f"trial.backend {name}: {where} gives {type(backend).__name__}, not a "
                               "hpo.backends.Backend")
        _CACHE[name] = backend
    return _CACHE[name]


def trial_backend(trial: TrialSpec) -> Backend:
    """The backend of a trial section: ``trial.backend``'s, for the trial's command (``Backend.for_command``: e.g.
    verl_core with a ``trial.command`` of its own is a custom command)."""
    return backend_named(trial.backend).for_command(trial.command)


def backend_of(space: Space) -> Backend:
    """The backend that runs the trials of ``space``."""
    return trial_backend(space.trial)
