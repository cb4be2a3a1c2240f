"""Analysis of a run's metric stream: the diagnosis labels (nan, kl_blowup, entropy_collapse, reward_hacking,
length_clipping) and their spec. Pure functions and small state machines over metrics dicts.

May import: nothing of ``hpo`` (the bottom layer)."""

from hpo.analysis._diagnosis import HEALTHY, LABELS, Diagnoser, DiagnosisSpec

__all__ = ["HEALTHY", "LABELS", "Diagnoser", "DiagnosisSpec"]
