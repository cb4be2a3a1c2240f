"""verl-hpo: an Optuna driver for trainer runs (verl_core, real verl, TRL's GRPOTrainer, or an installed plugin).

The driver never imports torch (the GP sampler, ``study.sampler.type: gp``, aside: Optuna's imports it): it talks to
a trial only through argv (config + dotted overrides), the environment (``CUDA_VISIBLE_DEVICES``) and a JSONL metrics
file in verl's ``file`` logger format.

Layers, each importing only those below it (``tests/hpo/test_layering.py``): ``analysis`` (run diagnosis, bounded file
reads) and ``record`` (the stored attributes) < ``experiment`` (the experiment file) and ``execution`` (one trial
process) < ``backends`` (the trainer contract; verl_core, verl, trl), ``storages`` (where a study lives) and
``samplers`` (GP, Latin-hypercube start, PBT, halving, fidelity) < ``study`` (the loop, recovery, confirmation) <
``reporting`` (tables, dashboard) < ``tracking`` (MLflow, W&B) < ``commands`` (one module per subcommand) < ``_cli``
(the parser and its dispatch table). Another package's names come from the package (``hpo.experiment``), never from
one of its ``_modules``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpo.analysis import Diagnoser, DiagnosisSpec
    from hpo.backends import load_space
    from hpo.execution import MetricsTail, RunResult, TrialProcess, classify_exit, kill_tree
    from hpo.experiment import Param, Space, SpaceError, parse_space
    from hpo.reporting import Reporter, best_trial, render_best, top_table
    from hpo.study import (
        Confirmed,
        Driver,
        TrialInterrupted,
        confirmed,
        load_stored,
        make_pruner,
        make_sampler,
        n_finished,
        open_study,
        queue_confirmations,
    )

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


# The layer each public name comes from, imported on its first use (PEP 562): ``verl-hpo`` (``python -m hpo``)
# imports ``hpo`` first, and most of its runs (``--help``, ``validate``, a refused flag) use no study loop, no
# report and no Optuna.
_LAYERS = {
    "analysis": ("Diagnoser", "DiagnosisSpec"),
    "backends": ("load_space",),
    "execution": ("MetricsTail", "RunResult", "TrialProcess", "classify_exit", "kill_tree"),
    "experiment": ("Param", "Space", "SpaceError", "parse_space"),
    "reporting": ("Reporter", "best_trial", "render_best", "top_table"),
    "study": ("Confirmed", "Driver", "TrialInterrupted", "confirmed", "load_stored", "make_pruner", "make_sampler",
              "n_finished", "open_study", "queue_confirmations"),
}
_HOME = {name: layer for layer, names in _LAYERS.items() for name in names}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'hpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hpo.{home}"), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
