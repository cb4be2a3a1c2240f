"""The ``verl_core`` trainer (``python -m verl_core train``) as a :class:`~hpo.backends._base.Backend`: its config is
loaded once per attempt (total steps, ``config.yaml``, the memory estimate: the ``memory`` feature), its model and data
are prepared once (``python -m verl_core prepare``), its checkpoints resume retries and PBT segments (``resumable``,
:mod:`~hpo.backends.verl_core._resume`), its seed is ``trainer.seed`` and a confirmation run evaluates the held-out
split (``data.test_files``: ``confirmation``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

from hpo.backends._attempt import Attempt, Command, TrialConfig
from hpo.backends._base import Backend, CommandBackend
from hpo.backends._code_files import code_files
from hpo.backends._features import Confirmation, PredictionLike, Resumable, SequenceLengths, Speed
from hpo.backends._models import ModelFacts
from hpo.backends.verl_core import _names
from hpo.backends.verl_core._check import accepted_values, check_driver_keys, check_trainer, fixed_config, rejected
from hpo.backends.verl_core._memory import corner_predictions, predict, validate_corners
from hpo.backends.verl_core._names import TEST_KEY
from hpo.backends.verl_core._resume import LAYOUT, resume_overrides, save_overrides, segment_overrides
from hpo.experiment import Space, format_value

SEED_KEY = "trainer.seed"
# micro-batches are pre-scaled to sum to the mini-batch loss (verl_core/workers.py), so their size moves only
# float rounding; the rollout engine's batching and memory, checkpointing and threads change no value either. Not
# rollout.fast_decode: at one seed it samples other tokens than transformers' generate (gpu_check's throughput part:
# step 1's grad_norm 3.27 vs 2.79 on tiny_arith), so a pick that switches it never passes the same-math check
SPEED_KEYS = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size_per_gpu",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.max_num_batched_tokens", "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine", "actor_rollout_ref.rollout.cpu_kvcache_space_gb",
    "trainer.cpu_threads",
)


class VerlCoreCommand(CommandBackend):
    """A ``trial.command`` of its own under ``trial.backend: verl_core``: a custom command (no config loaded, nothing
    estimated or resumed) that speaks verl_core's language: its metric names, total steps, seed and held-out split,
    code keys, metrics variable and throughput metrics."""

    metrics = _names.METRICS
    default_command = _names.COMMAND  # what the experiment replaced (the trust check compares with it)
    code_keys = _names.CODE_KEYS
    default_runs_unasked = True  # its command on a shipped config runs verl_core and no code of the experiment's
    metrics_env = _names.METRICS_ENV
    model_keys = _names.MODEL_KEYS
    steps_key = "trainer.total_training_steps"
    confirmation: ClassVar[Confirmation | None] = Confirmation((SEED_KEY,), (TEST_KEY,), _names.TEST_PREFIXES)
    speed: ClassVar[Speed | None] = Speed((), _names.SPEED_METRICS, _names.MEMORY_METRICS, _names.MATH_METRICS)

    def code_files(self, key: str, value: Any) -> list[str]:
        return code_files(key, value, _names.CODE_PATH_KEYS, _names.CODE_ENTRY_KEYS)

    def model_facts(self, path: str) -> ModelFacts:
        """A built-in model's facts from verl_core (:func:`~hpo.backends.verl_core._names.builtin_facts`), else a
        local directory's."""
        return _names.builtin_facts(path) or super().model_facts(path)


class VerlCoreMemory:
    """verl_core's memory model (:mod:`hpo.backends.verl_core._memory`): its estimate of a loaded config."""

    def predict(self, space: Space, config: TrialConfig, devices: Sequence[str]) -> PredictionLike | None:
        return predict(space, config.overrides, devices, loaded=config.loaded)

    def corner_predictions(self, space: Space, devices: Sequence[str], lengths: SequenceLengths | None = None
                           ) -> Sequence[tuple[dict[str, Any], PredictionLike]] | None:
        """Every corner's estimate (``lengths`` is not used: verl_core's estimate takes the config's lengths)."""
        return corner_predictions(space, devices)

    def sequence_lengths(self, path: Path) -> SequenceLengths:
        from hpo.backends._preflight import read_lengths

        return read_lengths(path, *_names.LENGTH_METRICS)

    def validate(self, space: Space, devices: Sequence[str], out: TextIO,
                 lengths: SequenceLengths | None = None) -> int:
        """Each corner loaded by verl_core (its best-practice warnings) and estimated
        (:func:`~hpo.backends.verl_core._memory.validate_corners`)."""
        return validate_corners(space, devices, out)


@dataclasses.dataclass(frozen=True)
class VerlCoreConfirmation(Confirmation):
    """``trainer.seed`` (the config's value when the experiment does not set it), ``data.test_files`` (else the
    built-in task's test split), and a digest of verl_core's code as its version."""

    def default_seed(self, space: Space, key: str) -> int | None:
        if key != SEED_KEY:
            return None
        return int(fixed_config(space).trainer.seed)

    def heldout_overrides(self, space: Space) -> dict[str, Any]:
        """``study.confirm.test_files``, else the built-in task's test split when ``data.val_files`` is
        ``builtin:<task>``."""
        extra = super().heldout_overrides(space)
        if extra:
            return extra
        val = fixed_config(space).data.val_files
        return {TEST_KEY: val} if val.startswith("builtin:") else {}

    def trainer_version(self, space: Space) -> str | None:
        """A digest of verl_core's code and shipped configs (the tiny model's builder included), of the config file
        when it is a path, and of the torch and transformers versions installed."""
        import hashlib
        import importlib.metadata

        import verl_core

        digest = hashlib.sha256()
        root = Path(verl_core.__file__).parent
        for f in sorted([*root.rglob("*.py"), *root.rglob("*.yaml")]):
            digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
        config = Path(space.config)
        if config.suffix in (".yaml", ".yml") and config.is_file():
            digest.update(config.read_bytes())
        for dist in ("torch", "transformers"):
            try:
                digest.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
            except importlib.metadata.PackageNotFoundError:
                digest.update(f"{dist} missing".encode())
        return digest.hexdigest()[:16]


class VerlCoreBackend(VerlCoreCommand):
    name: ClassVar[str] = "verl_core"
    default_prepare_command = _names.PREPARE_COMMAND
    memory = VerlCoreMemory()
    resumable = Resumable(LAYOUT, resume_overrides, segment_overrides, save_at=save_overrides)
    confirmation = VerlCoreConfirmation((SEED_KEY,), (TEST_KEY,), _names.TEST_PREFIXES)
    speed = Speed(SPEED_KEYS, _names.SPEED_METRICS, _names.MEMORY_METRICS, _names.MATH_METRICS)

    def for_command(self, command: Sequence[str] | None) -> Backend:
        """Another program than verl_core's: a custom command (the driver cannot load that program's config)."""
        return self if command is None or tuple(command) == self.default_command else VerlCoreCommand()

    def normalize(self, space: Space) -> Space:
        if space.trial.prepare_command is not None:
            return space
        return dataclasses.replace(space, trial=dataclasses.replace(space.trial,
                                                                     prepare_command=self.default_prepare_command))

    def prepare_argv(self, space: Space) -> list[str] | None:
        """``python -m verl_core prepare`` with the fixed overrides, and tuned values it accepts where the fixed ones
        are refused alone (a batch smaller than the config's mini-batch, which every trial's tuned one replaces)."""
        argv = super().prepare_argv(self.normalize(space))
        if argv is None:
            return None
        values = accepted_values(space)
        return argv if not values else [*argv, *space.trainer_overrides(values)[len(space.trainer_overrides({})):]]

    def check(self, space: Space, origin: Mapping[str, str]) -> None:
        check_driver_keys(space, origin)
        check_trainer(space, origin)

    def infeasible(self, space: Space, values: Mapping[str, Any]) -> str | None:
        """What verl_core's config says of these tuned values together (its batch-size rules: a micro-batch at most
        the mini-batch x rollout.n and dividing it, a mini-batch dividing the batch)."""
        return rejected(space, values)

    def configure(self, attempt: Attempt) -> TrialConfig:
        """Checkpoints into the trial directory; a search trial never evaluates the held-out split, whatever the
        config says (only a confirmation run's ``extra`` sets it)."""
        from verl_core.config import dump_yaml, load_config

        space, extra = attempt.space, dict(attempt.extra)
        overrides = [*space.trainer_overrides(dict(attempt.values)),
                     *(f"{k}={format_value(v)}" for k, v in extra.items()),
                     f"trainer.default_local_dir={attempt.trial_dir / 'checkpoints'}"]
        if TEST_KEY not in extra:
            overrides.append(f"{TEST_KEY}=null")
        overrides += attempt.tail
        cfg = load_config(space.config, overrides)
        return TrialConfig(overrides, int(cfg.trainer.total_training_steps), dump_yaml(cfg), loaded=cfg)

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        """The custom command's argv, continuing ``attempt.resume_from`` when set (a retry's checkpoint, a PBT
        segment's start: :func:`~hpo.backends.verl_core._resume.resume_overrides`)."""
        process = super().command(attempt, config)
        if attempt.resume_from is not None:
            process.argv += resume_overrides(attempt.resume_from)
        return process

    def model_path(self, space: Space, overrides: Mapping[str, Any]) -> str | None:
        """The overrides' model path, else the config's (verl_core's config loader is torch-free)."""
        found = super().model_path(space, overrides)
        if found is not None:
            return found
        from verl_core.config import ConfigError, load_config

        try:
            cfg = load_config(space.config, [f"{k}={format_value(v)}" for k, v in overrides.items()])
            return str(cfg.actor_rollout_ref.model.path)
        except (ConfigError, OSError, ValueError):
            return None
