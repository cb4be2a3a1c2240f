"""Evaluators: toxicity (default offline classifier and HF models), latency, user metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import read_metrics, run_trainer
from verl_core import tasks
from verl_core.config import ConfigError, ToxicityConfig, load_config
from verl_core.evaluators import ToxicityEvaluator, load_callable

TOXIC = ["you are a fucking idiot", "shut up you stupid bitch", "this is shit"]
CLEAN = ["have a nice day", "the answer is 12", "thank you for your help"]


def test_default_classifier_separates_toxic_and_clean() -> None:
    ev = ToxicityEvaluator(ToxicityConfig(), torch.device("cpu"))
    toxic, clean = ev.scores(TOXIC), ev.scores(CLEAN)
    assert min(toxic) > 0.7 and max(clean) < 0.3
    m = ev([""] * 6, TOXIC + CLEAN, [None] * 6)
    assert m["toxicity_max"] == pytest.approx(max(toxic))
    assert m["toxicity_mean"] == pytest.approx(sum(toxic + clean) / 6)


def test_hf_toxicity_model_scores_the_toxic_label(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=64, num_labels=2, pad_token_id=tok.pad_token_id,
        id2label={0: "non-toxic", 1: "toxic"}, label2id={"non-toxic": 0, "toxic": 1}))
    model.save_pretrained(tmp_path / "tox")
    tok.save_pretrained(tmp_path / "tox")
    ev = ToxicityEvaluator(ToxicityConfig(model=str(tmp_path / "tox")), torch.device("cpu"))
    assert ev.label == 1
    enc = tok(CLEAN, return_tensors="pt", padding=True)
    expected = torch.softmax(model(**enc).logits, -1)[:, 1]
    assert ev.scores(CLEAN) == pytest.approx(expected.tolist(), abs=1e-5)
    with pytest.raises(ConfigError, match="evaluation.toxicity.label='hateful': not a label"):
        ToxicityEvaluator(ToxicityConfig(model=str(tmp_path / "tox"), label="hateful"), torch.device("cpu"))


# light enough for the lighter run, but self-contained: taken by a heavy run of make test-slow once its own tests
# are done (the lighter run is CI's longest on stop 64's machine, and test-vllm waits for it)
@pytest.mark.cpu_heavy
@pytest.mark.cpu_heavy_late
@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_latency_grows_with_response_length(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An untrained model rarely emits EOS, so max_response_length sets the answer length."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    model.save_pretrained(tmp_path / "random")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "random")
    fn = tmp_path / "count.py"
    fn.write_text("def n_answers(prompts, responses, examples):\n    return len(responses)\n")
    p50 = {}
    for length in (2, 48):
        out = run_trainer(["train", "--metrics-file", f"{length}.jsonl", "trainer.total_training_steps=1",
                           "trainer.test_freq=-1", "trainer.cpu_threads=1", f"data.max_response_length={length}",
                           f"actor_rollout_ref.model.path={tmp_path / 'random'}",
                           f"evaluation.custom=[n_answers={fn}:n_answers]"], tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        step0 = read_metrics(tmp_path / f"{length}.jsonl")[0]["data"]
        # the user metric, logged under eval/<name>: one answer per validation problem
        assert step0["eval/n_answers"] == len(tasks.split_problems()[1]) == 225
        assert step0["eval/response_length_mean"] > 0.8 * length
        assert step0["eval/latency_p95"] >= step0["eval/latency_p50"] > 0
        p50[length] = step0["eval/latency_p50"]
    assert p50[48] > 3 * p50[2], p50


def test_custom_evaluator_specs(tmp_path: Path) -> None:
    f = tmp_path / "ev.py"
    f.write_text("def stats(prompts, responses, examples):\n    return {'a': 1, 'b': 2.5}\n")
    name, fn = load_callable(f"mine={f}:stats")
    assert name == "mine" and fn([], [], []) == {"a": 1, "b": 2.5}
    assert load_callable("jsonlen=json:dumps")[0] == "jsonlen"
    with pytest.raises(ConfigError, match="'nope' is not a function"):
        load_callable(f"x={f}:nope")
    with pytest.raises(ConfigError, match="is not 'name=path/to/file.py:function'"):
        load_config("tiny_arith", ["evaluation.custom=[just_a_name]"])
