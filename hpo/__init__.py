"""verl-hpo: an Optuna driver for verl_core trainer runs.

The driver never imports torch: it talks to a trial only through argv (config + dotted overrides), the
environment (``CUDA_VISIBLE_DEVICES``) and a JSONL metrics file in verl's ``file`` logger format.
"""

from hpo._confirm import Confirmed, confirmed, queue_confirmations
from hpo._diagnosis import Diagnoser, DiagnosisSpec
from hpo._driver import Driver, TrialInterrupted, load_stored, make_pruner, make_sampler, n_finished, open_study
from hpo._report import Reporter, best_trial, render_best, top_table
from hpo._runner import MetricsTail, RunResult, TrialProcess, classify_exit, kill_tree
from hpo._space import Param, Space, SpaceError, load_space, parse_space

__all__ = [
    "Confirmed",
    "Diagnoser",
    "DiagnosisSpec",
    "Driver",
    "MetricsTail",
    "Param",
    "Reporter",
    "RunResult",
    "Space",
    "SpaceError",
    "TrialInterrupted",
    "TrialProcess",
    "best_trial",
    "classify_exit",
    "confirmed",
    "kill_tree",
    "load_space",
    "load_stored",
    "make_pruner",
    "make_sampler",
    "n_finished",
    "open_study",
    "parse_space",
    "queue_confirmations",
    "render_best",
    "top_table",
]
