"""The experiment file: its typed schema (``Space`` and its sections), the objective, parsing and overrides, and
which parts of a stored experiment may run code on this host (``_trust``). Reads files; touches no study.

May import: ``hpo.analysis``."""

from hpo.experiment._objective import Objective, check_metrics, parse_objective
from hpo.experiment._schema import MAX_N_JOBS
from hpo.experiment._secrets import MASK, mask_uri, masked, shown_value, uri_secrets
from hpo.experiment._space import (
    SPACES_DIR,
    EarlyStopping,
    Param,
    PrunerSpec,
    SamplerSpec,
    Space,
    SpaceError,
    StudySpec,
    TrialSpec,
    format_value,
    located_error,
    parse_space,
    read_space,
    read_yaml,
)
from hpo.experiment._throughput import speed_value_ok, speed_value_problem

__all__ = ["MASK", "mask_uri", "masked", "shown_value", "uri_secrets",  # secrets (hpo.experiment._secrets)
           "MAX_N_JOBS",  # trial.n_jobs' and worker --n-jobs' cap (hpo.experiment._schema)
           "SPACES_DIR", "EarlyStopping", "Objective", "Param", "PrunerSpec", "SamplerSpec", "Space", "SpaceError",
           "StudySpec", "TrialSpec", "check_metrics", "format_value", "located_error", "parse_objective", "parse_space",
           "read_space", "read_yaml", "speed_value_ok", "speed_value_problem"]
