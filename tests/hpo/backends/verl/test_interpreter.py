"""Whether verl's interpreter can run a study's trials where they will run (``hpo/backends/verl/_interpreter.py``):
what an interpreter lacks for a corner (a CUDA build of torch for trials handed GPUs, vLLM for a vLLM rollout, sdpa
without flash-attn, the CPU platform plugin and vLLM's CPU build on the CPU) is one line naming the fix; where the
trials run (their GPUs, nodes, the CPU); and, with real verl 0.9.1's CPU interpreter (``make install-verl``), GPU
trials refused before any study while CPU trials launch."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from hpo.backends import verl as _verl
from hpo.backends.verl import ComposedConfig, VerlConfigError, interpreter_problem, trial_base_env
from hpo.backends.verl._interpreter import trial_gpus, trial_nodes, trials_on_cpu
from tests.hpo.backends.verl.conftest import (
    VERL_PY,
    arith_experiment,
    arith_rows,
    composed,
    load_verl_space,
    needs_verl,
    small_verl_space,
    validate,
)

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


GPU_PY = {"torch": "2.11.0", "torch_cuda": "13.0", "vllm": True, "sglang": False, "flash_attn": False}


@pytest.mark.parametrize(("interpreter", "info", "text"), [
    ({**GPU_PY, "torch": "2.13.0+cpu", "torch_cuda": None}, {}, "without CUDA"),  # `make install-verl`'s venv
    ({**GPU_PY, "vllm": False}, {}, "actor_rollout_ref.rollout.name=vllm but"),
    (GPU_PY, {"attn_implementation": "flash_attention_2"}, "attn_implementation=sdpa"),
    (GPU_PY, {"attn_implementation": "sdpa", "use_critic": True, "adv_estimator": "gae"}, "trains a critic"),
    (GPU_PY, {"attn_implementation": "sdpa"}, None),
    ({**GPU_PY, "flash_attn": True}, {"use_critic": True}, None),
    ({**GPU_PY, "vllm": False}, {"rollout_name": "hf", "attn_implementation": "sdpa"}, None),
])
def test_an_interpreter_that_cannot_run_the_trials_is_one_line_naming_the_fix(
        interpreter: dict[str, Any], info: dict[str, Any], text: str | None) -> None:
    problem = _verl.interpreter_problem(interpreter, composed(**info), "/venv/bin/python")
    if text is None:
        assert problem is None
        return
    assert problem is not None and text in problem and "\n" not in problem
    if not interpreter["torch_cuda"] or not interpreter["vllm"]:
        assert "make install-verl-gpu" in problem


def cpu_composed(**changes: object) -> ComposedConfig:
    base = dict(rollout_name="vllm", strategy="fsdp2", attn_implementation="sdpa", val_core_var="acc",
                seed_keys=(), val_n=1, data_sources=("s",), total_training_steps=4, test_freq=1, save_freq=2,
                val_before_train=True, n_gpus=1, use_critic=False, use_reference_policy=True,
                adv_estimator="grpo", train_files=(), val_files=())
    fields = ComposedConfig.__dataclass_fields__
    return ComposedConfig(**{k: v for k, v in {**base, **changes}.items() if k in fields})  # type: ignore[arg-type]


def test_the_interpreter_check_on_the_cpu_asks_for_the_plugin_and_vllm_s_cpu_build() -> None:
    ready = {"torch": "2.13.0+cpu", "torch_cuda": None, "vllm": True, "vllm_version": "0.27.1+cpu",
             "verl_cpu_platform": True, "flash_attn": False}
    info = cpu_composed()
    assert interpreter_problem(ready, info, "py", cpu=True) is None
    assert "make install-verl" in (interpreter_problem({**ready, "verl_cpu_platform": False}, info, "py", cpu=True)
                                   or "")
    assert "vllm 0.27.1" in (interpreter_problem({**ready, "vllm_version": "0.27.1"}, info, "py", cpu=True) or "")
    assert "SGLang" in (interpreter_problem(ready, cpu_composed(rollout_name="sglang"), "py", cpu=True) or "")
    assert "without CUDA" in (interpreter_problem(ready, info, "py", cpu=False) or "")  # the same venv for GPUs


def test_where_the_trials_run(monkeypatch: pytest.MonkeyPatch) -> None:
    space = load_verl_space()  # verl_grpo_gsm8k
    gpus = dataclasses.replace(space, trial=dataclasses.replace(space.trial, gpus_per_trial=2, devices=["0", "1"]))
    assert (trial_gpus(gpus), trial_nodes(gpus), trials_on_cpu(gpus)) == (2, 1, False)
    cpu = dataclasses.replace(space, trial=dataclasses.replace(space.trial, gpus_per_trial=0, env={"MINE": "1"}))
    assert trials_on_cpu(cpu) and trial_gpus(cpu) == 0
    monkeypatch.setenv("FROM_THE_DRIVER", "x")
    env = trial_base_env(cpu)
    assert env["MINE"] == "1" and env["FROM_THE_DRIVER"] == "x"  # the driver's environment plus trial.env


@needs_verl
@pytest.mark.slow  # three compositions in verl's interpreter: ~20 s; make test-slow / CI
def test_verl_s_cpu_interpreter_runs_cpu_trials_and_is_refused_for_gpu_trials() -> None:
    """`make install-verl`'s venv (CPU torch, vLLM's CPU build, the CPU platform plugin) runs trials that get no GPU;
    trials handed GPUs need a CUDA build (one line naming both ways out); a space whose trials run the stand-in
    (trial.env sets VERL_HPO_SKIP_INTERPRETER_CHECK) launches either way."""
    space = small_verl_space()
    with pytest.raises(VerlConfigError) as err:
        _verl.check_verl_launch(space, str(VERL_PY), cpu=False)
    assert err.value.where == "trial.python" and "\n" not in str(err.value)
    assert "without CUDA" in str(err.value) and "make install-verl-gpu" in str(err.value)
    assert "gpus_per_trial: 0" in str(err.value)
    _verl.check_verl_launch(space, str(VERL_PY), cpu=True)  # every corner composes with the CPU platform's overrides
    stand_in = dataclasses.replace(space, trial=dataclasses.replace(
        space.trial, env={_verl.SKIP_INTERPRETER_CHECK: "1"}))
    _verl.check_verl_launch(stand_in, str(VERL_PY), cpu=False)


@needs_verl
def test_a_gpu_study_with_a_cpu_only_interpreter_is_refused_at_validate(tmp_path: Path) -> None:
    space = arith_experiment(tmp_path, arith_rows(64, None))
    res = validate(space, "--override", "trial.gpus_per_trial=1")
    assert res.returncode == 2, (res.stdout, res.stderr)
    line, = res.stderr.strip().splitlines()
    assert "trial.python" in line and "without CUDA, so its trials need a GPU build" in line and \
        "trial.gpus_per_trial: 0" in line, line
