"""The experiment file's ``diagnosis:`` section as a typed spec (:class:`DiagnosisSpec`): the switch, the thresholds
and windows of each rule by which :class:`hpo.analysis._diagnosis.Diagnoser` labels a trial, and each label's stop
switch, with the help text of every field and the check of their values (:meth:`DiagnosisSpec.validate`). The rules,
their defaults and why those defaults are in :mod:`hpo.analysis._diagnosis`'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


def _meta(help: str) -> dict[str, Any]:
    return {"help": help, "choices": None}


@dataclass(frozen=True)
class DiagnosisSpec:
    """The experiment file's ``diagnosis:`` section: thresholds, windows and stop switches (see module doc)."""

    enabled: bool = field(default=True, metadata=_meta("Diagnose trials (labels and early stops); off with false."))
    stop_on_nan: bool = field(default=True, metadata=_meta("Stop a trial at its first non-finite loss or metric."))
    stop_on_kl_blowup: bool = field(default=True, metadata=_meta("Stop a trial whose KL blows up."))
    stop_on_entropy_collapse: bool = field(default=True, metadata=_meta("Stop a trial whose entropy collapses."))
    stop_on_reward_hacking: bool = field(default=False, metadata=_meta(
        "Stop a trial labelled reward_hacking (default: label only)."))
    stop_on_length_clipping: bool = field(default=False, metadata=_meta(
        "Stop a trial labelled length_clipping (default: label only)."))
    kl_factor: float = field(default=10.0, metadata=_meta("KL blowup: |KL| above factor x baseline (> 1)."))
    kl_floor: float = field(default=0.05, metadata=_meta(
        "KL blowup: lowest baseline (nats), so nothing under factor x floor is a blowup."))
    kl_window: int = field(default=10, metadata=_meta("KL blowup: baseline = median of this many last values."))
    kl_patience: int = field(default=2, metadata=_meta("KL blowup: consecutive steps above the threshold."))
    entropy_fraction: float = field(default=0.1, metadata=_meta(
        "Entropy collapse: entropy below this fraction of its start value, in (0, 1)."))
    entropy_start_steps: int = field(default=3, metadata=_meta("Entropy collapse: start value = mean of first N."))
    entropy_patience: int = field(default=3, metadata=_meta("Entropy collapse: consecutive steps below."))
    hacking_evals: int = field(default=3, metadata=_meta(
        "Reward hacking: consecutive evaluations with the objective worse and the training score higher."))
    hacking_min_drop: float = field(default=0.02, metadata=_meta(
        "Reward hacking: least total fall of the objective over those evaluations (objective units)."))
    clip_ratio_threshold: float = field(default=0.5, metadata=_meta(
        "Length clipping: the share of responses cut at the length limit (the trainer's clip_ratio metric) at or "
        "above this, in (0, 1]."))
    clip_patience: int = field(default=3, metadata=_meta("Length clipping: consecutive steps at or above."))
    util_low: float = field(default=60.0, metadata=_meta(
        "Health gpu_underused: mean GPU utilisation (%) below this after the first step."))
    util_high: float = field(default=95.0, metadata=_meta(
        "Health gpu_saturated: mean GPU utilisation (%) above this after the first step."))
    gen_fraction: float = field(default=0.7, metadata=_meta(
        "Health generation_bound: generation time over step time (the trainer's gen_time and step_time metrics) "
        "at or above this, in (0, 1]."))
    sync_fraction: float = field(default=0.3, metadata=_meta(
        "Health sync_bound: weight-sync time over step time (the trainer's sync_time and step_time metrics) at or "
        "above this, in (0, 1]."))

    def validate(self) -> list[tuple[str, str]]:
        """The problems of this spec as ``(field, message)`` pairs; ``[]`` when valid. Never raises."""
        out: list[tuple[str, str]] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool):
                continue
            if isinstance(v, float) and not math.isfinite(v):
                out.append((f.name, f"must be finite, got {v!r}"))
            elif isinstance(v, int) and v < 1:
                out.append((f.name, f"must be >= 1, got {v!r}"))
        checks = (("kl_factor", self.kl_factor > 1, "must be > 1"),
                  ("kl_floor", self.kl_floor > 0, "must be > 0"),
                  ("entropy_fraction", 0 < self.entropy_fraction < 1, "must be in (0, 1)"),
                  ("hacking_min_drop", self.hacking_min_drop >= 0, "must be >= 0"),
                  ("clip_ratio_threshold", 0 < self.clip_ratio_threshold <= 1, "must be in (0, 1]"),
                  ("util_high", 0 < self.util_low < self.util_high, "must be above util_low > 0"),
                  ("gen_fraction", 0 < self.gen_fraction <= 1, "must be in (0, 1]"),
                  ("sync_fraction", 0 < self.sync_fraction <= 1, "must be in (0, 1]"))
        bad = {name for name, _ in out}
        out += [(name, f"{msg}, got {getattr(self, name)!r}") for name, ok, msg in checks
                if not ok and name not in bad]
        return out

    def stops(self, label: str) -> bool:
        """Whether ``label`` stops a trial."""
        return bool(getattr(self, f"stop_on_{label}", False))
