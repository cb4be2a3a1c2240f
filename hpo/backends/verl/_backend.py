"""Real verl as a :class:`~hpo.backends._base.Backend`: the argv, environment and scratch of an attempt
(``_launch``), the composed-config check in verl's interpreter (``_check``), and its features: ``resumable`` (the
retry's resume point, ``_resume``; PBT segments from the weights of a checkpoint), ``memory`` (``_memory``),
``confirmation`` (its seed keys, every seed of a run: ``_compose_checks.SEED_KEYS``; the held-out split,
``study.confirm.test_files`` validated beside ``data.val_files`` and read by its data source,
``study.confirm.test_metric``, or swapped for it), ``speed`` (its math-neutral keys) and ``rehearsal``
(``verl-hpo rehearse``: ``_rehearsal``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

from hpo.analysis import MetricNames
from hpo.backends._attempt import Attempt, Command, TrialConfig
from hpo.backends._base import Backend, config_text, int_override
from hpo.backends._code_files import code_files
from hpo.backends._features import Confirmation, PredictionLike, Resumable, SequenceLengths, Speed
from hpo.backends._models import ModelFacts
from hpo.backends.verl._arith import MODELS as ARITH_MODELS
from hpo.backends.verl._arith import arith_dir
from hpo.backends.verl._compose_checks import SEED_KEYS
from hpo.backends.verl._data import resolve_path, split_list
from hpo.backends.verl._launch import (
    DROPPED_ROW_PATTERNS,
    MAIN_MODULE,
    RAY_START_TIMEOUT,
    default_python,
    format_override,
    scratch_dir,
    verl_argv,
    verl_cleanup,
    verl_command_env,
    verl_command_line,
    verl_env,
    verl_job_env,
    verl_metrics_path,
    verl_overrides,
    weights_only_overrides,
)
from hpo.backends.verl._memory import corner_predictions, predict_verl, validate_verl
from hpo.backends.verl._ray import job_checkpoints
from hpo.backends.verl._rehearsal import VerlRehearsal
from hpo.backends.verl._resume import LAYOUT
from hpo.experiment import MASK, Space, SpaceError, is_secret_key, located_error

# verl 0.9.1's defaults of its seed keys (verl/trainer/config/_generated_ppo_trainer.yaml); data.seed is null.
SEED_DEFAULTS = {"actor_rollout_ref.rollout.seed": 42, "actor_rollout_ref.actor.data_loader_seed": 42,
                 "critic.data_loader_seed": 42}
STEPS_KEY = "trainer.total_training_steps"
# verl 0.9.1's keys that change speed and memory, not the update (ppo_trainer.yaml; perf_tuning.rst's five
# families): per-GPU micro-batches and token budgets, padding removal, checkpointing and offload, FSDP's
# prefetch and resharding, the rollout engine's memory, batching and parallelism, worker counts
SPEED_KEYS = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz",
    "critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu",
    "reward_model.micro_batch_size_per_gpu", "reward_model.use_dynamic_bsz",
    "reward_model.forward_max_token_len_per_gpu",
    "actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding",
    "actor_rollout_ref.model.enable_gradient_checkpointing", "critic.model.enable_gradient_checkpointing",
    "actor_rollout_ref.model.enable_activation_offload", "critic.model.enable_activation_offload",
    "actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.actor.entropy_checkpointing",
    "actor_rollout_ref.*.fsdp_config.param_offload", "actor_rollout_ref.*.fsdp_config.optimizer_offload",
    "actor_rollout_ref.*.fsdp_config.offload_policy", "actor_rollout_ref.*.fsdp_config.forward_prefetch",
    "actor_rollout_ref.*.fsdp_config.reshard_after_forward",
    "critic.fsdp.param_offload", "critic.fsdp.optimizer_offload", "critic.fsdp.offload_policy",
    "critic.fsdp.forward_prefetch", "critic.fsdp.reshard_after_forward",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes", "actor_rollout_ref.rollout.free_cache_engine",
    "actor_rollout_ref.rollout.enable_prefix_caching", "actor_rollout_ref.rollout.agent.num_workers",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    "reward.num_workers", "data.dataloader_num_workers",
)


def resume_overrides(checkpoint: Path) -> list[str]:
    """A verl run that continues from ``checkpoint`` (what :func:`verl_argv` adds for ``resume_from``)."""
    return [format_override("trainer.resume_mode", "resume_path"),
            format_override("trainer.resume_from_path", str(checkpoint))]


def save_overrides(step: int) -> list[str]:
    """A run that also saves at ``step`` (its multiples and the last step too): ``trainer.save_freq``. verl 0.9.1's
    ``RayPPOTrainer.fit`` saves (``_save_checkpoint``, synchronous) before it logs the step's metrics."""
    return [f"trainer.save_freq={int(step)}"]


def segment_overrides(space: Space, end: int, checkpoint: str | None) -> tuple[list[str], Path | None]:
    """A PBT segment: trains to step ``end`` and saves there; :func:`verl_argv` adds resume_mode=resume_path and
    resume_from_path; the weights only, so that the config's learning rate wins over the restored optimizer's
    (``_launch``)."""
    out = [f"{STEPS_KEY}={end}", f"trainer.save_freq={end}"]
    if not checkpoint:
        return out, None
    return [*out, *weights_only_overrides()], Path(checkpoint)


class VerlMemory:
    """verl's memory model (:mod:`hpo.backends.verl._memory`): each corner composed in verl's interpreter, judged by
    its GPU estimate."""

    def predict(self, space: Space, config: TrialConfig, devices: Sequence[str]) -> PredictionLike | None:
        """A throughput study's trial on GPUs: its own composed config against the GPUs' free memory (a learning
        study's space is judged whole before it starts, :meth:`corner_predictions`). On the CPU verl's GPU estimate
        says nothing about the trial: None."""
        if space.study.kind != "throughput" or not devices:
            return None
        from hpo.backends.verl._model_config import ModelConfigUnavailable

        try:
            return predict_verl(space, config.overrides, devices)
        except ModelConfigUnavailable:  # no config.json here without a download: the trial runs unjudged
            return None

    def corner_predictions(self, space: Space, devices: Sequence[str], lengths: SequenceLengths | None = None
                           ) -> Sequence[tuple[dict[str, Any], PredictionLike]] | None:
        """Every corner composed by verl and judged at the expected ``lengths`` (else the prompts measured from the
        data; :mod:`hpo.backends.verl._memory`); None when the model's ``config.json`` is not here without a
        download."""
        return corner_predictions(space, devices, lengths)

    def sequence_lengths(self, path: Path) -> SequenceLengths:
        from hpo.backends._preflight import read_lengths
        from hpo.backends.verl._memory_model import LENGTH_METRICS

        return read_lengths(path, *LENGTH_METRICS)

    def validate(self, space: Space, devices: Sequence[str], out: TextIO,
                 lengths: SequenceLengths | None = None) -> int:
        """Every prompt of the data against ``data.max_prompt_length`` and each corner's estimate
        (:func:`~hpo.backends.verl._memory.validate_verl`)."""
        return validate_verl(space, devices, out, lengths)


@dataclasses.dataclass(frozen=True)
class VerlConfirmation(Confirmation):
    """Every seed of a verl run (each checked to exist in verl 0.9.1's composed config) at verl's defaults; the
    held-out split through ``data.val_files``; no version known from the driver."""

    def default_seed(self, space: Space, key: str) -> int | None:
        return SEED_DEFAULTS.get(key)

    def heldout_overrides(self, space: Space) -> dict[str, Any]:
        """``data.val_files``: the validation files and the test files (``study.confirm.test_metric`` set: verl logs
        each data source's metrics apart), else the test files alone."""
        files = space.study.confirm.test_files
        if not files:
            return {}
        if space.study.confirm.test_metric:
            return {"data.val_files": [*split_list(space.overrides.get("data.val_files")), *split_list(files)]}
        return {"data.val_files": files}

    def check_heldout(self, space: Space) -> None:
        """Each local file of ``study.confirm.test_files`` (``~`` and ``${oc.env:...}`` resolved as verl does)
        exists: else every confirmation run would crash in verl's dataset loader."""
        files = space.study.confirm.test_files
        for text in split_list(files):
            if "://" in text:  # hdfs://, s3://: verl copies them itself
                continue
            try:
                path = resolve_path(text)
            except ValueError as err:
                raise SpaceError(f"{space.source}: study.confirm.test_files: {err}") from None
            if not path.is_file():
                raise SpaceError(f"{space.source}: study.confirm.test_files: {path} does not exist (the held-out "
                                 "data confirmation runs validate on)")

    def heldout_metric(self, space: Space) -> str | None:
        """``study.confirm.test_metric`` (the test file's data source), else the objective's metric itself: the
        validation set is the test file."""
        if not self.heldout_overrides(space):
            return None
        return space.study.confirm.test_metric or space.objective.primary_metric

    def heldout_note(self, space: Space) -> str:
        files = space.study.confirm.test_files
        if not files:
            return ""
        if space.study.confirm.test_metric:
            return (f"confirmation runs validate on the test file {files} beside data.val_files: they are compared "
                    f"on the validation metric, and the held-out value is {space.study.confirm.test_metric}")
        return (f"confirmation runs validate on the test file {files} (data.val_files swapped): their values, "
                "which the race and the ranking compare, are held-out test values (set study.confirm.test_metric to "
                "keep the choice on validation data)")

    def trainer_version(self, space: Space) -> str | None:
        """Unknown from the driver (verl runs in its own interpreter): baseline runs are never reused across studies."""
        return None


class VerlBackend(Backend):
    name: ClassVar[str] = "verl"
    # verl's file-logger names (verl/trainer/ppo/metric_utils.py; the file logger at $VERL_FILE_LOGGER_PATH). Its
    # validation metrics are named by data source (val-core/<data_source>/acc/mean@1): an experiment names its
    # objective; the default is verl_core's, which a verl run never logs (verify refuses it)
    metrics: ClassVar[MetricNames] = MetricNames(
        objective="eval/reward_mean", spread="eval/reward_std", score="critic/score/mean", entropy="actor/entropy",
        kl=("actor/ppo_kl", "actor/reward_kl_penalty", "actor/kl_loss"), clip_ratio="response_length/clip_ratio",
        response_length="response_length/mean", step_time="timing_s/step", gen_time="timing_s/gen",
        sync_time="timing_s/update_weights", gpu_util="perf/gpu_util", mfu="perf/mfu/actor")
    memory = VerlMemory()
    resumable = Resumable(LAYOUT, resume_overrides, segment_overrides,  # global_step_N under default_local_dir
                          save_at=save_overrides)
    confirmation = VerlConfirmation(tuple(SEED_KEYS))
    speed = Speed(SPEED_KEYS, {"perf/throughput": "maximize", "perf/time_per_step": "minimize",
                               "timing_s/step": "minimize"},
                  ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb"),
                  ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "critic/vf_loss",
                   "critic/score/mean", "response_length/mean"))
    rehearsal = VerlRehearsal()
    default_command: ClassVar[tuple[str, ...]] = ("python", "-m", MAIN_MODULE)  # in trial.python (_launch)
    metrics_env: ClassVar[str | None] = "VERL_FILE_LOGGER_PATH"
    dropped_row_patterns: ClassVar[tuple[str, ...]] = DROPPED_ROW_PATTERNS  # _launch: the rehearsal's corners too
    host_failure_lines: ClassVar[tuple[str, ...]] = (RAY_START_TIMEOUT,)
    # study.fidelity.proxy: verl 0.9.1's policy model (actor, rollout and reference), the critic's, and the policy's
    # tokenizer when it is not the model's (ppo_trainer.yaml)
    model_keys: ClassVar[tuple[str, ...]] = ("actor_rollout_ref.model.path", "critic.model.path")
    tokenizer_keys: ClassVar[tuple[str, ...]] = ("actor_rollout_ref.model.tokenizer_path",)
    ray_hold: ClassVar[bool] = False  # verl starts a Ray cluster of its own inside the job
    leaves_scratch: ClassVar[bool] = True  # a private /tmp and Ray's session files per attempt (hpo.backends.verl)
    every_key_is_code: ClassVar[bool] = True  # hydra's _target_ and verl's custom reward paths load code

    def model_facts(self, path: str) -> ModelFacts:
        """A local directory's facts; a model of the CPU arith task (``hpo.backends.verl._arith``: ``model``,
        ``model_s``, ``model_l``) not written yet is the prepare step's to write: not missing, its facts unknown."""
        where = resolve_path(path)
        if not where.exists() and where.parent == arith_dir() and where.name in ARITH_MODELS:
            return ModelFacts(note=f"{path!r} is written by the prepare step (hpo.backends.verl._arith): not checked "
                                   "before it is")
        return super().model_facts(path)

    def code_files(self, key: str, value: Any) -> list[str]:
        """``[reward.]custom_reward_function.path``: verl's only key that names a user-code file."""
        return code_files(key, value, ("custom_reward_function.path",))

    def normalize(self, space: Space) -> Space:
        """verl logs a spread only with ``val_kwargs.n > 1``: early stopping is off unless the experiment asks."""
        if "early_stopping" in space.raw or not space.early_stopping.enabled:
            return space
        return dataclasses.replace(space, early_stopping=dataclasses.replace(space.early_stopping, enabled=False))

    def resolve_paths(self, space: Space, origin: Mapping[str, str]) -> Space:
        from hpo.backends.verl._paths import resolve_user_paths

        return resolve_user_paths(space, origin)

    def check(self, space: Space, origin: Mapping[str, str]) -> None:
        if space.trial.command not in (None, self.default_command):
            raise located_error(space, dict(origin), "trial.command", "not used with trial.backend: verl (the "
                                "command is python -m verl.trainer.main_ppo in trial.python)")
        if space.study.confirm.test_metric and not split_list(space.overrides.get("data.val_files")):
            raise located_error(space, dict(origin), "study.confirm.test_metric", "needs data.val_files among the "
                                "overrides: confirmation runs validate on it and study.confirm.test_files together")

    def infeasible(self, space: Space, values: Mapping[str, Any]) -> str | None:
        """verl 0.9.1's batch rules over what the driver knows of the trial's config (a micro-batch that does not
        divide a GPU's share of the mini-batch, a mini-batch larger than the batch, sizes the GPUs do not divide, ...:
        :func:`~hpo.backends.verl._batch.verl_infeasible`); None when accepted or not known without verl."""
        from hpo.backends.verl._batch import verl_infeasible

        return verl_infeasible(space, values)

    def verify(self, space: Space, origin: Mapping[str, str]) -> None:
        from hpo.backends.verl._check import ComposeTimeout, VerlConfigError, check_verl_space

        try:
            check_verl_space(space, space.trial.python or default_python())
        except ComposeTimeout as err:  # this host was too slow: still a ComposeTimeout (rehearse: not finished here)
            raise ComposeTimeout(f"{space.source}: {err}", err.where) from None
        except VerlConfigError as err:
            raise located_error(space, dict(origin), err.where, str(err)) from None

    def check_launch(self, space: Space, *, as_planned: bool = False) -> None:
        """Trials need an interpreter with CUDA torch (and vLLM, flash-attn where the config needs them), or the
        CPU platform (:func:`~hpo.backends.verl._check.check_verl_launch`). ``as_planned``: a study whose trials get
        GPUs (``trial.gpus_per_trial`` > 0, local) is checked for them even on a host without a GPU."""
        from hpo.backends.verl._check import VerlConfigError, check_verl_launch

        if space.trial.executor == "ray":  # the interpreter runs on the cluster's nodes: check_cluster asks them
            return
        planned_gpus = space.trial.gpus_per_trial > 0
        if as_planned and not planned_gpus:
            return  # trials on the CPU: the load composed every corner in that interpreter; search checks the plugin
        try:
            check_verl_launch(space, cpu=False if as_planned else None)
        except VerlConfigError as err:
            raise SpaceError(f"{space.source}: {err.where}: {err}") from None

    def configure(self, attempt: Attempt) -> TrialConfig:
        """Hydra syntax (one value per key; ``extra`` replaces a fixed key); the driver's own keys come from
        :func:`verl_argv` at launch."""
        space, extra = attempt.space, dict(attempt.extra)
        fixed = {k: v for k, v in space.fixed_overrides().items() if k not in extra}  # secrets as ${oc.env:...}
        tuned = {p.key: attempt.values[p.name] for p in space.params if p.name in attempt.values}
        overrides = [*verl_overrides(fixed, {**tuned, **extra}), *attempt.tail]
        return TrialConfig(overrides, int_override(overrides, STEPS_KEY), config_text(space, overrides))

    def metrics_path(self, trial_dir: Path, attempt: int) -> Path:
        return verl_metrics_path(trial_dir, attempt)  # verl's FileLogger truncates: each attempt its own file

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        space, spec = attempt.space, attempt.space.trial
        python = spec.python or default_python()
        if attempt.ray_job:  # verl joins the user's cluster: trial.ray's world size, its own logical CPUs
            ray, cpu = spec.ray, spec.ray.device == "cpu"
            argv = verl_argv(python, space.config, config.overrides, attempt.study, attempt.number, attempt.trial_dir,
                             ray.num_gpus, attempt.resume_from, ray.nodes, cpu=cpu, joins_cluster=True,
                             cpus=int(ray.num_cpus * ray.nodes), checkpoints=job_checkpoints(ray, attempt))
            return Command(argv, verl_job_env(attempt.env, attempt.trial_dir, attempt.index, cpu=cpu))
        argv = verl_argv(python, space.config, config.overrides, attempt.study, attempt.number, attempt.trial_dir,
                         attempt.devices, attempt.resume_from)
        # no GPU: verl on the CPU; verl's weight-sync sockets have fixed names under /tmp (issue 21 item 3)
        return Command(argv, verl_env(attempt.env, attempt.trial_dir, attempt.index, cpu=not attempt.devices),
                       scratch_dir(attempt.trial_dir, attempt.index) / "slash-tmp")

    def check_cluster(self, space: Space, address: str, study: str, trials_dir: Path | None) -> list[str]:
        """verl, vLLM (the CPU plugin on logical GPUs, CUDA on real ones) in the nodes' interpreter, and the
        checkpoint directory shared (:func:`hpo.backends.verl._ray.check_cluster`)."""
        from hpo.backends.verl._check import SKIP_INTERPRETER_CHECK, trial_base_env
        from hpo.backends.verl._ray import ClusterMismatch, check_cluster, checkpoint_root

        if trial_base_env(space).get(SKIP_INTERPRETER_CHECK, "") not in ("", "0"):
            return []  # a stand-in main_ppo (some tests): nothing of verl's is needed on the nodes
        ray = space.trial.ray
        root = checkpoint_root(ray, study, trials_dir)
        try:
            return check_cluster(ray, address, space.trial.python or default_python(), root)
        except ClusterMismatch as err:
            raise SpaceError(f"{space.source}: trial.ray: {err}") from None

    def command_line(self, space: Space, overrides: Sequence[str]) -> list[str]:
        """verl's own command as a trial ran it, outside the driver (:func:`verl_command_line`): verl's interpreter,
        the platform's overrides (the CPU platform's for a trial of no GPU: ``trial.gpus_per_trial`` 0, or a Ray job
        on logical GPUs) and, when the trial's environment had more than ``trial.env``, ``env`` first with what it
        adds (:func:`verl_command_env`; ``trial.env`` and the secrets: :mod:`hpo.reporting._command_line`)."""
        spec = space.trial
        python = spec.python or default_python()
        if spec.executor == "ray":
            ray, cpu = spec.ray, spec.ray.device == "cpu"
            argv = verl_command_line(python, space.config, overrides, ray.num_gpus, ray.nodes, cpu=cpu,
                                     joins_cluster=True, cpus=int(ray.num_cpus * ray.nodes))
        else:
            cpu = spec.gpus_per_trial == 0
            argv = verl_command_line(python, space.config, overrides, spec.gpus_per_trial)
        plain = {k: v for k, v in spec.env.items() if v != MASK and not is_secret_key(k)}
        added, unset = verl_command_env(plain, cpu, ray_job=spec.executor == "ray")
        if not added and not unset:
            return argv
        return ["env", *(a for name in unset for a in ("-u", name)), *(f"{k}={v}" for k, v in added.items()), *argv]

    def cleanup(self, trial_dir: Path, attempt: int) -> None:
        verl_cleanup(trial_dir, attempt, keep_logs=True)  # Ray's scratch (sockets, spilled objects); logs kept
