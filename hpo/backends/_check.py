"""An experiment as the driver runs it, loaded by :func:`load_space` (its file; the one loader every command uses) or
:func:`stored_space` (a study's stored copy): the schema (:mod:`hpo.experiment`), then its backend, looked up in the
registry (``trial.backend``: one of :func:`~hpo.backends.known_backends`), fills in what the experiment leaves to the
trainer (``Backend.with_defaults``: its command, default objective and spread metric) and keeps a search off its
held-out split (the ``confirmation`` feature's ``heldout_keys``, ``heldout_prefixes``), then its defaults
(``Backend.normalize``) and checks
(``Backend.check``: quick, on every load; a trainer that tells which tuned values it refuses together,
``Backend.infeasible``, has each value checked against the other parameters' values: :mod:`hpo.experiment._combos`;
``Backend.verify``: thorough, before a study is made, e.g. a verl space's corners composed by verl itself)."""

from __future__ import annotations

import dataclasses
import itertools
import typing
from pathlib import Path
from typing import Any

from hpo.backends._attempt import Attempt
from hpo.backends._base import Backend
from hpo.backends._features import Rehearsal
from hpo.backends._fidelity import check_proxy
from hpo.backends._registry import (
    DEFAULT_BACKEND,
    BackendError,
    backend_label,
    backend_of,
    backends_that,
    known_backends,
)
from hpo.experiment import (
    SPACES_DIR,
    Space,
    SpaceError,
    check_code_files,
    check_combinations,
    check_no_test_split,
    check_speed_keys,
    check_speed_objective,
    located_error,
    parse_space,
    read_space,
)


def _trainer(space: Space, origin: dict[str, str]) -> tuple[Space, Backend]:
    """The space's backend (SpaceError, one line, for a name the registry does not know or a plugin that does not
    load) and the space with the trainer's defaults filled in."""
    names = known_backends()
    if not space.trial.backend:  # the experiment names no trainer: the default one
        space = dataclasses.replace(space, trial=dataclasses.replace(space.trial, backend=DEFAULT_BACKEND))
    if space.trial.backend not in names:
        raise located_error(space, origin, "trial.backend", f"{space.trial.backend!r} is not one of "
                            f"{', '.join(backend_label(n) for n in names)}")
    try:
        backend = backend_of(space)
    except BackendError as err:
        raise BackendError(f"{space.source}: {err}") from None
    return backend.with_defaults(space), backend


def _check_defaults(space: Space, origin: dict[str, str], backend: Backend) -> None:
    """What the experiment left to a trainer that has none, and the held-out split kept out of the search."""
    if space.objective.mode == "single" and not space.objective.metric:
        raise located_error(space, origin, "objective.metric", f"required: trial.backend {space.trial.backend} "
                            "names no default objective")
    if not space.trial.command:
        raise located_error(space, origin, "trial.command", f"required: trial.backend {space.trial.backend} has "
                            "no default command")

    def error(where: str, msg: str) -> Exception:
        return located_error(space, origin, where, msg)

    confirmation = backend.confirmation
    keys, prefixes = ((confirmation.heldout_keys, confirmation.heldout_prefixes) if confirmation is not None
                      else ((), {}))
    check_no_test_split(space.overrides, {p.key: p.name for p in space.params}, space.objective.metrics, error,
                        keys, prefixes, space.study.baseline)
    check_code_files(space.overrides, error, backend.code_files)


def _checked(space: Space, origin: dict[str, str]) -> Space:
    space, backend = _trainer(space, origin)
    _check_defaults(space, origin, backend)
    if space.study.strategy == "pbt" and not runs_pbt(backend):
        have, unasked = _backends_that(runs_pbt)
        raise located_error(space, origin, "study.strategy", f"pbt needs a trainer that resumes its checkpoints "
                            f"({have}{unasked}); trial.backend is {_trainer_words(space, backend)}")
    speed = space.study.kind == "throughput"
    if speed:  # a learning key is the first thing wrong with a throughput study, whatever its value
        _check_speed_keys(space, origin, backend)
    space = backend.resolve_paths(space, origin)
    backend.check(space, origin)
    if backend.answers_infeasible():  # interacting keys: a value no combination of the others makes valid
        check_combinations(space.params, lambda values: backend.infeasible(space, values),
                           lambda where, msg: located_error(space, origin, where, msg))
    space = backend.normalize(space)
    check_proxy(space, origin, backend)  # study.fidelity.proxy: model keys, the model, its tokenizer
    if speed:
        _check_trial_length(space, origin, backend)
    if space.study.confirm.test_metric and (backend.confirmation is None
                                            or not backend.confirmation.heldout_overrides(space)):
        raise located_error(space, origin, "study.confirm.test_metric", f"{space.study.confirm.test_metric!r} needs "
                            "held-out data for confirmation runs (study.confirm.test_files)")
    return space


def _check_speed_keys(space: Space, origin: dict[str, str], backend: Backend) -> None:
    """A throughput study is scored on the trainer's speed metrics and tunes (and its baseline sets) only its
    math-neutral keys."""
    speed = backend.speed
    patterns = (*(speed.keys if speed else ()), *(space.study.throughput.neutral_keys or ()))
    keys = [(f"params.{p.name}.key", p.key) for p in space.params]
    keys += [(f"study.baseline.{k}", k) for k in space.study.baseline]
    def error(where: str, msg: str) -> Exception:
        return located_error(space, origin, where, msg)

    check_speed_objective(space.objective, dict(speed.metrics) if speed else {}, speed.memory_metrics if speed else (),
                          error)
    check_speed_keys(keys, patterns, space.trial.backend if speed and speed.keys else f"trial.backend {backend.name}",
                     error)


def _check_trial_length(space: Space, origin: dict[str, str], backend: Backend) -> None:
    """A throughput trial runs more steps than its warm-up."""
    def error(where: str, msg: str) -> Exception:
        return located_error(space, origin, where, msg)

    spec = space.study.throughput
    config = backend.configure(Attempt(space=space, values=_accepted_corner(space, backend)))
    steps = config.total_steps
    if steps is None:
        raise error("overrides", "a throughput study needs a fixed trial length: set trainer.total_training_steps "
                    f"(more than study.throughput.warmup_steps={spec.warmup_steps})")
    if spec.warmup_steps >= steps:
        raise error("study.throughput.warmup_steps", f"{spec.warmup_steps}: a trial runs {steps} step(s) "
                    "(trainer.total_training_steps), so no step would be measured; the warm-up must be shorter")


def _accepted_corner(space: Space, backend: Backend) -> dict[str, Any]:
    """The first corner of the space whose values the trainer accepts together (``Backend.infeasible``); the first
    corner when it accepts none or cannot tell."""
    for combo in itertools.product(*(p.corner_values() for p in space.params)):
        values = {p.name: v for p, v in zip(space.params, combo, strict=True)}
        if backend.infeasible(space, values) is None:
            return values
    return {p.name: p.corner_values()[0] for p in space.params}


# how far a load checks: only what a trainer must be given (its defaults filled in), the backend's quick checks
# (every load of an experiment to run), or also its thorough one (before a study is made); None: a stored copy
Check = typing.Literal["defaults", "quick", "thorough"]


def load_space(name_or_path: str, overrides: typing.Sequence[str] = (), spaces_dir: Path = SPACES_DIR,
               check: bool = True, *, thorough: bool = False,
               speed_from: typing.Callable[[Space], typing.Sequence[str]] | None = None) -> Space:
    """The one loader of an experiment file the driver runs: found (a name in ``spaces_dir``, else a shipped one, or a
    path), read, changed by ``overrides`` (``--override`` texts) and parsed (:func:`hpo.experiment.read_space`), its
    backend's defaults filled in, then checked once:

    * ``check`` (default): the backend's quick checks (``Backend.check``, its refused combinations, the proxy, ...);
      False: only what a trainer must be given (a test's, a benchmark's or a report's experiment);
    * ``thorough``: also the backend's thorough check (``Backend.verify``, e.g. verl's corners composed by verl itself),
      what ``search``, ``validate`` and ``rehearse`` do before anything runs.

    ``speed_from``: for an experiment naming ``study.speed_from``, called with it (parsed, the trainer's defaults in,
    unchecked) and returning the settings of that throughput study as ``--override`` texts, applied after
    ``overrides`` and before any check (the file is then parsed once more, with them; checked once)."""
    space, origin = read_space(name_or_path, overrides, spaces_dir)
    if speed_from is not None and space.study.speed_from is not None:
        extra = speed_from(_runnable(space, origin, None))
        space, origin = read_space(name_or_path, [*overrides, *extra], spaces_dir)
    return _runnable(space, origin, "thorough" if thorough else "quick" if check else "defaults")


def stored_space(raw: dict[str, Any], source: str, name: str) -> Space:
    """The experiment stored in a study, as its backend runs it: :func:`load_space`'s steps on the stored mapping, with
    no check (it passed when the study was made); the trainer's defaults are filled in again here, so a study stored
    before a default moved into its backend (e.g. ``trial.command``) runs as it did."""
    return _runnable(parse_space(raw, source, name), {}, None)


def _runnable(space: Space, origin: dict[str, str], check: Check | None) -> Space:
    """A parsed experiment with its trainer's defaults, checked as far as ``check`` says (:data:`Check`)."""
    if check in ("quick", "thorough"):
        space = _checked(space, origin)
        if check == "thorough":
            backend_of(space).verify(space, origin)
        return space
    space, backend = _trainer(space, origin)
    if check == "defaults":
        _check_defaults(space, origin, backend)
    return backend.normalize(space)


def runs_pbt(backend: Backend) -> bool:
    """``study.strategy: pbt`` runs on ``backend``: it is ``resumable`` with PBT ``segments``."""
    return backend.resumable is not None and backend.resumable.segments is not None


def rehearsal_of(space: Space) -> Rehearsal:
    """The rehearsal of ``space``'s trainer (the ``rehearsal`` feature); SpaceError naming the trainers that have
    one."""
    tool = backend_of(space).rehearsal
    if tool is None:
        have, unasked = _backends_that(lambda b: b.rehearsal is not None)
        raise SpaceError(f"{space.source}: trial.backend is {space.trial.backend!r}: rehearse runs {have} experiments "
                         f"(trial.backend: {have}{unasked})")
    return tool


def _backends_that(does: typing.Callable[[Backend], bool]) -> tuple[str, str]:
    """The trainers whose backend ``does``, as "a or b", and "; installed plugins not asked: c, d" (a refusal imports
    no plugin: :func:`~hpo.backends._registry.backends_that`) or "" when none is installed."""
    able, unasked = backends_that(does)
    return " or ".join(able), (f"; installed plugins not asked: {', '.join(unasked)}" if unasked else "")


def _trainer_words(space: Space, backend: Backend) -> str:
    """``trial.backend`` as a refusal names it: with a word when its own ``trial.command`` makes it a plain command."""
    if backend.name != space.trial.backend:
        return f"{space.trial.backend} with a command of its own (trial.command)"
    return space.trial.backend
