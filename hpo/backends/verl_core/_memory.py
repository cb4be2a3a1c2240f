"""The memory pre-flight of ``verl_core`` trials (:mod:`hpo.backends._preflight` says when it runs): the estimate of
:mod:`verl_core.memory` (pure arithmetic on the config and the model's ``config.json``: no torch, no weights) against
the trial's budget, before anything is launched.

The budget of a trial: on its GPUs the free memory (nvidia-smi) of the tightest one, lowered to
``trial.memory_limit_gb`` when set; on the CPU the available RAM, lowered to the cgroup limit and to
``trial.memory_limit_gb``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from hpo.backends._preflight import GiB, Prediction, corners, gpu_budget, report_corners, shown
from hpo.experiment import Space, SpaceError


def predict(space: Space, overrides: Sequence[str], devices: Sequence[str] = (), loaded: Any = None) -> Prediction:
    """The estimate of ``space.config`` with ``overrides`` on ``devices`` (none: CPU) against the budget; ``loaded``:
    that config already loaded (a trial's, :class:`~hpo.backends._base.TrialConfig`)."""
    from verl_core import memory
    from verl_core.config import ConfigError, load_config

    try:
        cfg = loaded if loaded is not None else load_config(space.config, list(overrides))
        device = cfg.trainer.device if cfg.trainer.device in ("cpu", "cuda") else ("cuda" if devices else "cpu")
        est = memory.estimate(cfg, device=device)
    except ConfigError as err:
        raise SpaceError(f"{space.source}: memory estimate: {err}") from None
    cap = space.trial.memory_limit_gb
    gpu = gpu_budget(devices) if device == "cuda" else None
    if gpu is not None:
        budget, source = gpu
        if cap is not None and cap * GiB < budget:
            budget, source = int(cap * GiB), f"trial.memory_limit_gb={cap}"
    else:
        avail = memory.available_bytes("cpu" if device == "cpu" else "cuda", cap)
        budget, source = avail.bytes, avail.source.replace("--memory-limit-gb ", "trial.memory_limit_gb=")
    margin = space.trial.preflight_margin
    return Prediction(est.total, budget, source, device, est.not_fitting(budget, margin),
                      est.render(budget, source))


def corner_predictions(space: Space, devices: Sequence[str]) -> list[tuple[dict[str, Any], Prediction]]:
    """Each corner of the space that verl_core's config accepts (one it refuses is never launched: a trial drawing
    it is skipped as infeasible) with its estimate on one trial's ``devices``."""
    from hpo.backends.verl_core._check import rejected

    return [(c, predict(space, space.trainer_overrides(c), devices)) for c in corners(space)
            if rejected(space, c) is None]


def validate_corners(space: Space, devices: Sequence[str], out: TextIO) -> int:
    """``verl-hpo validate`` of a verl_core space on one trial's ``devices``: each corner's config loaded (a corner
    verl_core rejects is said and skipped: a trial drawing it is not launched), its best-practice warnings and its
    estimate; 0 when all fit, else 2."""
    from verl_core.config import ConfigError, load_config
    from verl_core.validate import best_practice_warnings

    results = []
    warnings: set[str] = set()
    for values in corners(space):
        overrides = space.trainer_overrides(values)
        try:
            warnings.update(best_practice_warnings(load_config(space.config, overrides)))
        except ConfigError as err:  # the tuned values together (each is valid with others: hpo.experiment._combos)
            print(f"corner {shown(values)}: infeasible, skipped (a trial drawing it is not launched): {err}", file=out)
            continue
        results.append((values, predict(space, overrides, devices)))
    return report_corners(space, results, sorted(warnings), out)
