"""A trainer's metric vocabulary: the names under which it logs what the driver reads without being told (the default
objective, the early-stopping spread, and the vital signs the diagnosis and the watch look at).

The driver never assumes a trainer's names: each backend (``Backend.metrics``, :mod:`hpo.backends`) fills in a
:class:`MetricNames`, and the layers that read metrics take it as an argument. A name a trainer does not log is
``None`` (an empty tuple for the KL terms): the rule that needs it never fires, and nothing else changes. A trainer
therefore logs its metrics under its own names; it need not rename them into verl's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricNames:
    """The names one trainer logs in its JSONL metrics file (``{"step": N, "data": {name: value}}``)."""

    objective: str | None = None  # the validation reward: ``objective.metric`` when the experiment names none
    spread: str | None = None  # its spread across the validation set: ``early_stopping.metric``'s default
    score: str | None = None  # the training batch's mean reward (reward_hacking: it rises while the objective falls)
    entropy: str | None = None  # the policy's token entropy (entropy_collapse)
    kl: tuple[str, ...] = ()  # KL terms, each judged on its own (kl_blowup)
    clip_ratio: str | None = None  # the fraction of responses cut at the length limit (length_clipping)
    response_length: str | None = None  # the mean response length (tokens)
    step_time: str | None = None  # the seconds of one training step (time saved by a stop; speed health)
    gen_time: str | None = None  # the seconds of the step spent generating (generation_bound)
    sync_time: str | None = None  # the seconds of the step spent syncing weights into the rollout engine (sync_bound)
    gpu_util: str | None = None  # GPU utilisation in percent (gpu_underused, gpu_saturated)
    mfu: str | None = None  # model FLOPs utilisation as a fraction, read when ``gpu_util`` is not logged

    @property
    def finite(self) -> tuple[str, ...]:
        """The metrics whose non-finite value is a ``nan`` diagnosis (beside every ``*loss`` key and the
        objective)."""
        return tuple(m for m in (self.entropy, *self.kl, self.score) if m is not None)
