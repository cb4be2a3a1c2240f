"""Analysis of a run's metric stream: the diagnosis labels (nan, kl_blowup, entropy_collapse, reward_hacking,
length_clipping) and their spec, read through a trainer's metric vocabulary (``_vocabulary``: :class:`MetricNames`,
which each backend fills in). Pure functions and small state machines over metrics dicts. Also, as the bottom
layer every other one may use, the one way the driver reads a file that a user or a trial names (``_files``:
regular files only, bounded reads).

May import: nothing of ``hpo`` (the bottom layer)."""

from hpo.analysis._diagnosis import HEALTHY, LABELS, Diagnoser, DiagnosisSpec
from hpo.analysis._files import FileRefused, check_regular, open_regular, read_bounded
from hpo.analysis._vocabulary import MetricNames

__all__ = ["HEALTHY", "LABELS", "Diagnoser", "DiagnosisSpec", "FileRefused", "MetricNames", "check_regular",
           "open_regular", "read_bounded"]
