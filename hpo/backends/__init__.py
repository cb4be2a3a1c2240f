"""What a trial runs, behind one contract: :class:`Backend` (``_base``: a required core of four members; its optional
features in ``_features``: memory, resumable, confirmation, speed, rehearsal; one attempt's types in ``_attempt``),
looked up by ``trial.backend`` in a registry (``_registry``: the shipped subpackages, each one's ``BACKEND``, and the
installed plugins of the entry point group ``verl_hpo.backends``; a class missing a required member is refused).
``verl_core/``: the default trainer (with its memory estimate, ``_memory``);
``verl/``: real verl (argv, environment, composed-config checks in verl's own interpreter, data, resume points,
its memory estimate in ``_memory``, ``verl-hpo rehearse`` in ``_rehearse``); ``trl/``: TRL's GRPOTrainer;
:class:`CommandBackend`: any command.
Also: an experiment as the driver runs it (``_check``: :func:`load_space`, the one loader of an experiment file,
and :func:`stored_space`, a study's stored copy: the schema, the backend's defaults and checks), the memory
pre-flight (``_preflight``: what every estimate shares; ``_shapes``: the model shapes, the estimate's table, the GPU
probe and the sequence lengths, no trainer's; each backend answers for its own trainer), the user-code files of an
override (``_code_files``, by each backend's keys), and a proxy model against the target's (``_fidelity``,
``_models``: ``study.fidelity.proxy``). No module here imports a trainer package (``verl_core``), and no backend
imports another (``tests/hpo/test_layering.py``). ``testing``: the contract suite a backend
passes (importable by a plugin's tests).

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.record``, ``hpo.analysis``."""

from hpo.backends._attempt import ResumePointLike
from hpo.backends._base import Attempt, Backend, Command, CommandBackend, Launch, TrialConfig
from hpo.backends._check import load_space, rehearsal_of, stored_space
from hpo.backends._features import Confirmation, MemoryModel, PredictionLike, Rehearsal, Resumable, Speed
from hpo.backends._fidelity import proxy_space, transfer_factors
from hpo.backends._first_rollout import RECORD_ENV, REPLAY_ENV, REPORT_ENV
from hpo.backends._preflight import check_space_fits, resolve_devices, validate_space
from hpo.backends._registry import (
    DEFAULT_BACKEND,
    ENTRY_POINT_GROUP,
    BackendError,
    backend_label,
    backend_named,
    backend_of,
    backends_that,
    known_backends,
    register,
    trial_backend,
    unregister,
)
from hpo.backends._replay import CheckpointLayout, lost_checkpoints
from hpo.experiment import CodeRules

__all__ = ["Attempt", "Backend", "BackendError", "CheckpointLayout", "CodeRules", "Command", "CommandBackend",
           "Confirmation", "DEFAULT_BACKEND", "ENTRY_POINT_GROUP", "Launch", "MemoryModel", "PredictionLike",
           "RECORD_ENV", "REPLAY_ENV", "REPORT_ENV", "Rehearsal", "ResumePointLike", "Resumable", "Speed",
           "TrialConfig", "backend_label", "backend_named", "backend_of", "backends_that", "check_space_fits",
           "known_backends", "load_space", "lost_checkpoints", "proxy_space", "register", "rehearsal_of",
           "resolve_devices", "stored_space", "transfer_factors", "trial_backend", "unregister", "validate_space"]
