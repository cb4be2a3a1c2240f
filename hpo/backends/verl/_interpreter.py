"""Whether verl's interpreter can run a study's trials where they will run, a GPU or the CPU, before a verl search
or resume launches them (:func:`check_verl_launch`, judged per composed corner by :func:`interpreter_problem` from
what ``hpo/backends/verl/_compose.py`` probes), and the facts of where that is: a trial's GPUs and nodes
(:func:`trial_gpus`, :func:`trial_nodes`), its interpreter's environment (:func:`trial_base_env`) and whether it runs
on the CPU (:func:`trials_on_cpu`). Nothing here imports torch, hydra or verl.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._composer import ComposedConfig, VerlConfigError, compose_corners, space_corners
from hpo.backends.verl._cpu import PLUGIN_MODULE, cpu_overrides, transfer_queue_overrides
from hpo.backends.verl._launch import GPU_INSTALL_HINT, INSTALL_HINT, default_python, trial_gpus, trial_nodes
from hpo.execution import detect_devices

if TYPE_CHECKING:
    from hpo.experiment import Space

# In a trial's environment (trial.env): trials run a stand-in for main_ppo on the CPU (the tests), so the
# interpreter is not required to have CUDA torch, vLLM or flash-attn.
SKIP_INTERPRETER_CHECK = "VERL_HPO_SKIP_INTERPRETER_CHECK"


# ----------------------------------------------------------------------------- can this interpreter run the trials?
def interpreter_problem(interpreter: Mapping[str, Any], info: ComposedConfig, python: str,
                        cpu: bool = False) -> str | None:
    """Why ``python`` (described by ``hpo/backends/verl/_compose.py``'s ``probe_interpreter``) cannot run a trial of the
    composed config ``info``, as one line naming the fix; None when it can.

    On the CPU (``cpu``: the trials get no devices) verl runs through the CPU platform plugin
    (:mod:`hpo.backends.verl._cpu`): the interpreter needs it and, for ``rollout.name=vllm``, vLLM's CPU build under
    a ``vllm`` version that verl can read (both installed by ``make install-verl``). On a GPU:

    * torch must be a CUDA build (``make install-verl`` installs the CPU wheel);
    * ``rollout.name=vllm`` needs vLLM (``sglang`` SGLang) in the same interpreter;
    * the actor and reference load with ``override_config.attn_implementation`` (verl's default
      ``flash_attention_2``, ``workers/config/model.py``) and a critic always with ``flash_attention_2``
      (``utils/model.py`` ``load_valuehead_model``): both need the ``flash_attn`` package, which ``verl[vllm]``
      does not install.
    """
    shown = f"trial.python={python!r}"
    if cpu:
        if not interpreter.get("verl_cpu_platform"):
            return (f"the trials get no GPU, so verl runs on the CPU, but {shown} has no CPU platform plugin "
                    f"({PLUGIN_MODULE}): {INSTALL_HINT}")
        if info.rollout_name == "vllm" and "cpu" not in str(interpreter.get("vllm_version") or ""):
            return (f"actor_rollout_ref.rollout.name=vllm on the CPU needs vLLM's CPU build with a vllm version verl "
                    f"can read, and {shown} has vllm {interpreter.get('vllm_version') or '(none)'}: {INSTALL_HINT}")
        if info.rollout_name not in ("vllm", None):
            return (f"actor_rollout_ref.rollout.name={info.rollout_name}: on the CPU verl 0.9.1 can roll out with "
                    "vllm only (vLLM's CPU build; SGLang has no CPU install)")
        return None
    if not interpreter.get("torch_cuda"):
        return (f"{shown} has torch {interpreter.get('torch') or '(none)'} without CUDA, so its trials need a GPU "
                f"build: {GPU_INSTALL_HINT}; or run them on the CPU with trial.gpus_per_trial: 0")
    engine = {"vllm": ("vllm", "vLLM"), "sglang": ("sglang", "SGLang")}.get(info.rollout_name)
    if engine is not None and not interpreter.get(engine[0]):
        return (f"actor_rollout_ref.rollout.name={info.rollout_name} but {shown} has no {engine[1]}: "
                + (GPU_INSTALL_HINT if engine[0] == "vllm" else "pip install 'verl[sglang]==0.9.1' into it"))
    if not interpreter.get("flash_attn"):
        if info.strategy in ("fsdp", "fsdp2") and info.attn_implementation == "flash_attention_2":
            return (f"actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2 (verl's default) "
                    f"but {shown} has no flash_attn: add +actor_rollout_ref.model.override_config.attn_implementation"
                    "=sdpa to the overrides, or pip install flash-attn into it")
        if info.use_critic:
            return (f"algorithm.adv_estimator={info.adv_estimator} trains a critic, which verl 0.9.1 loads with "
                    f"flash_attention_2 whatever its override_config says, and {shown} has no flash_attn: "
                    "pip install flash-attn into it")
    return None


def trial_base_env(space: Space) -> dict[str, str]:
    """The environment a trial's interpreter starts from: the driver's plus ``trial.env``."""
    return {**os.environ, **space.trial.env}


def trials_on_cpu(space: Space) -> bool:
    """Whether the study's trials run verl on the CPU: a local trial that gets no devices
    (``trial.gpus_per_trial: 0``, or no GPU is visible and ``trial.devices`` names none)."""
    if space.trial.executor == "ray":  # the cluster's GPUs are logical ones (trial.ray.device: cpu) or real
        return space.trial.ray.device == "cpu"
    return space.trial.gpus_per_trial == 0 or not (space.trial.devices or detect_devices())


def check_verl_launch(space: Space, python: str | None = None, cpu: bool | None = None) -> None:
    """Before a verl search or resume launches trials: the interpreter (``trial.python``, run with the trials'
    ``trial.env``) can run every corner where the trials will run (:func:`interpreter_problem`; ``cpu``: on the
    CPU, None: :func:`trials_on_cpu`), each corner composed with what the driver adds there (the CPU platform's
    overrides, TransferQueue's size). Raises :class:`VerlConfigError` (``.where`` ``trial.python``). Skipped when the
    trials' environment sets :data:`SKIP_INTERPRETER_CHECK` (a stand-in ``main_ppo``, as some tests run)."""
    env = trial_base_env(space)
    if env.get(SKIP_INTERPRETER_CHECK, "") not in ("", "0"):
        return
    cpu = trials_on_cpu(space) if cpu is None else cpu
    python = python or space.trial.python or default_python()
    corners = [[*(cpu_overrides(c.overrides) if cpu else []), *transfer_queue_overrides(c.overrides, cpu),
                *c.overrides] for c in space_corners(space)]
    report = compose_corners(python, space.config, corners, 0 if cpu else trial_gpus(space), env=env,
                             nnodes=trial_nodes(space))
    for info in report.corners:
        problem = interpreter_problem(report.interpreter or {}, info, python, cpu)
        if problem is not None:
            raise VerlConfigError(problem, "trial.python")
    if report.first_error is not None:
        raise report.first_error
