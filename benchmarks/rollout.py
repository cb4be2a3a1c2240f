"""Item 5: rollout engines: our HF engine's decode loop vs ``transformers.generate``, and HF vs vLLM.

The first row runs ``benchmarks/decode_vs_generate.py`` in the main venv (per-repetition values, so
min/max are real).

The measurement itself lives in ``benchmarks/rollout_vllm_vs_hf.py`` (owned by the vLLM work) and runs
with ``.venv-vllm``'s python; it prints one JSON object with ``hf.tokens_per_s`` and ``vllm.tokens_per_s``
(medians of its own interleaved repetitions; it reports no per-repetition values, so min = max = median
here). When vLLM or that script is missing, or no GPU is visible, the row says why it was skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from benchmarks._common import REPO, VLLM_PY, Row, log, make_row, run_measured, tail

SCRIPT = REPO / "benchmarks" / "rollout_vllm_vs_hf.py"


def _vllm_importable() -> bool:
    if not VLLM_PY.exists():
        return False
    r = subprocess.run([str(VLLM_PY), "-c", "import vllm"], capture_output=True, timeout=300)
    return r.returncode == 0


def _json_object(stdout: str) -> dict[str, Any]:
    """The JSON object the script prints (possibly indented over many lines) at the end of stdout."""
    start = stdout.find("\n{")
    text = stdout[start + 1:] if start >= 0 else stdout[stdout.find("{"):]
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _skipped(name: str, why: str) -> Row:
    return Row(name=name, unit="tokens/s", ours=None, baseline=None, ratio=None, note=f"skipped: {why}",
               group="rollout")


def _decode_row(smoke: bool) -> Row:
    import tempfile
    from pathlib import Path

    from benchmarks._common import main_python
    from benchmarks.trainer_vs_trl import build_assets

    name = "rollout on CPU: our decode loop vs HF generate"
    log("rollout: our decode loop vs HF generate on CPU")
    with tempfile.TemporaryDirectory(prefix="bench_decode_") as tmp:
        build_assets(Path(tmp), 64)
        size = ["--batch", "8", "--new-tokens", "4", "--reps", "1"] if smoke else []
        m = run_measured([main_python(), "-m", "benchmarks.decode_vs_generate", tmp, *size],
                         env={"PYTHONPATH": str(REPO)}, cwd=str(REPO), timeout_s=1800)
    try:
        res = json.loads(m.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as err:
        return _skipped(name, f"no usable result ({err}; exit {m.returncode}): {tail(m.stderr, 3)}")
    note = (f"ours = HFRollout with fast_decode (verl_core/decode.py), baseline = model.generate; benchmark "
            f"policy (Qwen2 hidden 128, 2 layers), batch {res['batch']} x {res['new_tokens']} sampled tokens at "
            f"temperature 1, {res['threads']} threads; greedy tokens identical: {res['greedy_tokens_equal']}")
    return make_row(name, "tokens/s", res["ours_tokens_per_s"], res["generate_tokens_per_s"], group="rollout",
                    note=note, raw=res)


def bench(smoke: bool, skip_vllm: bool = False) -> list[Row]:
    rows: list[Row] = [_decode_row(smoke)]
    cpu_name = "rollout on CPU: vLLM vs HF generate"
    if skip_vllm:
        rows.append(_skipped(cpu_name, "--skip-vllm"))
    elif not SCRIPT.exists():
        rows.append(_skipped(cpu_name, "benchmarks/rollout_vllm_vs_hf.py is not in this checkout yet"))
    elif not _vllm_importable():
        rows.append(_skipped(cpu_name, "vLLM is not importable in .venv-vllm"))
    else:
        log("rollout: vLLM vs HF on CPU")
        argv = [str(VLLM_PY), str(SCRIPT)] + (["--batch", "8", "--new-tokens", "8", "--reps", "1"] if smoke else [])
        m = run_measured(argv, env={"PYTHONPATH": str(REPO)}, cwd=str(REPO), timeout_s=1800)
        try:
            res = _json_object(m.stdout)
            note = (f"ours = vLLM engine, baseline = HF generate; batch {res.get('batch')} x "
                    f"{res.get('new_tokens')} greedy tokens, median of {res.get('reps')} interleaved reps "
                    f"(script: benchmarks/rollout_vllm_vs_hf.py)")
            rows.append(make_row(cpu_name, "tokens/s", [float(res["vllm"]["tokens_per_s"])],
                                 [float(res["hf"]["tokens_per_s"])], group="rollout", note=note, raw=res))
            rows[-1].repetitions = int(res.get("reps") or 1)
        except (ValueError, KeyError) as err:
            rows.append(_skipped(cpu_name, f"the script gave no usable result ({err}; exit {m.returncode}): "
                                           f"{tail(m.stderr, 3)}"))
    gpu_name = "rollout on GPU: vLLM vs HF generate"
    if shutil.which("nvidia-smi") is None:
        rows.append(_skipped(gpu_name, "no GPU on this machine (run benchmarks/gpu_rollout.py on one)"))
    else:
        rows.append(_skipped(gpu_name, "GPU present but the GPU rollout run is benchmarks/gpu_rollout.py's job"))
    return rows
