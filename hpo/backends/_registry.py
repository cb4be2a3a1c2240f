"""Which :class:`~hpo.backends._base.Backend` runs a trial: ``trial.backend`` looked up in the one list of trainers the
driver knows, imported on first use (so the driver loads only the backend it runs). The list is:

* the backends shipped here: each subpackage ``hpo/backends/<name>/`` is the backend ``<name>``, its ``BACKEND``
  attribute the class;
* the installed plugins: every entry point of the group ``verl_hpo.backends`` (``<name> = "module:attribute"``, a
  Backend subclass or a zero-argument factory; a shipped name cannot be taken by a plugin);
* what :func:`register` added in this process (tests).

``docs/layout.md``, "Adding a backend". A plugin is code the driver did not write, so:

* its names are read from the installed metadata, never by importing it: listing the trainers, or refusing an
  experiment whose trainer cannot do something (:func:`backends_that` asks only the shipped, registered and
  already loaded trainers and names the plugins it did not ask), imports no plugin; an experiment of a shipped trainer
  never imports one;
* a plugin's import and factory are isolated: whatever they raise, ``SystemExit`` and a ``KeyboardInterrupt`` of
  their own included, is one line (:class:`BackendError`), never a traceback or a silent exit; a Ctrl-C the user
  presses while it loads still stops the command;
* a name two installed entry points give is refused where it is used (both named), and marked where names are listed
  (:func:`backend_label`);
* a backend class, shipped or plugin, is checked as it loads (:func:`_check_contract`): one that misses a member of the
  required core (``name``, ``metrics``, ``configure``, ``command``) or holds a feature of the wrong type is one line
  naming the backend and what is wrong."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import pkgutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hpo.backends._base import REQUIRED, Backend, CommandBackend, missing_members
from hpo.backends._features import Confirmation, MemoryModel, Rehearsal, Resumable, Speed
from hpo.experiment import Space, SpaceError, TrialSpec

ENTRY_POINT_GROUP = "verl_hpo.backends"
# the trainer of an experiment that names none (``trial.backend`` unset): the project's own, docs/trainer.md
DEFAULT_BACKEND = "verl_core"
Factory = str | Callable[[], Backend]
_REGISTERED: dict[str, Factory] = {}
_CACHE: dict[str, Backend] = {}


class BackendError(SpaceError):
    """A trainer's backend that cannot be loaded (a broken plugin): one line naming it and why."""


@dataclass(frozen=True)
class _EntryPoint:
    """One installed entry point of :data:`ENTRY_POINT_GROUP`, as its metadata says (nothing imported)."""

    value: str  # "module:attribute"
    dist: str  # the distribution that installs it
    location: str  # the directory it is installed in

    def where(self, name: str) -> str:
        return f"entry point {name} = {self.value} ({ENTRY_POINT_GROUP}, distribution {self.dist})"


def _shipped() -> dict[str, Factory]:
    """The subpackages of ``hpo/backends/`` (not imported here)."""
    here = [str(Path(__file__).parent)]
    return {m.name: f"{__package__}.{m.name}:BACKEND" for m in pkgutil.iter_modules(here) if m.ispkg}


def _plugins() -> dict[str, list[_EntryPoint]]:
    """The installed entry points of :data:`ENTRY_POINT_GROUP` by name, read from every distribution's metadata (one
    copy of a distribution found twice on the path counts once; two that give one name are both kept)."""
    out: dict[str, list[_EntryPoint]] = {}
    try:
        dists = list(importlib.metadata.distributions())
    except Exception:  # noqa: BLE001 - unreadable metadata: no plugins rather than a crash
        return out
    for dist in dists:
        try:
            found = [(ep.name, _EntryPoint(ep.value, str(dist.name or "?"), str(dist.locate_file(""))))
                     for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        except Exception:  # noqa: BLE001 - one distribution's unreadable metadata hides its plugins only
            continue
        for name, ep in found:
            same = out.setdefault(name, [])
            if all((e.value, e.dist) != (ep.value, ep.dist) for e in same):
                same.append(ep)
    return {name: sorted(eps, key=lambda e: (e.dist, e.value, e.location)) for name, eps in out.items()}


def _factory(name: str) -> tuple[Factory, str]:
    """The factory of ``name`` and where it comes from: a shipped backend, then a registered one, then the one
    installed plugin of that name; KeyError for none, :class:`BackendError` for two plugins or more."""
    shipped = _shipped()
    if name in shipped:
        return shipped[name], f"hpo.backends.{name}"
    if name in _REGISTERED:
        return _REGISTERED[name], f"registered {name}"
    eps = _plugins()[name]
    if len(eps) > 1:
        given = ", ".join(f"{e.value} (distribution {e.dist}, {e.location})" for e in eps)
        raise BackendError(f"trial.backend {name}: {len(eps)} installed plugins give this name: {given} "
                           f"(entry point group {ENTRY_POINT_GROUP}); uninstall all but one")
    return eps[0].value, eps[0].where(name)


def register(name: str, factory: Factory) -> None:
    """Make ``trial.backend: <name>`` run trials through ``factory`` (a Backend subclass or "module:attribute"), in
    this process only (an installed plugin uses the entry point group instead)."""
    _REGISTERED[name] = factory
    _CACHE.pop(name, None)


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)
    _CACHE.pop(name, None)


def known_backends() -> tuple[str, ...]:
    """Every trainer ``trial.backend`` may name: the shipped ones, then the plugins and the registered ones (nothing
    imported)."""
    shipped = _shipped()
    others = (set(_plugins()) | set(_REGISTERED)) - set(shipped)
    return (*sorted(shipped, key=lambda n: (n != DEFAULT_BACKEND, n)), *sorted(others))


def backend_label(name: str) -> str:
    """``name`` as a list of trainers shows it: marked when installed plugins give it twice or more (the name is
    refused where it is used)."""
    eps = [] if name in _shipped() or name in _REGISTERED else _plugins().get(name, [])
    return f"{name} ({len(eps)} plugins: {', '.join(e.dist for e in eps)})" if len(eps) > 1 else name


def backends_that(does: Callable[[Backend], bool]) -> tuple[list[str], list[str]]:
    """The trainers whose backend ``does`` among those that can be asked without running a plugin's code (the
    shipped, the registered and the already loaded ones; one that does not load does nothing), and the installed
    plugins not asked (labelled: :func:`backend_label`). A refusal lists both; it never imports a plugin."""
    able: list[str] = []
    unasked: list[str] = []
    for name in known_backends():
        if name not in _shipped() and name not in _REGISTERED and name not in _CACHE:
            unasked.append(backend_label(name))
            continue
        try:
            if does(backend_named(name)):
                able.append(name)
        except BackendError:
            pass
    return able, unasked


@contextlib.contextmanager
def _real_interrupts() -> Iterator[list[int]]:
    """The SIGINTs the process gets meanwhile (a Ctrl-C), each still handled as before; none seen outside the main
    thread (a signal is delivered to the main thread only, so a KeyboardInterrupt elsewhere was raised by code)."""
    seen: list[int] = []
    before = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if before is None:  # not the main thread, or a handler Python did not install: nothing to watch
        yield seen
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:  # also undoes a handler the plugin's import installed
        signal.signal(signal.SIGINT, before)


def _resolved(factory: Factory) -> object:
    """What ``factory`` names: "module:attribute" imported, else the factory itself."""
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        obj: object = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    return factory


FEATURES = {"memory": MemoryModel, "resumable": Resumable, "confirmation": Confirmation, "speed": Speed,
            "rehearsal": Rehearsal}  # each feature attribute of a Backend and the type it holds (None: none)


def _check_contract(name: str, backend: object, where: str) -> None:
    """BackendError (one line naming the backend) when ``backend`` (a Backend class or one built) misses a member of
    the required core or holds a feature that is not of the feature's type (:mod:`hpo.backends._features`)."""
    missing = missing_members(backend if isinstance(backend, type) else type(backend))
    if missing:
        raise BackendError(f"trial.backend {name}: the backend from {where} does not write "
                           f"{', '.join(missing)} (every trainer writes {', '.join(REQUIRED)}: "
                           "hpo.backends.Backend)"[:500])
    for attr, kind in FEATURES.items():
        value = getattr(backend, attr, None)
        if value is not None and not isinstance(value, kind):
            raise BackendError(f"trial.backend {name}: the backend from {where} has {attr} = "
                               f"{type(value).__name__}, not a hpo.backends.{kind.__name__} (None: no {attr})"[:500])


def _load(name: str, factory: Factory, where: str) -> Backend:
    """The backend ``factory`` builds (a plugin's module imported first), isolated: anything it raises is one line;
    a Backend class is checked against the contract before it is built."""
    with _real_interrupts() as ctrl_c:
        try:
            made = _resolved(factory)
            if isinstance(made, type) and issubclass(made, Backend):
                _check_contract(name, made, where)
            backend = made()  # type: ignore[operator]
        except BackendError:
            raise
        except BaseException as err:  # noqa: BLE001 - SystemExit, its own KeyboardInterrupt: the plugin's error
            if ctrl_c and isinstance(err, KeyboardInterrupt):
                raise  # the user's Ctrl-C while it loaded: the command stops (exit 130)
            try:
                text = str(err).strip()
            except Exception:  # noqa: BLE001 - an exception that cannot say what it is
                text = ""
            why = f": {text.splitlines()[0]}" if text else ""
            raise BackendError(f"trial.backend {name}: the backend from {where} does not load: "
                               f"{type(err).__name__}{why}"[:500]) from None
    if not isinstance(backend, Backend):
        raise BackendError(f"trial.backend {name}: {where} gives {type(backend).__name__}, not a "
                           "hpo.backends.Backend")
    _check_contract(name, backend, where)  # as built (a factory's; features set by __init__)
    return backend


def backend_named(name: str) -> Backend:
    """The backend registered as ``name`` ("command": :class:`~hpo.backends._base.CommandBackend`, a plain command;
    "": the default trainer, :data:`DEFAULT_BACKEND`); KeyError when none is, :class:`BackendError` when it does not
    load, misses a member of the required core, or two installed plugins give the name."""
    name = name or DEFAULT_BACKEND
    if name not in _CACHE:
        if name == CommandBackend.name:
            _CACHE[name] = CommandBackend()
        else:
            _CACHE[name] = _load(name, *_factory(name))
    return _CACHE[name]


def trial_backend(trial: TrialSpec) -> Backend:
    """The backend of a trial section: ``trial.backend``'s, for the trial's command (``Backend.for_command``: e.g.
    verl_core with a ``trial.command`` of its own is a custom command)."""
    return backend_named(trial.backend).for_command(trial.command)


def backend_of(space: Space) -> Backend:
    """The backend that runs the trials of ``space``."""
    return trial_backend(space.trial)
