"""Will a trial fit? The memory estimate of :mod:`verl_core.memory` (pure arithmetic on the config and the
model's ``config.json``: no torch, no weights) against the trial's budget, before anything is launched.

* Per trial (``trial.preflight: true``, default-command studies): a trial whose estimate times
  ``1 + trial.preflight_margin`` exceeds its budget is not launched; it is recorded with the worst value
  and ``fail_reason=predicted_oom`` (``predicted_memory_gb``, ``memory_budget_gb``, ``memory_problem``).
* Per space: when every corner of the space is predicted not to fit, the search is refused before the
  study is created (one line naming the smallest corner's culprit).
* ``verl-hpo validate --space``: every corner's checks, warnings and estimate, exit 0 / 2.

The budget of a trial: on its GPUs the free memory (nvidia-smi) of the tightest one, lowered to
``trial.memory_limit_gb`` when set; on the CPU the available RAM, lowered to the cgroup limit and to
``trial.memory_limit_gb``.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpo._space import Space, SpaceError

MAX_CORNERS = 64
GiB = 2**30


@dataclass(frozen=True)
class Prediction:
    """One config's estimate against its budget."""

    total: int
    budget: int
    budget_source: str
    device: str
    problem: str | None  # None when it fits (margin included)
    table: str

    @property
    def fits(self) -> bool:
        return self.problem is None


def _gpu_budget(devices: Sequence[str]) -> tuple[int, str] | None:
    from verl_core import memory

    gpus = memory.gpu_memory()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = [d.strip() for d in visible.split(",")] if visible is not None else [str(i) for i in range(len(gpus))]
    free = [gpus[order.index(d)][0] for d in devices if d in order and order.index(d) < len(gpus)]
    if not free:
        return None
    return min(free), f"free memory of GPU {','.join(devices)} (nvidia-smi)"


def predict(space: Space, overrides: Sequence[str], devices: Sequence[str] = ()) -> Prediction:
    """The estimate of ``space.config`` with ``overrides`` on ``devices`` (none: CPU) against the budget."""
    from verl_core import memory
    from verl_core.config import ConfigError, load_config

    try:
        cfg = load_config(space.config, list(overrides))
        device = cfg.trainer.device if cfg.trainer.device in ("cpu", "cuda") else ("cuda" if devices else "cpu")
        est = memory.estimate(cfg, device=device)
    except ConfigError as err:
        raise SpaceError(f"{space.source}: memory estimate: {err}") from None
    cap = space.trial.memory_limit_gb
    gpu = _gpu_budget(devices) if device == "cuda" else None
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


def corners(space: Space) -> list[dict[str, Any]]:
    """Every parameter at its ends (or each choice), jointly; at most MAX_CORNERS."""
    combos = itertools.islice(itertools.product(*(p.corner_values() for p in space.params)), MAX_CORNERS)
    return [{p.name: v for p, v in zip(space.params, combo, strict=True)} for combo in combos]


def _shown(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items())


def check_space_fits(space: Space, devices: Sequence[str]) -> None:
    """SpaceError when no corner of the space is predicted to fit (a study that could only record failures)."""
    if not (space.trial.preflight and space.trial.is_default_command):
        return
    per_trial = list(devices[: space.trial.gpus_per_trial])
    predictions = [(c, predict(space, space.trainer_overrides(c), per_trial)) for c in corners(space)]
    if predictions and not any(p.fits for _, p in predictions):
        values, smallest = min(predictions, key=lambda cp: cp[1].total)
        raise SpaceError(f"{space.source}: every corner of the space is predicted not to fit in memory (smallest: "
                         f"{_shown(values)} {smallest.problem}); lower the batch sizes or raise "
                         "trial.memory_limit_gb, or set trial.preflight: false")


def validate_space(space: Space, devices: Sequence[str], out: Any) -> int:
    """Print every corner's verdict (and the largest corner's table); 0 when all fit, else 2 with one line."""
    from verl_core.config import ConfigError, load_config
    from verl_core.validate import best_practice_warnings

    if space.trial.is_verl:
        print(f"{space.source}: every corner composed and checked with verl's own config code "
              f"({space.trial.python or 'the verl venv'}); no memory estimate for verl configs yet", file=out)
        print("All checks passed", file=out)
        return 0
    if not space.trial.is_default_command:
        print(f"{space.source}: trial.command is not the default trainer: only the space itself was checked",
              file=out)
        print("All checks passed", file=out)
        return 0
    per_trial = list(devices[: space.trial.gpus_per_trial])
    worst: tuple[dict[str, Any], Prediction] | None = None
    bad: list[tuple[dict[str, Any], Prediction]] = []
    warnings: set[str] = set()
    for values in corners(space):
        overrides = space.trainer_overrides(values)
        try:
            warnings.update(best_practice_warnings(load_config(space.config, overrides)))
        except ConfigError as err:
            raise SpaceError(f"{space.source}: {_shown(values)}: {err}") from None
        pred = predict(space, overrides, per_trial)
        verdict = "fits" if pred.fits else "DOES NOT FIT"
        print(f"corner {_shown(values)}: {pred.total / GiB:.3f} GiB of {pred.budget / GiB:.3f} GiB "
              f"({pred.budget_source}) on {pred.device}: {verdict}", file=out)
        if worst is None or pred.total > worst[1].total:
            worst = (values, pred)
        if not pred.fits:
            bad.append((values, pred))
    for w in sorted(warnings):
        print(f"warning: {w}", file=out)
    if worst is not None:
        print(f"\nlargest corner ({_shown(worst[0])}):\n{worst[1].table}\n", file=out)
    if bad:
        values, pred = bad[0]
        print(f"error: {space.source}: {len(bad)} corner(s) predicted not to fit in memory; first: {_shown(values)} "
              f"{pred.problem}", file=sys.stderr)
        return 2
    print("All checks passed", file=out)
    return 0
