"""The study's Optuna objects: the seeded sampler and the pruner an experiment names, and the study itself, created
(or joined, when it exists with the same space) or loaded back from its stored space for ``resume``.

A study made by verl-hpo keeps its experiment in user attrs: ``hpo:space`` (the parsed file), ``hpo:source`` (its
path), ``hpo:space_sha256`` (:func:`hpo.experiment._trust.experiment_digest`) and ``hpo:n_trials`` (the target)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

import optuna

from hpo.backends import stored_space
from hpo.execution import driver_identity
from hpo.experiment import Param, PrunerSpec, SamplerSpec, Space, SpaceError, experiment_digest, masked_raw
from hpo.record import ATTR_DIGEST, ATTR_SOURCE, ATTR_SPACE, ATTR_TARGET
from hpo.storages import mask_url, open_storage, study_exists


def sampler_seed(base: int | None, n_existing: int, joining: bool) -> int | None:
    """A new study: the base seed (reproducible). Resumed or joined: base + existing trials, and for a
    joining driver a hash of its identity too, so that drivers starting together draw different values."""
    if base is None:
        return None
    seed = base + n_existing
    if joining:
        ident = json.dumps(driver_identity(), sort_keys=True)
        seed += int(hashlib.sha256(ident.encode()).hexdigest()[:8], 16)
    return seed % 2**32


def make_sampler(spec: SamplerSpec, n_existing: int, joining: bool = False,
                 params: Sequence[Param] = ()) -> optuna.samplers.BaseSampler:
    """Seeded by :func:`sampler_seed`. TPE imputes running trials' values (``constant_liar``; Optuna 5 makes
    it multivariate always), so parallel workers spread out instead of sampling the same point. With
    ``spec.startup == "lhs"`` and the space's ``params`` given, TPE's and GP's start-up trials are a Latin hypercube
    drawn from the base seed (:class:`hpo.samplers._startup.LatinStartSampler`)."""
    seed = sampler_seed(spec.seed, n_existing, joining)
    if spec.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    model: optuna.samplers.BaseSampler
    if spec.type == "gp":  # imports torch (CPU) into the driver: only when asked for
        from hpo.samplers import PrunedAwareGPSampler

        model = PrunedAwareGPSampler(seed=seed, n_startup_trials=spec.n_startup_trials)
    else:
        model = optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.n_startup_trials, constant_liar=True)
    if spec.startup != "lhs" or not params:
        return model
    from hpo.samplers import LatinStartSampler

    return LatinStartSampler(model, params, spec.n_startup_trials, spec.seed)


def make_pruner(spec: PrunerSpec) -> optuna.pruners.BasePruner:
    """The pruner of ``spec.type``, inside Optuna's PatientPruner when ``spec.patience`` is set. (The warm-up in
    evaluations, ``n_warmup_evals``, is applied by the driver before it asks any pruner.)"""
    inner = _base_pruner(spec)
    if spec.patience is not None and spec.type != "none":
        with warnings.catch_warnings():  # "experimental" since Optuna 2.8; stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.pruners.PatientPruner(inner, patience=spec.patience, min_delta=spec.min_delta)
    return inner


def _base_pruner(spec: PrunerSpec) -> optuna.pruners.BasePruner:
    if spec.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.n_startup_trials,
                                           n_warmup_steps=spec.n_warmup_steps, interval_steps=spec.interval_steps,
                                           n_min_trials=spec.n_min_trials)
    if spec.type == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=spec.min_resource,
                                              max_resource=spec.max_resource or "auto",
                                              reduction_factor=spec.reduction_factor)
    if spec.type == "successive_halving":
        from hpo.samplers import ChainHalvingPruner

        return ChainHalvingPruner(min_resource=spec.min_resource, reduction_factor=spec.reduction_factor)
    return optuna.pruners.NopPruner()



def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def _essentials(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: raw.get(k) for k in ("config", "overrides", "params", "objective")}


def _jsonable(raw: dict[str, Any]) -> dict[str, Any]:
    """The experiment as the study stores it: JSON, each secret masked (:func:`hpo.experiment._secrets.masked_raw`)."""
    return dict(json.loads(json.dumps(masked_raw(raw), default=str)))


def open_study(space: Space, study_name: str, storage_url: str) -> optuna.Study:
    """Create the study, or load it when it exists with the same space (else SpaceError)."""
    storage = open_storage(storage_url, space.study)
    directions = space.objective.directions
    n_existing = 0
    if study_exists(storage, study_name):
        old = optuna.load_study(study_name=study_name, storage=storage)
        stored = old.user_attrs.get(ATTR_SPACE)
        if stored is not None and _essentials(stored) != _essentials(_jsonable(space.raw)):
            raise SpaceError(f"study {study_name!r} in {mask_url(storage_url)} was made from a different space "
                             f"({old.user_attrs.get(ATTR_SOURCE)}); choose another --study or use resume")
        old_dirs = [d.name.lower() for d in old.directions]
        if old_dirs != directions:
            raise SpaceError(f"study {study_name!r} has direction(s) {', '.join(old_dirs)}, space says "
                             f"{', '.join(directions)}")
        n_existing = len(old.trials)
    study = optuna.create_study(study_name=study_name, storage=storage,
                                directions=[optuna.study.StudyDirection[d.upper()] for d in directions],
                                load_if_exists=True,
                                sampler=make_sampler(space.study.sampler, n_existing, joining=n_existing > 0,
                                                     params=space.params),
                                pruner=make_pruner(space.study.pruner))
    # each attribute on its own: a search that died half-way through creating the study is repaired by the next
    attrs = study.user_attrs
    if not study.metric_names:
        study.set_metric_names(space.objective.names)
    if ATTR_SPACE not in attrs:
        study.set_user_attr(ATTR_SPACE, _jsonable(space.raw))
    if ATTR_SOURCE not in attrs:  # absolute: resume and worker find it, and read its relative paths, from anywhere
        study.set_user_attr(ATTR_SOURCE, os.path.abspath(space.source) if os.path.isfile(space.source)
                            else space.source)
    if ATTR_DIGEST not in attrs:
        study.set_user_attr(ATTR_DIGEST, experiment_digest(_jsonable(space.raw)))
    study.set_user_attr(ATTR_TARGET, space.study.n_trials)
    return study


def load_stored(study_name: str, storage_url: str, n_trials: int | None,
                wait_s: float = 0.0, source: str | None = None) -> tuple[Space, optuna.Study]:
    """The space a study was made from, and the study opened with a sampler reseeded for resume (the storage
    waited for up to ``wait_s`` seconds when it cannot be reached: ``verl-hpo worker``). Its relative paths (a TRL
    ``config``) are read beside ``source``, the local experiment file (``--space``), as ``search`` reads them beside
    its own; by default beside the file the study was made from."""
    from hpo.experiment import StudySpec

    storage = open_storage(storage_url, StudySpec(), wait_s)
    if not study_exists(storage, study_name):
        raise SpaceError(f"no study {study_name!r} in {mask_url(storage_url)} (start one with verl-hpo search)")
    old = optuna.load_study(study_name=study_name, storage=storage)
    raw = old.user_attrs.get(ATTR_SPACE)
    if not isinstance(raw, dict):
        raise SpaceError(f"study {study_name!r} in {mask_url(storage_url)} was not made by verl-hpo (no stored space)")
    space = stored_space(raw, source or str(old.user_attrs.get(ATTR_SOURCE, "stored space")), study_name)
    target = n_trials or int(old.user_attrs.get(ATTR_TARGET, space.study.n_trials))
    space = dataclasses.replace(space, study=dataclasses.replace(space.study, n_trials=target))
    storage = open_storage(storage_url, space.study)
    study = optuna.load_study(study_name=study_name, storage=storage,
                              sampler=make_sampler(space.study.sampler, len(old.trials), joining=True,
                                                   params=space.params),
                              pruner=make_pruner(space.study.pruner))
    if n_trials is not None:
        study.set_user_attr(ATTR_TARGET, target)
    return space, study
