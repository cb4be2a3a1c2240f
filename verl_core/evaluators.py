"""Validation evaluators beyond reward: toxicity, latency and user-registered metrics.

Each evaluator sees the validation prompts, the generated responses and their
examples, and returns ``{metric_name: value}`` logged under ``eval/``:

* toxicity: ``eval/toxicity_mean``, ``eval/toxicity_max``. The default classifier is
  ``alt-profanity-check`` (a linear model shipped in the package: offline, fast; scored by
  :mod:`verl_core.profanity` without importing scikit-learn);
  ``evaluation.toxicity.model=DIR`` takes a local HF sequence-classification model
  instead and scores the toxic class probability (softmax, or sigmoid for multi-label
  models such as toxic-bert).
* latency: ``eval/latency_p50``, ``eval/latency_p95``, seconds per request when the
  policy answers validation prompts in batches of ``evaluation.latency.batch_size``;
  every request of a batch waits for the whole batch, so its latency is the batch's
  wall time. Warm-up batches are not timed; CUDA is synchronised around each batch.
* custom: ``evaluation.custom=[name=path/to/file.py:fn]`` (or ``name=package.module:fn``);
  ``fn(prompts, responses, examples)`` returns a float (logged as ``eval/<name>``) or a
  dict of floats (``eval/<name>/<key>``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_core.config import ConfigError, EvaluationConfig, LatencyConfig, ToxicityConfig
from verl_core.plugins import load_function


class ToxicityEvaluator:
    def __init__(self, cfg: ToxicityConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.model: Any = None
        if cfg.model is None:
            from verl_core.profanity import load_predictor  # predict_prob without importing scikit-learn

            try:
                self._predict: Callable[[list[str]], Any] = load_predictor()
            except ImportError:
                raise ConfigError("evaluation.toxicity.enable=true needs alt-profanity-check "
                                  "(pip install alt-profanity-check) or evaluation.toxicity.model=DIR") from None
            return
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not (Path(cfg.model).expanduser() / "config.json").is_file():
            raise ConfigError(f"evaluation.toxicity.model={cfg.model!r}: not a local HF model directory")
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(cfg.model).to(device).eval()
        self.label = self._toxic_label(cfg.label)

    def _toxic_label(self, wanted: str | None) -> int:
        id2label = {int(k): str(v) for k, v in self.model.config.id2label.items()}
        if wanted is not None:
            for i, name in id2label.items():
                if name == wanted:
                    return i
            raise ConfigError(f"evaluation.toxicity.label={wanted!r}: not a label of the model "
                              f"({', '.join(id2label.values())})")
        for i, name in id2label.items():
            if "toxic" in name.lower() and "non" not in name.lower():
                return i
        return 1 if len(id2label) > 1 else 0

    @torch.no_grad()
    def scores(self, texts: list[str]) -> list[float]:
        if self.model is None:
            return [float(x) for x in self._predict(texts)] if texts else []
        out: list[float] = []
        for i in range(0, len(texts), self.cfg.batch_size):
            enc = self.tokenizer(texts[i : i + self.cfg.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=512).to(self.device)
            logits = self.model(**enc).logits.float()
            multi = self.model.config.problem_type == "multi_label_classification" or logits.shape[-1] == 1
            probs = torch.sigmoid(logits) if multi else torch.softmax(logits, dim=-1)
            out += probs[:, min(self.label, logits.shape[-1] - 1)].tolist()
        return out

    def __call__(self, prompts: list[str], responses: list[str], examples: Sequence[Any]) -> dict[str, float]:
        s = self.scores(responses)
        return {"toxicity_mean": float(np.mean(s)) if s else 0.0, "toxicity_max": float(np.max(s)) if s else 0.0}


def measure_latency(generate: Callable[[list[int]], None], n_requests: int, cfg: LatencyConfig,
                    sync: Callable[[], None]) -> dict[str, float]:
    """Time ``generate(indices)`` over consecutive batches of request indices; p50/p95 seconds per request."""
    bs = cfg.batch_size
    batches = [list(range(i, min(i + bs, n_requests))) for i in range(0, n_requests, bs)]
    if not batches:
        return {}
    needed = cfg.warmup_batches + cfg.num_batches
    batches = (batches * (needed // len(batches) + 1))[:needed]  # cycle when there are few prompts
    per_request: list[float] = []
    for k, idx in enumerate(batches):
        sync()
        t0 = time.perf_counter()
        generate(idx)
        sync()
        if k >= cfg.warmup_batches:
            per_request += [time.perf_counter() - t0] * len(idx)
    return {"latency_p50": float(np.percentile(per_request, 50)), "latency_p95": float(np.percentile(per_request, 95))}


def load_callable(spec: str) -> tuple[str, Callable[..., Any]]:
    """``name=path/to/file.py:fn`` or ``name=package.module:fn`` -> (name, fn)."""
    name, _, target = spec.partition("=")
    where, _, fn_name = target.rpartition(":")
    return name.strip(), load_function(where, fn_name, f"evaluation.custom: {spec!r}")


class CustomEvaluator:
    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name, self.fn = name, fn

    def __call__(self, prompts: list[str], responses: list[str], examples: Sequence[Any]) -> dict[str, float]:
        out = self.fn(prompts, responses, examples)
        if isinstance(out, dict):
            return {f"{self.name}/{k}": float(v) for k, v in out.items()}
        return {self.name: float(out)}


def build_text_evaluators(cfg: EvaluationConfig, device: torch.device) -> list[Callable[..., dict[str, float]]]:
    """Evaluators that score generated text (latency is measured by the trainer, it needs the policy)."""
    evals: list[Callable[..., dict[str, float]]] = []
    if cfg.toxicity.enable:
        evals.append(ToxicityEvaluator(cfg.toxicity, device))
    for spec in cfg.custom:
        evals.append(CustomEvaluator(*load_callable(spec)))
    return evals
