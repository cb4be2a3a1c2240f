"""The experiment file: its typed schema (``Space`` and its sections), the objective, parsing and overrides, and
which parts of a stored experiment may run code on this host (``_trust``). Reads files; touches no study.

May import: ``hpo.analysis``."""

from hpo.experiment._objective import Objective, check_metrics, parse_objective
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
    load_space_origin,
    located_error,
    parse_space,
    read_space,
    read_yaml,
    space_from_stored,
)

__all__ = ["SPACES_DIR", "EarlyStopping", "Objective", "Param", "PrunerSpec", "SamplerSpec", "Space", "SpaceError",
           "StudySpec", "TrialSpec", "check_metrics", "format_value", "load_space_origin", "located_error",
           "parse_objective", "parse_space", "read_space", "read_yaml", "space_from_stored"]
