"""Published verl configs as data, for the memory estimate's tests (``tests/hpo/backends/verl/test_memory.py``).

* ``reference.yaml``: what verl's docs say runs (the quickstart, ``docs/perf/device_tuning.rst``'s minimum configs);
* ``independent.yaml``: GRPO-LoRA batch-size sweeps with the outcome of every size tried;
* ``defaults.yaml``: verl 0.9.1's value of each key the estimate reads, for the keys a script does not set.

:func:`reference_cases` / :func:`independent_cases` give one :class:`Case` per config: the composed key values (as
``hpo/backends/verl/_compose.py`` would select them), the GPU, the expected lengths and the published outcome.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpo.backends._shapes import SequenceLengths

HERE = Path(__file__).parent
MiB = 2**20
AR = "actor_rollout_ref"
_SELECT = re.compile(r"^\$\{oc\.select:([\w.]+),(.*)\}$")


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    values: dict[str, Any]
    use_critic: bool
    use_ref: bool
    gpu_total: int  # bytes
    gpu_name: str
    lengths: SequenceLengths
    outcome: str  # fits | oom
    peak_gib: float | None = None


def _scalar(text: str) -> Any:
    return yaml.safe_load(text)


def compose(overrides: dict[str, Any]) -> dict[str, Any]:
    """verl's defaults with ``overrides`` on top, ``${oc.select:KEY,DEFAULT}`` resolved as hydra does, and the
    deprecated global micro-batch sizes turned into per-GPU ones (``verl.utils.config.validate_config``)."""
    defaults = yaml.safe_load((HERE / "defaults.yaml").read_text())
    values: dict[str, Any] = {**defaults, **overrides}
    world = int(values["trainer.n_gpus_per_node"]) * int(values["trainer.nnodes"])
    for legacy, per_gpu in ((f"{AR}.actor.ppo_micro_batch_size", f"{AR}.actor.ppo_micro_batch_size_per_gpu"),
                            (f"{AR}.rollout.log_prob_micro_batch_size",
                             f"{AR}.rollout.log_prob_micro_batch_size_per_gpu"),
                            (f"{AR}.ref.log_prob_micro_batch_size", f"{AR}.ref.log_prob_micro_batch_size_per_gpu")):
        if values.get(legacy) is not None and values.get(per_gpu) is None:
            values[per_gpu] = int(values[legacy]) // world
    for _ in range(3):  # interpolations of interpolations
        for key, value in values.items():
            m = _SELECT.match(value) if isinstance(value, str) else None
            if m:
                target = values.get(m[1])
                values[key] = target if target is not None and not isinstance(target, str) or (
                    isinstance(target, str) and not target.startswith("${")) else _scalar(m[2])
    return values


def _case(name: str, source: str, overrides: dict[str, Any], gpu: dict[str, Any], lengths: dict[str, Any],
          outcome: str, peak: float | None = None) -> Case:
    values = compose(overrides)
    use_critic = values.get("algorithm.adv_estimator", "gae") == "gae"
    use_ref = bool(values.get(f"{AR}.actor.use_kl_loss")) or bool(values.get("algorithm.use_kl_in_reward"))
    return Case(name, source, values, use_critic, use_ref, int(gpu["total_mib"]) * MiB, gpu["name"],
                SequenceLengths(lengths["prompt"], lengths["response"], lengths["source"]), outcome, peak)


def reference_cases() -> list[Case]:
    doc = yaml.safe_load((HERE / "reference.yaml").read_text())
    return [_case(c["name"], c["source"], c["overrides"], c["gpu"], c["lengths"], c["outcome"], c.get("peak_gib"))
            for c in doc["cases"]]


def independent_cases() -> list[Case]:
    doc = yaml.safe_load((HERE / "independent.yaml").read_text())
    out = []
    for sweep in doc["sweeps"]:
        for nproc, outcome in sweep["tried"].items():
            total = int(nproc) * int(sweep["gpus"])
            overrides = {**doc["lora_common"], **sweep["overrides"], f"{AR}.model.path": sweep["model"],
                         "trainer.n_gpus_per_node": sweep["gpus"], "data.train_batch_size": total,
                         f"{AR}.actor.ppo_mini_batch_size": total, f"{AR}.actor.ppo_micro_batch_size": total,
                         f"{AR}.rollout.log_prob_micro_batch_size": total,
                         f"{AR}.ref.log_prob_micro_batch_size": total}
            out.append(_case(f"{sweep['model'].split('/')[1]} LoRA, {sweep['gpus']} x {sweep['gpu']['name']}, "
                             f"{nproc} per GPU", sweep["script"], overrides, sweep["gpu"], doc["gsm8k_lengths"],
                             outcome))
    return out
