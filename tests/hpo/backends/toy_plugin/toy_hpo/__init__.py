"""A trainer the driver has never heard of, as a plugin (entry point group ``verl_hpo.backends``): its own command and
its own metric names. :class:`ToyBackend` writes the required core only (a basic search runs); :class:`ToyFullBackend`
adds the features a plugin may write: confirmation (its seed key), resumable (its checkpoints: retries and PBT)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpo.analysis import MetricNames
from hpo.backends import (
    Attempt,
    Backend,
    CheckpointLayout,
    Command,
    Confirmation,
    Resumable,
    TrialConfig,
)
from hpo.experiment import Space

TRAINER = Path(__file__).with_name("trainer.py")
DEFAULT_STEPS = 4


def _steps(overrides: list[str]) -> int:
    found = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "toy.steps"]
    return int(found[-1]) if found else DEFAULT_STEPS


class ToyBackend(Backend):
    """The required core: a name, a metric vocabulary, a configured attempt, its process."""

    name = "toy"
    default_command = ("python", str(TRAINER))
    metrics = MetricNames(objective="toy/quality", step_time="toy/seconds")

    def configure(self, attempt: Attempt) -> TrialConfig:
        space = attempt.space
        overrides = [*space.trainer_overrides(dict(attempt.values)),
                     *(f"{k}={v}" for k, v in attempt.extra.items()), *attempt.tail]
        return TrialConfig(overrides, _steps(overrides), "\n".join(overrides) + "\n")

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        return Command([sys.executable, str(TRAINER), "--config", attempt.space.config, "--metrics-file",
                        str(attempt.metrics), *config.overrides], dict(attempt.env))


def _step_of(checkpoint: Path) -> int | None:
    name = checkpoint.name
    return int(name[5:]) if name.startswith("ckpt-") and name[5:].isdigit() else None


def _newest(checkpoints: Path) -> int | None:
    try:
        steps = [s for d in checkpoints.iterdir() if (s := _step_of(d)) is not None and (d / "state.json").is_file()]
    except OSError:
        return None
    return max(steps, default=None)


def _resumed_from(trial_dir: Path) -> Path | None:
    try:
        argv = json.loads((trial_dir / "command.json").read_text())["argv"]
    except (OSError, ValueError, KeyError):
        return None
    return next((Path(a.partition("=")[2]) for a in reversed(argv) if a.startswith("toy.resume=")), None)


def _resume(checkpoint: Path) -> list[str]:
    return [f"toy.resume={checkpoint}"]


def _segment(space: Space, end: int, checkpoint: str | None) -> tuple[list[str], Path | None]:
    return [f"toy.steps={end}", f"toy.save_every={end}"], Path(checkpoint) if checkpoint else None


class ToyFullBackend(ToyBackend):
    """The core and two features: ``toy.seed`` for confirmation runs; ``ckpt-<step>`` checkpoints that a retry and a
    PBT segment continue from (``toy.resume``)."""

    name = "toy_full"
    confirmation = Confirmation(("toy.seed",))
    resumable = Resumable(CheckpointLayout(newest=_newest, step_dir=lambda d, step: d / f"ckpt-{step}",
                                           step_of=_step_of, resumed_from=_resumed_from), _resume, _segment)

    def configure(self, attempt: Attempt) -> TrialConfig:
        config = super().configure(attempt)
        config.overrides.append(f"toy.out={attempt.trial_dir.absolute() / 'checkpoints'}")
        return config

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        process = super().command(attempt, config)
        if attempt.resume_from is not None:
            process.argv += _resume(attempt.resume_from)
        return process
