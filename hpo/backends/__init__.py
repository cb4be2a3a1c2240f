"""What a trial runs, behind one contract: :class:`Backend` (``_base``), looked up by ``trial.backend`` in a
registry (``_registry``: the shipped subpackages, each one's ``BACKEND``, and the installed plugins of the entry
point group ``verl_hpo.backends``). ``verl_core/``: the default trainer (with its memory estimate, ``_memory``);
``verl/``: real verl (argv, environment, composed-config checks in verl's own interpreter, data, resume points,
its memory estimate in ``_memory``, ``verl-hpo rehearse`` in ``_rehearse``); ``trl/``: TRL's GRPOTrainer; the base
class: any command.
Also: an experiment as the driver runs it (``_check``: the schema, the backend's defaults and checks), the memory
pre-flight (``_preflight``: what every estimate shares; ``_shapes``: the model shapes, the estimate's table, the GPU
probe and the sequence lengths, no trainer's; each backend answers for its own trainer), the user-code files of an
override (``_code_files``, by each backend's keys), and a proxy model against the target's (``_fidelity``,
``_models``: ``study.fidelity.proxy``). No module here imports a trainer package (``verl_core``), and no backend
imports another (``tests/hpo/test_layering.py``).

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.analysis``."""

from hpo.backends._base import Attempt, Backend, Command, Launch, LaunchContext, TrialConfig
from hpo.backends._check import check_space, load_checked_space, load_space, rehearsal_of, stored_space
from hpo.backends._fidelity import proxy_space, transfer_factors
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
from hpo.experiment._trust import CodeRules

__all__ = ["DEFAULT_BACKEND", "ENTRY_POINT_GROUP", "Attempt", "Backend", "BackendError", "CodeRules", "Command",
           "Launch", "LaunchContext", "TrialConfig",
           "backend_label", "backend_named", "backend_of", "backends_that", "check_space", "known_backends",
           "load_checked_space", "load_space",
           "register", "rehearsal_of", "stored_space", "trial_backend", "unregister",
           "proxy_space", "transfer_factors"]  # study.fidelity.proxy (hpo.backends._fidelity)
