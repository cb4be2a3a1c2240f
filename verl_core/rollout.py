"""Rollout engines: turn left-padded prompts into right-padded response token ids.

An engine only generates; the trainer scores the tokens with its own forward pass, so
the PPO ratio always uses the trainer's log-probs. ``sync_weights`` is called after
every actor update (a no-op for the HF engine, which generates with the actor itself). ``SamplingParams`` lives in
:mod:`verl_core.sampling` (re-exported here), below this module and the vLLM engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from verl_core.decode import FastDecoder, unsupported_reason
from verl_core.sampling import SamplingParams

if TYPE_CHECKING:
    from verl_core.config import RolloutConfig

__all__ = ["HFRollout", "RolloutEngine", "SamplingParams", "build_rollout", "response_mask"]


class RolloutEngine(Protocol):
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """(B, P) prompts -> (B * n, R) responses, prompt i's samples at rows i*n .. i*n+n-1, pad after EOS."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def response_mask(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for tokens up to and including the first EOS, 0 after. (B, R) -> (B, R) long."""
    is_eos = (responses == eos_id).long()
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos  # EOS strictly before t
    return (eos_before == 0).long()


class HFRollout:
    """Generation with the actor module itself (weights are always current).

    Llama-family models (see :mod:`verl_core.decode`) go through :class:`~verl_core.decode.FastDecoder`,
    others, or all with ``fast_decode=False``, through ``transformers.generate``. ``self.backend`` says
    which one ran last: ``fast`` or ``generate``. With ``SamplingParams.log_probs`` the fast path also
    leaves ``last_log_probs`` and ``last_entropy`` (B * n, R), from the decode steps' logits at the
    sampling temperature; otherwise they are None.
    """

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_id: int, autocast: Any, fast_decode: bool = True
                 ) -> None:
        self.model, self.pad_id, self.eos_id, self.autocast = model, pad_id, eos_id, autocast
        self.fast_decode = fast_decode
        self.backend = ""
        self._decoder: FastDecoder | None = None
        self.last_log_probs: torch.Tensor | None = None
        self.last_entropy: torch.Tensor | None = None

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        if params.n > 1:
            input_ids = input_ids.repeat_interleave(params.n, dim=0)
            attention_mask = attention_mask.repeat_interleave(params.n, dim=0)
        total = input_ids.shape[1] + params.max_new_tokens
        self.last_log_probs = self.last_entropy = None
        if self.fast_decode and unsupported_reason(self.model, total) is None:
            self.backend = "fast"
            self._decoder = self._decoder or FastDecoder(self.model)
            with self.autocast():
                responses, self.last_log_probs, self.last_entropy = self._decoder.generate(
                    input_ids, attention_mask, params.max_new_tokens, eos_id=self.eos_id, pad_id=self.pad_id,
                    do_sample=params.do_sample, temperature=params.temperature, top_k=params.top_k,
                    top_p=params.top_p, with_log_probs=params.log_probs)
        else:
            self.backend = "generate"
            responses = self._hf_generate(input_ids, attention_mask, params)
        if responses.shape[1] == 0:  # nothing generated (max_new_tokens reached at once): keep one pad column
            responses = torch.full((input_ids.shape[0], 1), self.pad_id, dtype=torch.long, device=input_ids.device)
            if self.last_log_probs is not None:
                self.last_log_probs = self.last_entropy = torch.zeros(responses.shape, device=responses.device)
        return responses

    def _hf_generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
                     ) -> torch.Tensor:
        from transformers import GenerationConfig

        kwargs: dict[str, Any] = {"do_sample": params.do_sample, "max_new_tokens": params.max_new_tokens,
                                  "pad_token_id": self.pad_id, "eos_token_id": self.eos_id}
        if params.do_sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k if params.top_k > 0 else 0)
        else:  # greedy ignores the temperature (verl's 0 included). transformers' neutral values keep the
            # model's generation_config sampling defaults (e.g. temperature 0.7) from being merged in and warned about.
            kwargs.update(temperature=1.0, top_p=1.0, top_k=50)
        gen_cfg = GenerationConfig(**kwargs)
        with self.autocast():
            out = self.model.generate(  # type: ignore[operator]
                input_ids=input_ids, attention_mask=attention_mask, generation_config=gen_cfg,
            )
        return out[:, input_ids.shape[1] :]

    def sync_weights(self, model: torch.nn.Module) -> None:
        return None


def build_rollout(name: str, model: torch.nn.Module, pad_id: int, eos_id: int, autocast: Any, *,
                  model_path: str | None = None, rollout_cfg: RolloutConfig | None = None,
                  max_prompt_length: int = 0, max_response_length: int = 0, seed: int = 0) -> RolloutEngine:
    """The engine named by ``actor_rollout_ref.rollout.name``; vllm also needs the model path and rollout config."""
    if name == "hf":
        return HFRollout(model, pad_id, eos_id, autocast, rollout_cfg.fast_decode if rollout_cfg else True)
    if name == "vllm":
        from verl_core.vllm_rollout import VLLMRollout, require_vllm

        require_vllm()  # one-line ConfigError with the install command
        if model_path is None or rollout_cfg is None:
            raise ValueError("build_rollout('vllm', ...) needs model_path= and rollout_cfg=")
        device = next(model.parameters()).device
        return VLLMRollout(model_path, rollout_cfg, max_prompt_length, max_response_length, pad_id, eos_id, device,
                           seed)
    raise ValueError(f"unknown rollout engine {name!r}")
