"""An experiment's raw mapping (the file after ``--override``) validated into a :class:`~hpo.experiment._schema.Space`:
:func:`parse_space` in named steps (the top-level fields and fixed overrides, the parameters, the objective, the
sections, the rules between fields of ``study``, the launch limits, PBT's rules), one tuned parameter
(:func:`_parse_param`) and a ``study.pbt.rollback`` rule (:func:`parse_rollback_rule`).

Sections are built by :mod:`hpo.experiment._fields`; the objective, ``trial.ray``, ``study.baseline``, ``tracking``,
``study.fidelity`` (:mod:`hpo.experiment._fidelity`) and a throughput study's rules by their own modules. Every
problem raises one :class:`~hpo.experiment._errors.SpaceError` line naming the file (or the ``--override`` that set
the field), the field and the value. Nothing here reads a file; what a trainer accepts is its backend's
(:mod:`hpo.backends`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from hpo.experiment._errors import ErrorContext
from hpo.experiment._fidelity import check_fidelity, parse_fidelity
from hpo.experiment._fields import build_section
from hpo.experiment._heldout import parse_baseline
from hpo.experiment._limits import check_argv_sizes, check_param_count
from hpo.experiment._objective import Objective, parse_objective
from hpo.experiment._ray_spec import parse_ray, split_ray
from hpo.experiment._schema import (
    PARAM_FIELDS,
    ROLLBACK_LABELS,
    SECTIONS,
    TOP_FIELDS,
    EarlyStopping,
    Param,
    PbtSpec,
    Space,
    StudySpec,
    TrialSpec,
)
from hpo.experiment._secrets import baseline_refs, check_secret_value, is_secret_key, shown_value
from hpo.experiment._throughput import check_throughput, throughput_defaults
from hpo.experiment._tracking import parse_tracking

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def parse_space(raw: dict[str, Any], source: str, name: str, origin: dict[str, str] | None = None) -> Space:
    """Validate a raw mapping into a :class:`Space` against the schema (the trainer's keys and defaults are its
    backend's: :mod:`hpo.backends`)."""
    ctx = ErrorContext(source, origin or {})
    config, fixed = _top_level(raw, ctx)
    params = _params(raw, fixed, ctx)
    objective = parse_objective(raw.get("objective"), ctx.error)
    sections = _sections(raw, ctx)
    sections["study"] = dataclasses.replace(sections["study"], fidelity=parse_fidelity(
        raw["study"].get("fidelity") if isinstance(raw.get("study"), dict) else None, params, ctx.error))
    study: StudySpec = sections["study"]
    trial: TrialSpec = sections["trial"]
    early: EarlyStopping = sections["early_stopping"]
    _check_study(study, objective, ctx)
    if trial.devices is not None and not trial.devices:
        raise ctx.error("trial.devices", "expected a non-empty list or null")
    for where, msg in sections["diagnosis"].validate():
        raise ctx.error(f"diagnosis.{where}", msg)
    check_argv_sizes(fixed, params, trial, ctx)
    tracking = parse_tracking(raw.get("tracking"), ctx.error)  # MLflow / W&B (hpo.experiment._tracking)
    if study.strategy == "pbt":
        _check_pbt(study.pbt, params, objective.multi, ctx)
    check_fidelity(study.fidelity, study.strategy, study.kind, objective.multi, study.pruner.type, study.n_trials,
                   ctx.error)
    if study.kind == "throughput":
        check_throughput(objective, study.pruner.type, early.enabled, study.strategy, study.speed_from,
                         study.throughput, ctx.error)
    return Space(name=name, source=source, config=config, overrides=dict(fixed), params=params,
                 objective=objective, early_stopping=early, diagnosis=sections["diagnosis"],
                 study=study, trial=trial, tracking=tracking, raw=raw)


def _top_level(raw: dict[str, Any], ctx: ErrorContext) -> tuple[str, dict[str, Any]]:
    """No unknown top-level field, the trainer config, a throughput study's defaults filled in (in ``raw``), and the
    fixed overrides (dotted key -> a value, not a mapping): (config, fixed overrides)."""
    for key in raw:
        if key not in TOP_FIELDS:
            raise ctx.error(str(key), f"unknown field (value {shown_value(key, raw[key])}); known: "
                            f"{', '.join(TOP_FIELDS)}")
    config = raw.get("config")
    if not isinstance(config, str) or not config:
        raise ctx.error("config", f"expected a trainer config name or path, got {config!r}")
    throughput_defaults(raw)  # study.kind throughput: no pruner, no early stopping, the mean of measured steps
    fixed = raw.get("overrides") or {}
    if not isinstance(fixed, dict):
        raise ctx.error("overrides", f"expected a mapping of dotted trainer keys to values, got {fixed!r}")
    for k, v in fixed.items():
        if not isinstance(k, str) or not k:
            raise ctx.error("overrides", f"key {k!r} is not a dotted trainer key")
        check_secret_value(f"overrides.{k}", k, v, ctx.error)  # by key, its value never shown
        if isinstance(v, dict):
            raise ctx.error(f"overrides.{k}", f"expected a value, got a mapping {v!r}")
    return config, fixed


def _params(raw: dict[str, Any], fixed: dict[str, Any], ctx: ErrorContext) -> tuple[Param, ...]:
    """The tuned parameters: at least one, at most ``MAX_PARAMS``, each setting a trainer key of its own that is
    neither a secret nor a fixed override."""
    params_raw = raw.get("params")
    if not params_raw and isinstance(raw.get("study"), dict) and raw["study"].get("kind") == "throughput":
        raise ctx.error("params", "a throughput study needs at least one speed knob to tune (a micro-batch size, a "
                        "token budget, offload, gradient checkpointing, the rollout engine's batching)")
    if not isinstance(params_raw, dict) or not params_raw:
        raise ctx.error("params", f"expected a non-empty mapping of parameters, got {params_raw!r}")
    check_param_count(len(params_raw), ctx)
    params = tuple(_parse_param(n, p, ctx) for n, p in params_raw.items())
    seen: dict[str, str] = {}
    for p in params:
        if is_secret_key(p.key):
            raise ctx.error(f"params.{p.name}.key", f"{p.key!r} names a secret (a token, password or key): it is "
                            "not tuned (Optuna stores every parameter value in clear); set it as a fixed override")
        if p.key in seen:
            raise ctx.error(f"params.{p.name}.key", f"{p.key!r} is already tuned by parameter {seen[p.key]!r}")
        if p.key in fixed:
            raise ctx.error(f"params.{p.name}.key", f"{p.key!r} is also a fixed override ({fixed[p.key]!r}): a key "
                            "is fixed or tuned, not both (tuned keys are checked together, each value against the "
                            "others' where the trainer says which it refuses)")
        seen[p.key] = p.name
    return params


def _sections(raw: dict[str, Any], ctx: ErrorContext) -> dict[str, Any]:
    """Each of :data:`SECTIONS` built against the schema, with ``study.baseline`` and ``trial.ray`` parsed by their
    own modules (both are free-form in places)."""
    study_raw = raw.get("study")
    _check_secret_values(study_raw, "baseline", "study.baseline", ctx)
    _check_secret_values(raw.get("trial"), "env", "trial.env", ctx)
    baseline = parse_baseline(study_raw.get("baseline"), ctx.error) if isinstance(study_raw, dict) else {}
    baseline = baseline_refs(baseline)  # a secret as its reference: shown as that everywhere (hpo.experiment._secrets)
    trial_raw, ray_raw = split_ray(raw.get("trial"))  # trial.ray is free-form in places: parsed on its own
    free = ("baseline", "fidelity")  # parsed by their own modules
    section_raw = {"trial": trial_raw, "study": {k: v for k, v in study_raw.items() if k not in free}
                   if isinstance(study_raw, dict) else study_raw}
    sections = {s: build_section(cls, section_raw[s] if s in section_raw else raw.get(s), s, ctx)
                for s, cls in SECTIONS.items()}
    sections["trial"] = dataclasses.replace(sections["trial"], ray=parse_ray(ray_raw, ctx.error))
    sections["study"] = dataclasses.replace(sections["study"], baseline=baseline)
    return sections


def _check_secret_values(section: Any, field: str, where: str, ctx: ErrorContext) -> None:
    """Each secret key of the mapping ``section[field]`` holds one value (refused by key, its value not shown)."""
    mapping = section.get(field) if isinstance(section, dict) else None
    for k, v in (mapping.items() if isinstance(mapping, dict) else ()):
        check_secret_value(f"{where}.{k}", k, v, ctx.error)


def _check_study(study: StudySpec, objective: Objective, ctx: ErrorContext) -> None:
    """The rules between fields of ``study`` (and the objective) that no single field's type says."""
    if study.grace_period < 2 * study.heartbeat_interval:
        raise ctx.error("study.grace_period", f"{study.grace_period} is under twice study.heartbeat_interval="
                        f"{study.heartbeat_interval}: a live driver's trial would be taken for dead between beats")
    if study.budget is not None and not (math.isfinite(study.budget) and study.budget >= 1):
        raise ctx.error("study.budget", f"{study.budget}: must be at least 1 full-run equivalent (one trial's full "
                        "length); below it no trial and no confirmation run fits")
    conf = study.confirm
    if conf.race and not 2 <= conf.min_seeds <= conf.seeds:
        raise ctx.error("study.confirm.min_seeds", f"{conf.min_seeds}: a race needs 2 <= min_seeds <= "
                        f"study.confirm.seeds={conf.seeds} (an interval needs 2 seeds)")
    if conf.resolution is not None and not (math.isfinite(conf.resolution) and conf.resolution >= 0):
        raise ctx.error("study.confirm.resolution", f"{conf.resolution}: must be a finite number >= 0")
    if conf.test_metric is not None and (not conf.test_metric.strip() or conf.test_metric in objective.metrics):
        raise ctx.error("study.confirm.test_metric", f"{conf.test_metric!r}: must name the held-out metric, not the "
                        "objective's (trials are scored on validation data; the test value is only reported)")
    if study.sampler.type == "gp":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise ctx.error("study.sampler.type", "gp needs torch in the driver's environment (Optuna's GPSampler "
                            "uses it); install torch or use tpe")
    if objective.multi and study.pruner.patience is not None:
        raise ctx.error("study.pruner.patience", "not supported with objective mode pareto (its median rule is the "
                        "driver's own); use n_warmup_evals")
    if objective.multi and study.pruner.type not in ("median", "none"):
        raise ctx.error("study.pruner.type", f"{study.pruner.type!r} is not supported with objective "
                        "mode pareto (Optuna cannot report multi-objective curves); use median or none")


def _number(raw: dict[str, Any], name: str, where: str, ctx: ErrorContext, integer: bool) -> float | None:
    if name not in raw or raw[name] is None:
        return None
    v = raw[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        kind = "an integer" if integer else "a number"
        raise ctx.error(f"{where}.{name}", f"expected {kind}, got {v!r}")
    if not math.isfinite(v):
        raise ctx.error(f"{where}.{name}", f"expected a finite number, got {v!r}")
    return v



def _parse_param(name: str, raw: Any, ctx: ErrorContext) -> Param:
    """Parameter ``name`` of ``params``: its trainer key and its distribution (float, int or categorical)."""
    where = f"params.{name}"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ctx.error(where, "parameter names start with a letter and use letters, digits, _ . -")
    if not isinstance(raw, dict):
        raise ctx.error(where, f"expected a mapping like {{key: ..., type: float, low: ..., high: ...}}, got {raw!r}")
    for k in raw:
        if k not in PARAM_FIELDS:
            raise ctx.error(f"{where}.{k}", f"unknown field (value {shown_value(k, raw[k])}); known: "
                            f"{', '.join(PARAM_FIELDS)}")
    key, kind = raw.get("key"), raw.get("type")
    if not isinstance(key, str) or not key:
        raise ctx.error(f"{where}.key", f"expected a dotted trainer key, got {key!r}")
    if kind not in ("float", "int", "categorical"):
        raise ctx.error(f"{where}.type", f"{kind!r} is not one of float, int, categorical")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ctx.error(f"{where}.log", f"expected true or false, got {log!r}")
    if kind == "categorical":
        for k in ("low", "high", "log", "step"):
            if k in raw:
                raise ctx.error(f"{where}.{k}", f"not allowed with type categorical (value {raw[k]!r})")
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ctx.error(f"{where}.choices", f"expected a non-empty list, got {choices!r}")
        for c in choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise ctx.error(f"{where}.choices", f"choice {c!r} is not a scalar (null, bool, number, string)")
        if len(set(map(repr, choices))) != len(choices):
            raise ctx.error(f"{where}.choices", f"duplicate choices in {choices!r}")
        return Param(name, key, kind, choices=tuple(choices))
    if "choices" in raw:
        raise ctx.error(f"{where}.choices", f"only for type categorical (value {raw['choices']!r})")
    integer = kind == "int"
    low, high = _number(raw, "low", where, ctx, integer), _number(raw, "high", where, ctx, integer)
    step = _number(raw, "step", where, ctx, integer)
    if low is None or high is None:
        missing = "low" if low is None else "high"
        raise ctx.error(f"{where}.{missing}", f"required for type {kind}")
    if low > high:
        raise ctx.error(where, f"low={low!r} is greater than high={high!r}")
    if log and low <= 0:
        raise ctx.error(f"{where}.low", f"log scale needs low > 0, got low={low!r}")
    if log and step is not None:
        raise ctx.error(f"{where}.step", f"log and step are exclusive (step={step!r})")
    if step is not None and step <= 0:
        raise ctx.error(f"{where}.step", f"must be positive, got {step!r}")
    return Param(name, key, kind, low=low, high=high, log=log, step=step)


def _check_pbt(pbt: PbtSpec, params: tuple[Param, ...], multi: bool, ctx: ErrorContext) -> None:
    """study.strategy pbt: the knobs' ranges, explored and rollback parameters that exist (hpo.samplers._pbt; whether
    the trainer resumes checkpoints is its backend's check)."""
    names = {p.name for p in params}
    if multi:
        raise ctx.error("study.strategy", "pbt needs a single objective (it ranks members by one value)")
    if pbt.population < 2:
        raise ctx.error("study.pbt.population", f"at least 2 members, got {pbt.population}")
    if not 0 < pbt.quantile <= 0.5:
        raise ctx.error("study.pbt.quantile", f"must be in (0, 0.5], got {pbt.quantile}")
    if pbt.resample_probability > 1:
        raise ctx.error("study.pbt.resample_probability", f"must be in [0, 1], got {pbt.resample_probability}")
    if not pbt.perturb_down < 1 < pbt.perturb_up:
        raise ctx.error("study.pbt", f"perturb_down={pbt.perturb_down} must be < 1 < perturb_up={pbt.perturb_up}")
    for n in pbt.explore or ():
        if n not in names:
            raise ctx.error("study.pbt.explore", f"{n!r} is not a parameter (known: {', '.join(sorted(names))})")
    for label, rule in (pbt.rollback or {}).items():
        where = f"study.pbt.rollback.{label}"
        if label not in ROLLBACK_LABELS:
            raise ctx.error(where, f"unknown collapse label (value {rule!r}); known: {', '.join(ROLLBACK_LABELS)}")
        try:
            terms = parse_rollback_rule(rule)
        except ValueError:
            raise ctx.error(where, f"expected 'name*factor ...' with positive factors, got {rule!r}") from None
        for n, _ in terms:
            if n not in names:
                raise ctx.error(where, f"{n!r} is not a parameter (known: {', '.join(sorted(names))})")


def parse_rollback_rule(rule: str) -> list[tuple[str, float]]:
    """``'lr*0.5 kl*2'`` -> [('lr', 0.5), ('kl', 2.0)]; ValueError when malformed or a factor is not > 0."""
    out = []
    for term in rule.replace(",", " ").split():
        name, star, factor = term.partition("*")
        value = float(factor) if star else math.nan
        if not name or not math.isfinite(value) or value <= 0:
            raise ValueError(term)
        out.append((name, value))
    return out
