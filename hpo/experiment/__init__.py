"""The experiment file: its typed schema (``Space`` and its sections), the objective, parsing and overrides, and
which parts of a stored experiment may run code on this host (``_trust``). Reads files; touches no study.

May import: ``hpo.analysis``."""

from hpo.experiment._combos import MAX_COMBINATIONS, candidates, check_combinations
from hpo.experiment._heldout import check_no_test_split, heldout_metric
from hpo.experiment._limits import check_code_files
from hpo.experiment._objective import Objective, Scored, check_metrics, parse_objective
from hpo.experiment._ray_spec import RaySpec, parse_ray
from hpo.experiment._schema import MAX_N_JOBS
from hpo.experiment._secrets import (
    ENV_REF,
    MASK,
    baseline_secrets,
    env_ref,
    is_env_ref,
    is_secret_key,
    mask_uri,
    masked,
    masked_raw,
    missing_secrets,
    secret_env_name,
    secret_overrides,
    shown_value,
    uri_secrets,
)
from hpo.experiment._space import (
    ROLLBACK_LABELS,
    SPACES_DIR,
    EarlyStopping,
    Param,
    PbtSpec,
    PrunerSpec,
    SamplerSpec,
    Space,
    SpaceError,
    StudySpec,
    TrialSpec,
    format_value,
    located_error,
    parse_rollback_rule,
    parse_space,
    read_space,
    read_yaml,
    resolve_space_path,
)
from hpo.experiment._throughput import (
    SPEED_MAX,
    SPEED_MIN,
    check_speed_keys,
    check_speed_objective,
    repeat_cap,
    speed_value_ok,
    speed_value_problem,
)
from hpo.experiment._tracking import TRACKING_FLAG_HELP, TrackingSpec, apply_flags, redact_uri
from hpo.experiment._trust import CodeRules, check_stored_experiment, experiment_digest
from hpo.experiment._yaml import load_yaml_text

__all__ = ["CodeRules", "ENV_REF", "EarlyStopping", "MASK", "MAX_COMBINATIONS", "MAX_N_JOBS", "Objective", "Param",
           "PbtSpec", "PrunerSpec", "ROLLBACK_LABELS", "RaySpec", "SPACES_DIR", "SPEED_MAX", "SPEED_MIN",
           "SamplerSpec", "Scored", "Space", "SpaceError", "StudySpec", "TRACKING_FLAG_HELP", "TrackingSpec",
           "TrialSpec", "apply_flags", "baseline_secrets", "candidates", "check_code_files", "check_combinations",
           "check_metrics", "check_no_test_split", "check_speed_keys", "check_speed_objective",
           "check_stored_experiment", "env_ref", "experiment_digest", "format_value", "heldout_metric", "is_env_ref",
           "is_secret_key", "load_yaml_text", "located_error", "mask_uri", "masked", "masked_raw", "missing_secrets",
           "parse_objective", "parse_ray", "parse_rollback_rule", "parse_space", "read_space", "read_yaml",
           "redact_uri", "repeat_cap", "resolve_space_path", "secret_env_name", "secret_overrides", "shown_value",
           "speed_value_ok", "speed_value_problem", "uri_secrets"]
