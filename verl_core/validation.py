"""Validation: the current policy answers the validation prompts (``rollout.val_kwargs``), scored by the reward and
the text evaluators, with the same sampling draw at every evaluation. Metrics: ``eval/*``, verl's per-source
``val-core/*`` and ``val-aux/*``, ``timing_s/testing``. The held-out test split (``data.test_files``) is validated
the same way once, at the last step, and logged as ``test/*``, ``test-core/*``, ``test-aux/*``
(:func:`heldout_metrics`)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from verl_core.batches import Sequences
from verl_core.config import Config
from verl_core.data import Example
from verl_core.evaluators import measure_latency
from verl_core.rollout import SamplingParams


def validation_metrics(scores: np.ndarray, sources: list[str]) -> dict[str, float]:
    """verl's per-source validation metrics (``process_validation_metrics`` in ``verl/trainer/ppo/metric_utils.py``)
    for ``scores`` (prompts, n), the n samples of each prompt, and each prompt's data source:

        val-core/<source>/reward/mean@n   mean over the source's prompts of the prompt's mean score
        val-aux/<source>/reward/std@n     mean over its prompts of the std (ddof 0) across the prompt's n samples
                                          (only when n > 1)

    Unlike ``eval/reward_std`` (the spread over all samples of all prompts), ``std@n`` is 0 when each prompt's
    samples agree, however much the prompts differ.
    """
    n = scores.shape[1]
    m: dict[str, float] = {}
    for src in sorted(set(sources)):
        rows = scores[[i for i, s in enumerate(sources) if s == src]]  # (prompts of src, n)
        m[f"val-core/{src}/reward/mean@{n}"] = float(rows.mean(axis=1).mean())
        if n > 1:
            m[f"val-aux/{src}/reward/std@{n}"] = float(rows.std(axis=1).mean())
    return m


TEST_PREFIXES = {"eval/": "test/", "val-core/": "test-core/", "val-aux/": "test-aux/",
                 "timing_s/testing": "timing_s/testing_heldout"}


def heldout_metric_name(name: str) -> str:
    """The name a validation metric has when measured on the test split (``eval/reward_mean`` ->
    ``test/reward_mean``); the driver's copy is ``hpo.experiment.heldout_metric`` with the verl_core backend's
    ``TEST_PREFIXES`` (``hpo/backends/verl_core/_names.py``)."""
    for old, new in TEST_PREFIXES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return "test/" + name


def heldout_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A validation of the test split, renamed (:func:`heldout_metric_name`)."""
    return {heldout_metric_name(k): v for k, v in metrics.items()}


class Validator:
    """Validates the policy behind ``rollout`` on ``data`` (see the module docstring)."""

    def __init__(self, cfg: Config, data: list[Example], rollout: Any, seqs: Sequences,
                 text_evaluators: list[Any], device: torch.device, latency: bool = True) -> None:
        self.cfg = cfg
        self.latency = latency
        self.data = data
        self.rollout = rollout
        self.seqs = seqs
        self.text_evaluators = text_evaluators
        self.device = device
        self.cuda = device.type == "cuda"

    @torch.no_grad()
    def __call__(self, step: int) -> dict[str, Any]:
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        params = SamplingParams(vk.n, vk.temperature, vk.top_p, vk.top_k, vk.do_sample,
                                self.cfg.data.max_response_length)
        bs = self.cfg.data.val_batch_size or len(self.data)
        scores: list[float] = []  # prompt i's vk.n samples at i*n .. i*n+n-1
        lengths: list[float] = []
        sources: list[str] = []  # one per prompt
        prompts: list[str] = []
        texts: list[str] = []
        examples: list[Example] = []
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[self.device] if self.cuda else []):
            torch.manual_seed(self.cfg.trainer.seed * 31 + 17)  # the same validation draw at every evaluation
            for start in range(0, len(self.data), bs):
                pb = self.seqs.prompts(list(range(start, min(start + bs, len(self.data)))), self.data)
                responses = self.rollout.generate(pb.input_ids, pb.attention_mask, params)
                batch = self.seqs.sequences(pb, responses, vk.n)
                batch_texts = self.seqs.decode(batch["responses"], batch["response_mask"])
                scores += self.seqs.score(pb, batch_texts, vk.n, batch).tolist()
                lengths += batch["response_mask"].sum(-1).tolist()
                sources += [e.data_source for e in pb.examples]
                examples += [e for e in pb.examples for _ in range(vk.n)]
                texts += batch_texts
            prompts = [e.prompt_text for e in examples]
            extra: dict[str, float] = {}
            for evaluator in self.text_evaluators:
                extra.update(evaluator(prompts, texts, examples))
            if self.latency and self.cfg.evaluation.latency.enable:
                extra.update(self._latency(params))
        arr = np.asarray(scores, dtype=np.float64)
        m: dict[str, Any] = {"eval/reward_mean": float(arr.mean()), "eval/reward_std": float(arr.std()),
                             "eval/response_length_mean": float(np.mean(lengths))}
        m.update(validation_metrics(arr.reshape(len(sources), vk.n), sources))
        m.update({f"eval/{k}": v for k, v in extra.items()})
        m["timing_s/testing"] = time.perf_counter() - t0
        return m

    def _latency(self, params: SamplingParams) -> dict[str, float]:
        """Seconds per request answering validation prompts in batches (see evaluators.measure_latency)."""
        one = SamplingParams(1, params.temperature, params.top_p, params.top_k, params.do_sample,
                             params.max_new_tokens)

        def generate(indices: list[int]) -> None:
            pb = self.seqs.prompts(indices, self.data)
            self.rollout.generate(pb.input_ids, pb.attention_mask, one)

        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        return measure_latency(generate, len(self.data), self.cfg.evaluation.latency, sync)
