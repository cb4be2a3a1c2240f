"""Analysis of a run's metric stream: the diagnosis labels (nan, kl_blowup, entropy_collapse, reward_hacking,
length_clipping) and their spec, read through a trainer's metric vocabulary (``_vocabulary``: :class:`MetricNames`,
which each backend fills in). Pure functions and small state machines over metrics dicts. Also, as the bottom
layer every other one may use, the one way the driver reads a file that a user or a trial names (``_files``:
regular files only, bounded reads; a trial's files with no link followed) and the one way it checks a path it
writes (``_outputs``: a path that exists and is not a regular file is refused; the tool's own names under the studies
directory).

May import: nothing of ``hpo`` (the bottom layer)."""

from hpo.analysis._diagnosis import HEALTH_KNOBS, HEALTHY, LABELS, Diagnoser, DiagnosisSpec
from hpo.analysis._files import MAX_FILE_BYTES, FileRefused, check_regular, open_regular, read_bounded, read_trial_file
from hpo.analysis._outputs import (
    ARTIFACTS_DIR,
    BASELINES_DIR,
    REHEARSALS_DIR,
    STUDIES_DIR_NAMES,
    OutputRefused,
    check_dir_creatable,
    check_output_path,
    make_output_dir,
    reserved_study_name,
)
from hpo.analysis._vocabulary import MetricNames

__all__ = ["ARTIFACTS_DIR", "BASELINES_DIR", "Diagnoser", "DiagnosisSpec", "FileRefused", "HEALTHY", "HEALTH_KNOBS",
           "LABELS", "MAX_FILE_BYTES", "MetricNames", "OutputRefused", "REHEARSALS_DIR", "STUDIES_DIR_NAMES",
           "check_dir_creatable", "check_output_path", "check_regular", "make_output_dir", "open_regular",
           "read_bounded", "read_trial_file", "reserved_study_name"]
