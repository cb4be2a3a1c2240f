"""The memory pre-flight of a verl space (``hpo/backends/verl/_memory.py``): each corner composed in verl's
interpreter and judged by the memory model (``test_memory_model.py``) against the trial's budget, ``validate``'s
verdict, measured prompts against the worst case; the last tests compose the shipped verl space with real verl 0.9.1
(``.venv-verl``; skipped without it), and measure the arith task's prompts with its model's tokenizer.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest

from hpo.backends import _preflight, load_space
from hpo.backends._preflight import validate_space
from hpo.backends._shapes import SequenceLengths
from hpo.backends.verl import _memory, space_corners
from hpo.backends.verl._memory import (
    MEASURED_PROMPTS,
    _verl_budget,
    data_lengths,
    predict_verl,
    predict_verl_corners,
    verl_memory_inputs,
)
from hpo.backends.verl._memory_model import judge_verl
from hpo.experiment._space import Space
from tests import verl_configs
from tests.hpo.backends.verl.conftest import ARITH, CPU_SPACE, arith_space, load_verl_space, needs_verl
from tests.hpo.backends.verl.test_memory_model import AR, BASE, GiB

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


# ----------------------------------------------------------------------------- the pre-flight on verl spaces
MEASURED = {"mean": 100.0, "max": 160, "rows": 64}  # what verl's interpreter measures from the training prompts


def _fake_inputs(values: dict[str, Any], measured: dict[str, Any] | None = MEASURED) -> Any:
    def fake(space: Space, corners: Any, n_gpus: int, python: str | None = None, measure_prompts: int = 0,
             **checks: Any) -> Any:  # check_rows: the rows' check is not faked (no rows reply: nothing to say)
        info = {"use_critic": False, "use_reference_policy": True}
        return [({**info, **({"prompt_lengths": measured} if measure_prompts and i == 0 and measured else {})},
                 {**values, "trainer.n_gpus_per_node": n_gpus}) for i, _ in enumerate(corners)]
    return fake


def test_predict_verl_budget_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "verl_memory_inputs", _fake_inputs(BASE))
    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    space = load_verl_space()
    pred = predict_verl(space, [])
    assert pred.fits and pred.budget == 80 * GiB and "assumed" in pred.budget_source and pred.device == "cuda"
    capped = dataclasses.replace(space, trial=dataclasses.replace(space.trial, memory_limit_gb=20.0))
    small = predict_verl(capped, [])
    assert not small.fits and "trial.memory_limit_gb=20.0" in small.budget_source
    assert f"[{AR}.rollout.gpu_memory_utilization]" in (small.problem or "")


def test_validate_prints_every_corner_and_fails_when_one_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "verl_memory_inputs",
                        _fake_inputs({**BASE, f"{AR}.rollout.gpu_memory_utilization": 0.99}))
    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    out = io.StringIO()
    assert validate_space(load_verl_space(), [], out) == 2
    text = out.getvalue()
    assert text.count("DOES NOT FIT") == len(_preflight.corners(load_verl_space()))
    assert "vllm weights + KV cache (awake)" in text and "TOTAL (peak)" in text


def test_validate_skips_a_corner_verl_refuses_whose_values_each_run_in_another(monkeypatch: pytest.MonkeyPatch) -> None:
    small = {**BASE, f"{AR}.rollout.gpu_memory_utilization": 0.1}
    monkeypatch.setattr(_memory, "verl_memory_inputs", _fake_inputs(small))
    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    shipped = load_verl_space()
    micro = f"{AR}.actor.ppo_micro_batch_size_per_gpu"
    space = load_verl_space(overrides={k: v for k, v in shipped.overrides.items() if k != micro}, params={
        "mini": {"key": f"{AR}.actor.ppo_mini_batch_size", "type": "categorical", "choices": [1, 8]},
        "micro": {"key": micro, "type": "categorical", "choices": [4, 8]}})
    out = io.StringIO()
    assert validate_space(space, [], out) == 0
    text = out.getvalue()
    assert text.count("infeasible, skipped") == 1 and "corner mini=1, micro=8: infeasible, skipped" in text
    assert f"{micro}=8 does not divide the 4 samples each GPU gets per pass" in text
    assert text.count(": fits") == 3 and "All checks passed" in text
    assert [c.values for c in space_corners(space)] == [{"mini": 1, "micro": 4}, {"mini": 8, "micro": 4},
                                                        {"mini": 8, "micro": 8}]  # what verl composes at load


def test_validate_with_expected_lengths_passes_with_a_warning_when_only_the_worst_case_does_not_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    big = {**BASE, f"{AR}.actor.ppo_micro_batch_size_per_gpu": 512, f"{AR}.actor.ppo_mini_batch_size": 512,
           "data.train_batch_size": 512, f"{AR}.rollout.gpu_memory_utilization": 0.1}
    monkeypatch.setattr(_memory, "verl_memory_inputs", _fake_inputs(big))
    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    space = load_verl_space()
    out = io.StringIO()
    assert validate_space(space, [], out, lengths=SequenceLengths(60, 60, "a test")) == 0
    text = out.getvalue()
    assert "fits (worst case does not)" in text and "warning: corner" in text and "All checks passed" in text
    assert "at the expected lengths: mean prompt 60, response 60 tokens (a test)" in text
    # no previous run: the prompts measured from the data (mean 100 tokens) and a 64-token response decide, and the
    # warning names the lengths it assumed
    out = io.StringIO()
    assert validate_space(space, [], out) == 0
    text = out.getvalue()
    assert "fits (worst case does not)" in text and "All checks passed" in text
    assert ("mean prompt 100, response 64 tokens (prompts measured from 64 rows of the training data, a 64-token "
            "response assumed)") in text


def test_a_corner_is_refused_only_on_measured_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Too big even at the measured prompts and a short response: refused. The same config whose prompts could not
    be measured (no tokenizer here) is judged at data.max_prompt_length, and only warned about."""
    huge = {**BASE, f"{AR}.actor.ppo_micro_batch_size_per_gpu": 4096, f"{AR}.actor.ppo_mini_batch_size": 4096,
            "data.train_batch_size": 4096, f"{AR}.model.enable_gradient_checkpointing": False}
    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    space = load_verl_space()
    monkeypatch.setattr(_memory, "verl_memory_inputs", _fake_inputs(huge))
    assert validate_space(space, [], io.StringIO()) == 2
    monkeypatch.setattr(_memory, "verl_memory_inputs",
                        _fake_inputs(huge, {"error": "no tokenizer of 'Qwen/Qwen2.5-0.5B-Instruct' here"}))
    out = io.StringIO()
    assert validate_space(space, [], out) == 0
    assert "not refused, since its prompts could not be measured (mean prompt 256, response 64 tokens (prompts at " \
           "data.max_prompt_length (no tokenizer of 'Qwen/Qwen2.5-0.5B-Instruct' here)" in out.getvalue()


@pytest.mark.parametrize("case", [c for c in verl_configs.reference_cases() if "device_tuning" in c.name],
                         ids=lambda c: c.name)
def test_verls_device_tuning_minimums_pass_at_measured_prompts_though_their_worst_case_does_not_fit(
        case: verl_configs.Case) -> None:
    """verl's docs say these run; judged at their worst case they were refused. At the GSM8K prompts they were run
    with (the reference's prompt length, as a measurement of the data gives it) and a short response, they pass."""
    worst = judge_verl(case.values, use_critic=case.use_critic, use_ref=case.use_ref, gpu_total_bytes=case.gpu_total)
    assert worst.verdict(case.gpu_total) == "does_not_fit"
    lengths = _memory.data_lengths(case.values, {"mean": case.lengths.prompt, "rows": 256})
    v = judge_verl(case.values, use_critic=case.use_critic, use_ref=case.use_ref, lengths=lengths,
                   gpu_total_bytes=case.gpu_total)
    assert v.verdict(case.gpu_total) == "worst_case_does_not_fit" and lengths.response == 64


def test_validate_skips_the_estimate_for_an_unknown_hub_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "verl_memory_inputs", _fake_inputs({**BASE, f"{AR}.model.path": "org/nothing"}))
    out = io.StringIO()
    assert validate_space(load_verl_space(), [], out) == 0
    assert "memory estimate skipped" in out.getvalue() and "All checks passed" in out.getvalue()


# ----------------------------------------------------------------------------- real verl composes the configs
def test_a_cpu_study_s_estimate_says_it_is_for_a_gpu() -> None:
    """verl_grpo_cpu's trials train on the CPU: the verl estimate is for a GPU and says so, never 'no GPU visible'
    as if the trials needed one (issue 43 item 7)."""
    budget, source, _ = _verl_budget(load_space(str(CPU_SPACE)), [], None)
    assert "trials run on the CPU (trial.gpus_per_trial: 0)" in source and budget > 0


@needs_verl
def test_the_memory_preflight_measures_the_prompts_with_the_models_tokenizer(tmp_path: Path) -> None:
    """verl's interpreter tokenizes the first training prompts with the model's chat template: the arith prompts are
    a few tokens, far below data.max_prompt_length, and the expected lengths say where they came from."""
    space = load_space(str(arith_space(tmp_path)))
    (info, values), = verl_memory_inputs(space, [space.trainer_overrides({})], 1, None, MEASURED_PROMPTS)
    measured = info["prompt_lengths"]
    assert measured["rows"] == MEASURED_PROMPTS and 4 <= measured["mean"] <= measured["max"] <= 16, measured
    assert measured["tokenizer"] == str(ARITH / "model")
    lengths = data_lengths(values, measured)
    assert lengths.prompt == measured["mean"] and lengths.response == 8  # max_response_length 8 < 64
    assert lengths.source.startswith(f"prompts measured from {MEASURED_PROMPTS} rows of the training data")


@pytest.mark.slow  # one verl subprocess: ~40 s on 2 cores
@needs_verl
def test_real_composed_configs_offload_and_sharding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    space = load_verl_space()
    fixed = space.trainer_overrides({"actor_lr": 1e-6, "kl_coef": 0.01, "temperature": 1.0, "mini_batch": 16})
    off = [f"{AR}.actor.fsdp_config.param_offload=true", f"{AR}.actor.fsdp_config.optimizer_offload=true"]
    dyn = [f"{AR}.actor.use_dynamic_bsz=true", f"{AR}.actor.ppo_max_token_len_per_gpu=2048"]
    base, offload, dynamic = predict_verl_corners(space, [fixed, [*fixed, *off], [*fixed, *dyn]])
    eight = predict_verl(space, fixed, devices=[str(i) for i in range(8)], gpu_total_bytes=80 * GiB)
    assert base.fits and base.budget == 80 * GiB
    assert offload.total < base.total and eight.total < base.total
    # the shipped data is not written here and Qwen's tokenizer is not cached: prompts at max_prompt_length (256)
    assert "micro 8 x 320 tokens" in base.table and "/ 8 GPU(s)" in eight.table
    assert "2048 tokens (ppo_max_token_len_per_gpu 2048)" in dynamic.table
