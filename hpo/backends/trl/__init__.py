"""TRL's ``GRPOTrainer`` (trl==1.16.0) as a trial backend (``trial.backend: trl``, docs/trl.md): ``_backend`` is the
:class:`TrlBackend` (keys, argv and environment of an attempt, retries from Hugging Face ``checkpoint-N``
directories, seeds and the held-out split of confirmation runs); ``_keys`` the keys a TRL config may set (GRPOConfig's
fields, the launcher's own, the driver's), shared with ``_train.py``, the launcher script that runs in TRL's
interpreter (never imported by the driver: no torch, trl or transformers here).

Uses ``verl_core`` (:data:`USES`, which ``tests/hpo/test_layering.py`` reads): the launcher resolves verl_core's
built-in models and tasks (``builtin:<name>``) and scores with its rewards (``verl_core.resolve``,
``verl_core.rewards``, ``verl_core.config``), and the backend asks it the built-in models' facts
(``verl_core.resolve``, torch-free). No other backend's code.

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.analysis``, ``hpo.backends``' contract modules, ``verl_core``
(torch-free modules only in the driver)."""

from hpo.backends.trl._backend import EVAL_METRICS, LAUNCHER, ResumePoint, TrlBackend, checkpoint_complete, resume_point
from hpo.backends.trl._keys import DRIVER_KEYS, GRPO_FIELDS, LAUNCHER_KEYS, TRL_VERSION

BACKEND = TrlBackend  # what the registry runs for trial.backend: trl
USES = ("verl_core",)  # the trainer packages besides its own that this backend imports (see above)

__all__ = ["BACKEND", "DRIVER_KEYS", "EVAL_METRICS", "GRPO_FIELDS", "LAUNCHER", "LAUNCHER_KEYS", "TRL_VERSION", "USES",
           "ResumePoint", "TrlBackend", "checkpoint_complete", "resume_point"]
