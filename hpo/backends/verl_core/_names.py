"""What the ``verl_core`` trainer calls things, as the driver needs to know them: its commands, its metric names
(verl's file-logger names, which verl_core shares with verl), its held-out split and the keys that load user code.
A custom ``trial.command`` under ``trial.backend: verl_core`` is taken to speak the same language."""

from __future__ import annotations

from hpo.analysis import MetricNames
from hpo.backends._models import ModelFacts, builtin_facts_from

COMMAND = ("python", "-m", "verl_core", "train")
PREPARE_COMMAND = ("python", "-m", "verl_core", "prepare")
METRICS_ENV = "VERL_FILE_LOGGER_PATH"  # verl's file-logger variable, which verl_core.tracking reads too
METRICS = MetricNames(
    objective="eval/reward_mean", spread="eval/reward_std", score="critic/score/mean", entropy="actor/entropy",
    kl=("actor/ppo_kl", "actor/reward_kl_penalty", "actor/kl_loss"), clip_ratio="response_length/clip_ratio",
    response_length="response_length/mean", step_time="timing_s/step", gen_time="timing_s/gen",
    sync_time="timing_s/update_weights", gpu_util="perf/gpu_util", mfu="perf/mfu/actor")
# a throughput study: its speed metrics (-> the direction a faster run moves them), peak memory, the first-step math
SPEED_METRICS = {"perf/throughput": "maximize", "perf/time_per_step": "minimize", "timing_s/step": "minimize"}
MEMORY_METRICS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")
MATH_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "critic/vf_loss",
                "critic/score/mean", "response_length/mean")
CODE_KEYS = ("custom_reward_function.", "evaluation.custom")  # user code: reward functions, evaluators
# the override keys naming a user-code file, and those naming ``name=path:function`` entries (Backend.code_files)
CODE_PATH_KEYS = ("custom_reward_function.path",)
CODE_ENTRY_KEYS = ("evaluation.custom",)
# the mean prompt and response lengths it logs (verl's names): what ``validate --metrics`` reads
LENGTH_METRICS = ("prompt_length/mean", "response_length/mean")
TEST_KEY = "data.test_files"  # the held-out split (confirmation runs only)
# validation metric prefix -> its name on the held-out split (verl_core.validation.heldout_metric_name)
TEST_PREFIXES = {"eval/": "test/", "val-core/": "test-core/", "val-aux/": "test-aux/",
                 "timing_s/testing": "timing_s/testing_heldout", "": "test/"}
# study.fidelity.proxy: the keys that name the policy model (actor, rollout and reference share it) and the critic's
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path")


def builtin_facts(path: str) -> ModelFacts | None:
    """The facts of one of verl_core's built-in models (``builtin:<name>``; the TRL launcher builds the same ones),
    asked of verl_core without torch (:func:`verl_core.resolve.builtin_model_facts`). None for a path that is not
    ``builtin:``; ``missing`` for an unknown name."""
    if not path.startswith("builtin:"):
        return None
    from verl_core.resolve import builtin_model_facts

    return builtin_facts_from(path, builtin_model_facts())
