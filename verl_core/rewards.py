"""Rewards: rule-based scorers chosen by ``data_source``, user functions, HF reward models.

Every scorer follows verl's contract ``compute_score(data_source, solution_str,
ground_truth, extra_info) -> float | dict`` (a dict must hold ``"score"``), so a file
written for verl's ``custom_reward_function.path`` works unchanged here. The
sequence score is placed on the last valid response token (verl's convention) and
divided by ``reward_model.temperature``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from verl_core.config import Config, ConfigError
from verl_core.plugins import load_function

ScoreFn = Callable[..., Any]

_INT_RE = re.compile(r"-?\d+")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_GSM8K_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def arith_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the response's leading integer equals the ground truth, else 0.0."""
    m = _INT_RE.match(solution_str.strip())
    return 1.0 if m is not None and m.group(0) == str(ground_truth).strip() else 0.0


def gsm8k_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                format_score: float = 0.0, score: float = 1.0) -> float:
    """verl's GSM8K rule: the last ``#### N`` in the last 300 characters, ``,``/``$`` stripped."""
    matches = _GSM8K_RE.findall(solution_str[-300:])
    if not matches:
        return 0.0
    answer = matches[-1].replace(",", "").replace("$", "")
    return score if answer == str(ground_truth) else format_score


def addition_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                   format_score: float = 0.5) -> float:
    """The ``builtin:addition`` chat task ("... Reply with only the number."): 1.0 when the response is the
    number alone (surrounding spaces and one final period allowed), ``format_score`` when the last number in
    it is right but other words surround it ("The answer is 12."), else 0.0."""
    text = solution_str.strip()
    if text.removesuffix(".").strip() == str(ground_truth).strip():
        return 1.0
    numbers = _NUMBER_RE.findall(text)
    return format_score if numbers and numbers[-1] == str(ground_truth).strip() else 0.0


SCORERS: dict[str, ScoreFn] = {
    "synthetic/arith": arith_score,
    "synthetic/addition": addition_score,
    "openai/gsm8k": gsm8k_score,
    "gsm8k": gsm8k_score,
}


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
    """Dispatch on ``data_source`` like verl's ``default_compute_score``."""
    fn = SCORERS.get(data_source)
    if fn is None:
        raise ConfigError(f"no rule-based scorer for data_source={data_source!r} (known: {', '.join(SCORERS)}); "
                          "set custom_reward_function.path or reward_model.enable")
    return fn(data_source, solution_str, ground_truth, extra_info)


def load_custom_function(path: str, name: str) -> ScoreFn:
    """verl's ``custom_reward_function.path`` file and ``.name`` function."""
    if not Path(path).expanduser().is_file():
        raise ConfigError(f"custom_reward_function.path={path!r}: no such file")
    return load_function(path, name, f"custom_reward_function.path={path!r} / custom_reward_function.name={name!r}",
                         as_file=True)


def _as_float(result: Any) -> float:
    if isinstance(result, dict):
        return float(result["score"])
    return float(result)


class RuleReward:
    """Scores decoded responses with a rule/custom function."""

    def __init__(self, fn: ScoreFn) -> None:
        self.fn = fn

    on_token_ids = False

    def __call__(self, responses: list[str], examples: list[Any], prompts: list[str],
                 batch: dict[str, torch.Tensor] | None = None) -> list[float]:
        return [_as_float(self.fn(e.data_source, r, e.ground_truth, e.extra_info)) for r, e in zip(responses, examples)]


class ModelReward:
    """An HF ``AutoModelForSequenceClassification`` reward model; the score is logit 0 of prompt+response.

    When the reward model's tokenizer is the policy's (same vocabulary and pad token) and there is no
    ``max_length`` truncation, it scores the rollout's token ids directly, as verl does without an
    ``input_tokenizer`` switch: no decode/re-encode round trip, and the EOS the policy emitted is
    part of the scored sequence. Otherwise it scores ``prompt_text + response_text`` re-tokenized.
    """

    def __init__(self, path: str, device: torch.device, micro_batch: int | None, max_length: int | None,
                 policy_tokenizer: Any = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not Path(path).expanduser().is_dir():
            raise ConfigError(f"reward_model.model.path={path!r}: no such model directory")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.micro_batch, self.max_length = device, micro_batch, max_length
        self.on_token_ids = (policy_tokenizer is not None and max_length is None
                             and self.model.config.pad_token_id == policy_tokenizer.pad_token_id
                             and self.tokenizer.get_vocab() == policy_tokenizer.get_vocab())

    @torch.no_grad()
    def __call__(self, responses: list[str], examples: list[Any], prompts: list[str],
                 batch: dict[str, torch.Tensor] | None = None) -> list[float]:
        """Scores of the B responses; ``batch`` (the rollout's input_ids/attention_mask/position_ids) is used
        when :attr:`on_token_ids`."""
        if self.on_token_ids and batch is not None:
            return self._score_ids(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        texts = [p + r for p, r in zip(prompts, responses)]
        step = self.micro_batch or len(texts)
        out: list[float] = []
        for i in range(0, len(texts), step):
            enc = self.tokenizer(texts[i : i + step], return_tensors="pt", padding=True, add_special_tokens=False,
                                 truncation=self.max_length is not None, max_length=self.max_length).to(self.device)
            out += self.model(**enc).logits[:, 0].float().tolist()
        return out

    def _score_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
                   ) -> list[float]:
        """(B, L) left-padded prompt + right-padded response -> B scores, pooled at the last attended token.

        HF's sequence classifiers pool at the rightmost non-pad id, so masked positions are set to pad.
        """
        ids = input_ids.masked_fill(attention_mask == 0, int(self.model.config.pad_token_id))
        step = self.micro_batch or ids.shape[0]
        out: list[float] = []
        for i in range(0, ids.shape[0], step):
            sl = slice(i, i + step)
            out += self.model(input_ids=ids[sl], attention_mask=attention_mask[sl],
                              position_ids=position_ids[sl]).logits[:, 0].float().tolist()
        return out


def build_reward(cfg: Config, device: torch.device, policy_tokenizer: Any = None) -> RuleReward | ModelReward:
    """The reward of ``cfg``; ``policy_tokenizer`` lets a reward model with the same tokenizer score token ids."""
    rm = cfg.reward_model
    if rm.enable:
        assert rm.model.path is not None
        return ModelReward(rm.model.path, device, rm.micro_batch_size_per_gpu, rm.max_length, policy_tokenizer)
    if cfg.custom_reward_function.path:
        return RuleReward(load_custom_function(cfg.custom_reward_function.path, cfg.custom_reward_function.name))
    return RuleReward(default_compute_score)


def token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence score on its last valid response token. (B,), (B, T) -> (B, T)."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    out[torch.arange(out.shape[0]), last] = scores.float()
    return out * response_mask
