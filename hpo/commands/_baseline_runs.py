"""``verl-hpo confirm --baseline-runs PATH[:seed=N] ...``: the runs a user already made of ``study.baseline`` (their
hand-tuned config) imported as the baseline's runs of the confirmation, so a fresh host need not make them again.

PATH is a metrics file in verl's file-logger format (one ``{"step": N, "data": {...}}`` line per step; verl writes it
at ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``) or a run directory holding one (``metrics.jsonl``, else its
only ``*.jsonl``: a verl-hpo trial directory, a hydra run directory). What the run ran is read, when present, from a
record beside the file: ``config.yaml`` (a verl-hpo trial's ``{config, overrides}``, or a composed config) or hydra's
``.hydra/overrides.yaml``. Its seed is ``:seed=N`` or, without it, the record's value of the study's seed key.

Every run is checked before any is imported (a mismatch is one line naming the file and the key, exit 2, nothing
imported): its seed is one of the confirmation's seeds, and no other file names it; the record's values of the keys a
baseline run of the study sets (the experiment's fixed overrides, the baseline's, the seed keys; its held-out keys
where the objective is measured on them) are the study's, and it sets no key the study does not (an override record;
the keys the backend sets for each run itself, like a checkpoint directory, are not compared; seed keys the record
leaves unset are not either, nor secrets); the file's last step is the study's total steps; the objective's metrics
are logged, finite, at its last step and at the steps the study's own full runs evaluate. Without a record, only the
seed, steps and objective are checked, and ``confirm`` says so. The file is untrusted input: a regular file of at most
``hpo.record``'s metrics cap, each line read like a trial's (:func:`hpo.execution.parse_line`: steps 0..2^31, numbers
only; a step's first line counts), the value and curve computed by the objective as a trial's
(:meth:`~hpo.experiment.Objective.evaluate`, ``aggregated``). A run is added the way a kept run is, as a finished
baseline run (user attrs ``baseline_imported``: its path, ``baseline_imported_sha256``; :func:`~hpo.study._confirm.
add_imported_baseline`); the same file (its sha256) is imported once, whoever imports it.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import optuna
import yaml
from optuna.trial import TrialState

from hpo.analysis import FileRefused, read_bounded
from hpo.backends import Attempt, backend_of
from hpo.execution import parse_line
from hpo.experiment import Space, SpaceError, format_value, is_secret_key, load_yaml_text
from hpo.record import ATTR_CONFIRM_SEED, ATTR_RACE, MAX_METRICS_BYTES, full_steps, is_confirm
from hpo.study import (
    IMPORTED,
    IMPORTED_SHA256,
    add_imported_baseline,
    baseline_runs_on,
    confirm_overrides,
    confirm_seeds,
    heldout_metric_of,
    heldout_overrides,
    seed_keys,
)

MAX_RECORD_BYTES = 1 << 20
RECORDS = ("config.yaml", ".hydra/overrides.yaml")  # a run's record of what it ran, beside its metrics file
_SPEC = re.compile(r"(?s)(.+):seed=([+-]?[0-9]{1,12})")
_MISSING = object()
Note = Callable[[str], None]


@dataclass(frozen=True)
class Record:
    """What a run's record says it ran: override texts by key (``overrides``: an override list, which names every key
    it set) or a composed config (``overrides`` None: ``config`` holds it); the config name an override record
    names."""

    where: Path
    overrides: dict[str, str] | None
    config: Any


@dataclass(frozen=True)
class Run:
    """A checked run, ready to import."""

    shown: str  # its path as the user gave it
    metrics: Path
    seed: int
    digest: str
    value: float
    curve: dict[int, float]
    attrs: dict[str, Any]


def _refuse(shown: str, what: str) -> NoReturn:
    raise SpaceError(f"--baseline-runs {shown}: {what}")


def import_baseline_runs(study: optuna.Study, space: Space, specs: list[str], n_seeds: int, note: Note) -> None:
    """Check every run of ``specs`` against the study's experiment, then add each as a finished baseline run (see the
    module docstring); SpaceError (one line, nothing imported) on the first that does not match."""
    if not space.study.baseline:
        raise SpaceError(f"--baseline-runs: the experiment {space.source} has no study.baseline to import runs of")
    if space.study.kind == "throughput" or space.study.strategy == "pbt" or space.objective.multi:
        raise SpaceError("--baseline-runs: only a learning study's single-objective confirmation has baseline runs "
                         f"(study {study.study_name!r} is {_kind(space)})")
    settings = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    if isinstance(settings, dict) and isinstance(settings.get("max_seeds"), int):
        n_seeds = max(1, settings["max_seeds"])  # a race already started: its seeds
    seeds = confirm_seeds(space, n_seeds)
    runs = [checked_run(study, space, spec, seeds) for spec in specs]
    for run in _to_import(study, runs, note):
        added = add_imported_baseline(study, run.seed, run.value, run.curve, run.attrs)
        if added is None:
            note(f"--baseline-runs {run.shown}: seed {run.seed} got a baseline run from another driver meanwhile; "
                 "not imported")
            continue
        checked = "" if run.attrs.get("baseline_imported_record") else (
            f"; no record of what it ran beside it ({' or '.join(RECORDS)}): its seed, steps and objective were "
            "checked, not its keys")
        note(f"--baseline-runs {run.shown}: imported as the baseline's run on seed {run.seed} (trial {added.number}, "
             f"value {run.value:.4g}): not run here{checked}")


def _kind(space: Space) -> str:
    if space.study.kind == "throughput":
        return "a throughput study: your config is timed beside the picks on this host"
    return "a pbt study: its confirmation has no baseline" if space.study.strategy == "pbt" else "multi-objective"


def _to_import(study: optuna.Study, runs: list[Run], note: Note) -> list[Run]:
    """The runs not imported yet, once each; SpaceError when two files name one seed, one file two seeds, or a seed
    already has a baseline run of its own (started or finished)."""
    out: dict[str, Run] = {}
    imported = {t.user_attrs.get(IMPORTED_SHA256): t for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)) if t.user_attrs.get(IMPORTED_SHA256)}
    for run in runs:
        twin = out.get(run.digest)
        if twin is not None and twin.seed != run.seed:
            _refuse(run.shown, f"the same run as {twin.shown}, named seed {run.seed} and seed {twin.seed}")
        other = next((r for r in out.values() if r.seed == run.seed and r.digest != run.digest), None)
        if other is not None:
            _refuse(run.shown, f"seed {run.seed} is named by {other.shown} too")
        done = imported.get(run.digest)
        seed = done.system_attrs.get(ATTR_CONFIRM_SEED) if done is not None else None
        if done is not None and seed != run.seed:
            _refuse(run.shown, f"imported as seed {seed} already (trial {done.number}), not seed {run.seed}")
        if done is not None:
            note(f"--baseline-runs {run.shown}: already imported (trial {done.number}); not imported again")
            continue
        own = [t for t in baseline_runs_on(study, run.seed) if t.state != TrialState.WAITING]
        if own:
            state = "finished" if own[0].state == TrialState.COMPLETE else "running"
            _refuse(run.shown, f"seed {run.seed} already has a baseline run (trial {own[0].number}, {state})")
        out.setdefault(run.digest, run)
    return list(out.values())


# ----------------------------------------------------------------------------- one run, checked
def checked_run(study: optuna.Study, space: Space, spec: str, seeds: list[int]) -> Run:
    """The run ``spec`` names, checked against the study's baseline run on its seed; SpaceError naming the key."""
    m = _SPEC.fullmatch(spec)
    shown, stated = (m.group(1), int(m.group(2))) if m else (spec, None)
    metrics, folder = _locate(shown)
    try:
        named = "" if folder == metrics.parent and not Path(shown).expanduser().is_dir() else f": {metrics.name}"
        data = read_bounded(metrics, f"--baseline-runs {shown}{named}", MAX_METRICS_BYTES)
    except FileRefused as err:
        raise SpaceError(str(err)) from None
    except OSError as err:
        _refuse(shown, f"cannot read {metrics} ({err.strerror or err})")
    lines: dict[int, dict[str, float]] = {}
    for raw in data.splitlines():
        parsed = parse_line(raw)
        if parsed is not None and parsed[0] not in lines:  # a step's first line, as the driver counts it
            lines[parsed[0]] = parsed[1]
    if not lines:
        _refuse(shown, 'no metrics line ({"step": N, "data": {...}}, verl\'s file logger)')
    record = _record(folder, shown)
    seed = _seed(space, shown, stated, record, seeds)
    config = backend_of(space).configure(Attempt(space=space, extra=confirm_overrides(space, seed, baseline=True)))
    heldout_keys = set(heldout_overrides(space))
    on_heldout = heldout_metric_of(space) in space.objective.metrics  # the objective itself is read on it
    if record is not None:
        _check_keys(space, shown, record, config.overrides, seed, heldout_keys if not on_heldout else set())
    total = config.total_steps or full_steps(study.get_trials(deepcopy=False))
    value, curve = _scored(study, space, shown, lines, total)
    attrs: dict[str, Any] = {
        IMPORTED: os.path.abspath(metrics), IMPORTED_SHA256: hashlib.sha256(data).hexdigest(),
        "confirm_of": "baseline", "confirm_seed": seed, "last_step": max(lines), "total_steps": total or max(lines)}
    if record is not None:
        attrs["baseline_imported_record"] = os.path.abspath(record.where)
    test = heldout_metric_of(space)
    if test is not None and (record is not None or not on_heldout):  # else: validation or test? not known
        found = [(s, d[test]) for s, d in lines.items() if test in d and math.isfinite(d[test])]
        if found:
            attrs.update(test_value=max(found)[1], test_metric=test)
    return Run(shown, Path(attrs[IMPORTED]), seed, attrs[IMPORTED_SHA256], value, curve, attrs)


def _locate(shown: str) -> tuple[Path, Path]:
    """The metrics file ``shown`` names and the directory its record would be in."""
    path = Path(shown).expanduser()
    if not os.path.lexists(path):
        _refuse(shown, "no such file or directory")
    if not path.is_dir():
        return path, path.parent
    named = path / "metrics.jsonl"
    found = [named] if os.path.lexists(named) else sorted(path.glob("*.jsonl"))[:2]
    if len(found) != 1:
        _refuse(shown, "a run directory holds its metrics file as metrics.jsonl or as its only *.jsonl"
                       f" ({'several' if found else 'none'} found)")
    return found[0], path


def _record(folder: Path, shown: str) -> Record | None:
    """The first record beside the metrics file that says what the run ran (:data:`RECORDS`), or None."""
    for name in RECORDS:
        path = folder / name
        if not os.path.lexists(path):
            continue
        try:
            raw = load_yaml_text(read_bounded(path, f"--baseline-runs {shown}: {path}", MAX_RECORD_BYTES).decode())
        except FileRefused as err:
            raise SpaceError(str(err)) from None
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
            _refuse(shown, f"{path}: not a readable YAML record ({type(err).__name__})")
        listed = raw.get("overrides") if isinstance(raw, dict) else raw
        if isinstance(listed, list) and all(isinstance(o, str) for o in listed):
            return Record(path, _override_map(listed), raw.get("config") if isinstance(raw, dict) else None)
        if isinstance(raw, dict):
            return Record(path, None, raw)  # a composed config (verl_core's trial record)
    return None


def _override_map(texts: list[str]) -> dict[str, str]:
    """``key=value`` texts by key (a ``+``/``++`` prefix dropped, the last of a key kept; ``~key`` a deletion)."""
    out: dict[str, str] = {}
    for text in texts:
        key, eq, value = text.partition("=")
        deleted = key.startswith("~")
        out[key.lstrip("+~")] = "~deleted" if deleted else value if eq else ""
    return out


def _lookup(record: Record, key: str) -> Any:
    """The record's value of ``key`` (its text, for an override record), or :data:`_MISSING`."""
    if record.overrides is not None:
        return record.overrides.get(key, _MISSING)
    node: Any = record.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _seed(space: Space, shown: str, stated: int | None, record: Record | None, seeds: list[int]) -> int:
    """The run's seed: ``:seed=N``, else the record's first seed key; each seed key the record sets must agree."""
    named = ", ".join(map(str, seeds))
    recorded = {k: _norm(v) for k in seed_keys(space) if record is not None
                and (v := _lookup(record, k)) is not _MISSING}
    seed = stated if stated is not None else next((v for v in recorded.values() if isinstance(v, int)), None)
    if seed is None:
        _refuse(shown, f"no seed: name the one it ran as {shown}:seed=N (the confirmation's seeds: {named})")
    for key, value in recorded.items():
        if value != seed:
            _refuse(shown, f"{key} {_shown(value)}, the run is named seed {seed}")
    if seed not in seeds:
        _refuse(shown, f"seed {seed} is not one of the confirmation's seeds ({named})")
    return seed


def _check_keys(space: Space, shown: str, record: Record, overrides: list[str], seed: int,
                optional: set[str]) -> None:
    """The record against a baseline run's overrides on ``seed`` (``optional``: held-out keys the record may leave
    unset or null)."""
    study_sets = {*(o.partition("=")[0].lstrip("+~") for o in space.trainer_overrides({})),
                  *confirm_overrides(space, seed, baseline=True)}
    expected = _override_map(overrides)
    own = set(expected) - study_sets  # what the backend sets for each run (a checkpoint directory): not compared
    if record.overrides is not None and isinstance(record.config, str) and record.config != space.config:
        _refuse(shown, f"config {record.config[:200]}, the study runs {space.config}")
    for key, text in expected.items():
        if key in own or is_secret_key(key):
            continue
        got = _lookup(record, key)
        if got is _MISSING and (key in optional or key in seed_keys(space)):
            continue
        if got is _MISSING:
            _refuse(shown, f"{key} not set (the trainer's default), the study runs {_shown(_norm(text))}")
        if not _same(_norm(got), _norm(text)) and not (key in optional and _norm(got) is None):
            _refuse(shown, f"{key} {_shown(_norm(got))}, the study runs {_shown(_norm(text))}")
    for key, text in (record.overrides or {}).items():
        if key not in expected and not is_secret_key(key):
            _refuse(shown, f"{key} {_shown(_norm(text))}, the study does not set it")


def _norm(value: Any) -> Any:
    """An override's text as the value it sets (YAML scalar syntax); anything else as it is."""
    if not isinstance(value, str):
        return value
    try:
        return load_yaml_text(value) if len(value) <= 10_000 else value
    except (yaml.YAMLError, RecursionError):
        return value


def _same(a: Any, b: Any) -> bool:
    """Equal values: numbers by value (``1e-6`` and ``1e-06`` alike), paths to the same existing file."""
    if a == b and type(a) is type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                          and not isinstance(a, bool) and not isinstance(b, bool) and a == b):
        return True
    if isinstance(a, str) and isinstance(b, str):
        try:
            return float(a) == float(b)
        except ValueError:
            pass
        try:
            return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
        except (OSError, ValueError):
            return False
    return False


def _shown(value: Any) -> str:
    text = format_value(value) if isinstance(value, (bool, int, float, list, tuple)) or value is None else str(value)
    return text if len(text) <= 120 else text[:120] + "..."


# ----------------------------------------------------------------------------- its steps and objective
def _scored(study: optuna.Study, space: Space, shown: str, lines: dict[int, dict[str, float]],
            total: int | None) -> tuple[float, dict[int, float]]:
    """The run's value and curve as a trial's (its evaluations in step order, the objective's aggregate at each),
    after checking its steps and evaluations against the study's."""
    last = max(lines)
    if total and last != total:
        _refuse(shown, f"its last step is {last}, the study runs {total} steps")
    objective = space.objective
    needed = [t.metric for t in objective.terms] if objective.mode == "weighted" else [objective.metric]
    evals: dict[int, float] = {}
    for step in sorted(lines):
        scored = objective.evaluate(lines[step])
        if scored is None:
            continue
        if not all(math.isfinite(v) for v in scored[0]):
            _refuse(shown, f"the objective ({', '.join(needed)}) is not a finite number at step {step}")
        evals[step] = float(scored[0][0])
    missing = next((m for m in needed if not any(m in d for d in lines.values())), None)
    if missing is not None or not evals:
        _refuse(shown, f"no line logs the objective's metric {missing or needed[0]}")
    if last not in evals:
        _refuse(shown, f"the objective's metric {', '.join(needed)} is not logged at its last step {last}")
    ref = _eval_steps(study, last)
    if ref is not None and tuple(evals) != ref:
        _refuse(shown, f"logs the objective at steps {_steps(tuple(evals))}, the study's runs at {_steps(ref)}")
    history = [[v] for v in evals.values()]
    curve = {s: float(objective.aggregated(history[:i + 1])[0]) for i, s in enumerate(evals)}
    value = curve[last]
    if not all(math.isfinite(v) for v in curve.values()):
        _refuse(shown, "its objective's aggregate is not a finite number")
    return value, curve


def _eval_steps(study: optuna.Study, total: int) -> tuple[int, ...] | None:
    """The steps the study's own finished runs of ``total`` steps evaluated at (the most common), or None."""
    found = Counter(tuple(sorted(t.intermediate_values)) for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)) if t.intermediate_values
        and max(t.intermediate_values) == total and not t.user_attrs.get(IMPORTED)
        and (not is_confirm(t) or not t.user_attrs.get("baseline_reused")))
    return found.most_common(1)[0][0] if found else None


def _steps(steps: tuple[int, ...]) -> str:
    return ",".join(map(str, steps)) if len(steps) <= 12 else ",".join(map(str, steps[:12])) + ",..."
