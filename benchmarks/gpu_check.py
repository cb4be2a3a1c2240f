"""GPU readiness check, one script and one table (``make gpu-check``; about 10 minutes on one GPU, 2-3 of them the
real verl study; ``--skip-verl`` leaves it out).

    python benchmarks/gpu_check.py             # CUDA: SmolLM2-135M-Instruct, bf16 autocast, gradient checkpointing
    python benchmarks/gpu_check.py --dry-run   # CPU: the same plan on the builtin tiny model (what CPU can run)

The plan, each check one row (``ok`` / ``FAIL`` / ``skipped``, with why in the detail):

1. ``device``: torch, CUDA device and bf16 support (dry run: the CPU);
2. ``train``: ``python -m verl_core train --config smollm2_addition`` on CUDA for ``--steps`` steps with
   ``enable_gradient_checkpointing=true`` (bf16 autocast is the trainer's CUDA default), saving a checkpoint
   one step before the end; seconds per step, reward, ``perf/max_memory_allocated_gb``, NVML utilization
   (``perf/actor_gpu_util``, ``perf/gpu_util``) when the trainer logs it;
3. ``memory estimate``: ``verl_core.memory.estimate`` for that config vs the measured peak
   (``max_memory_allocated`` on CUDA, peak RSS on CPU), ratio estimate / measured;
4. ``rollout vLLM vs HF``: the same run with ``rollout.name=vllm``; ``timing_s/gen`` of both (steps after
   the first) and the vLLM weight-sync probe ``rollout/sync_logprob_diff``; skipped when vLLM is missing;
5. ``checkpoint resume``: the last checkpoint removed, the run started again in the same directory resumes
   from the one before and must reproduce the last step's metrics (|diff| of score and policy loss);
6. ``4-bit reward model``: the policy checkpoint loaded as ``AutoModelForSequenceClassification`` in 4 bits
   (bitsandbytes, ``device_map="auto"``), scoring a batch; its memory footprint vs the estimator's 4-bit
   formula; skipped without CUDA or bitsandbytes;
7. ``verl study``: REAL verl 0.9.1 through the driver: ``python -m hpo search --space verl_grpo_gsm8k`` with
   SmolLM2-135M-Instruct (its local directory), the small GSM8K-format parquet (written by the space's prepare
   step into the work directory), ``--verl-trials`` trials of 2 steps each, validation at step 2, vLLM eager;
   verl runs in ``--verl-python`` (``make gpu-check`` builds ``.venv-gpu-verl`` with ``verl[vllm]==0.9.1``).
   Checked: every trial COMPLETE, its metrics file has lines, the objective ``val-core/openai/gsm8k/reward/mean@1``
   is recorded, no Ray process (raylet, gcs_server, ``ray::``) is left; then ``verl memory estimate``: the
   device's peak used memory during the study (NVML, every 0.2 s, above what was used before) vs
   ``verl_core.memory.estimate_verl`` of the trial's composed config (ratio), and verl's
   ``perf/max_memory_allocated_gb`` of the actor worker vs the estimate's actor allocator peak.
   Dry run: the same command is printed, and ``python -m hpo validate`` of the same space and overrides composes
   every corner with real verl (``.venv-verl``, CPU) and prints its estimate; skipped without ``.venv-verl``.

Exit code 0 when no check failed (skipped ones do not fail). ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.memory_estimate import peak_rss_of  # noqa: E402

COMMON = ["trainer.val_before_train=false", "trainer.test_freq=0", "trainer.logger=file",
          "evaluation.latency.enable=false", "actor_rollout_ref.model.enable_gradient_checkpointing=true"]


@dataclass(frozen=True)
class Plan:
    """What one mode runs: the config and its overrides, the device, steps."""

    config: str
    overrides: tuple[str, ...]
    device: str
    steps: int
    vllm: tuple[str, ...] = ()


REAL = Plan("smollm2_addition", ("data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
                                 "data.max_response_length=64"), "cuda", 4,
            ("actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.enforce_eager=true"))
DRY = Plan("tiny_arith", ("data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                          "actor_rollout_ref.actor.ppo_epochs=1"),
           "cpu", 3, ("actor_rollout_ref.rollout.cpu_kvcache_space_gb=0.25",))


@dataclass
class Check:
    name: str
    status: str = "ok"
    detail: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """A finished trainer run: exit code, peak RSS, per-step metrics."""

    rc: int
    peak_rss_gib: float
    steps: dict[int, dict[str, Any]]
    stderr: str
    wall_s: float

    def series(self, key: str, skip_first: bool = False) -> list[float]:
        items = sorted(self.steps.items())[1 if skip_first else 0:]
        return [float(d[key]) for _, d in items if isinstance(d.get(key), (int, float))]


def train(plan: Plan, work: Path, name: str, extra: tuple[str, ...] = (), steps: int | None = None) -> Run:
    metrics = work / f"{name}.jsonl"
    argv = [sys.executable, "-m", "verl_core", "train", "--config", plan.config, "--metrics-file", str(metrics),
            *COMMON, f"trainer.device={plan.device}", f"trainer.total_training_steps={steps or plan.steps}",
            *plan.overrides, *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    rc, peak, tail = peak_rss_of(argv, env, 900)
    out: dict[int, dict[str, Any]] = {}
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            out[int(rec["step"])] = rec["data"]
    return Run(rc, peak, out, tail, time.time() - t0)


def _last(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs) if xs else float("nan")


def check_device(plan: Plan) -> Check:
    import torch

    c = Check("device")
    if plan.device == "cpu":
        c.detail = f"cpu, torch {torch.__version__}, {torch.get_num_threads()} threads (dry run)"
        return c
    if not torch.cuda.is_available():
        c.status, c.detail = "FAIL", f"torch {torch.__version__} sees no CUDA device (CPU build? CUDA_VISIBLE_DEVICES?)"
        return c
    c.detail = (f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB, "
                f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'NO'}, torch {torch.__version__}")
    return c


def check_train(plan: Plan, work: Path) -> tuple[Check, Run]:
    c = Check("train (grad checkpointing" + (", bf16 autocast)" if plan.device == "cuda" else ", fp32)"))
    t0 = time.time()
    run = train(plan, work, "hf", (f"trainer.save_freq={plan.steps - 1}", f"trainer.default_local_dir={work / 'ckpt'}"))
    c.seconds = time.time() - t0
    if run.rc != 0 or plan.steps not in run.steps:
        c.status, c.detail = "FAIL", f"exit {run.rc}: {_last(run.stderr)}"
        return c, run
    score = run.series("critic/score/mean")
    c.detail = (f"{plan.steps} steps, {_median(run.series('timing_s/step', True)):.2f} s/step, "
                f"score {score[0]:.3f} -> {score[-1]:.3f}")
    mem = run.series("perf/max_memory_allocated_gb")
    if mem:
        c.detail += f", max_memory_allocated {max(mem):.2f} GiB"
    logged = [(k, run.series(k)) for k in ("perf/actor_gpu_util", "perf/gpu_util")]
    logged = [(k, v) for k, v in logged if v]
    for k, v in logged:
        c.detail += f", {k.removeprefix('perf/')} {_median(v):.0f}%"
    if plan.device == "cuda" and not logged:
        c.detail += ", no NVML utilization logged (perf/gpu_util)"
    c.data = {"steps": run.steps}
    return c, run


def check_memory(plan: Plan, run: Run) -> Check:
    from verl_core.config import load_config
    from verl_core.memory import estimate

    c = Check("memory estimate")
    cfg = load_config(plan.config, [*COMMON, f"trainer.device={plan.device}",
                                    f"trainer.total_training_steps={plan.steps}", *plan.overrides])
    est = estimate(cfg, device=plan.device)
    if plan.device == "cuda":
        measured = max(run.series("perf/max_memory_allocated_gb"), default=float("nan"))
        ours, what = est.allocated_total / 2**30, "max_memory_allocated"
    else:
        measured, ours, what = run.peak_rss_gib, est.total / 2**30, "peak RSS"
    ratio = ours / measured if measured == measured and measured > 0 else float("nan")
    c.detail = f"estimate {ours:.2f} GiB vs {what} {measured:.2f} GiB: ratio {ratio:.2f} (peak phase {est.peak_phase})"
    c.status = "ok" if 0.8 <= ratio <= 1.2 else "FAIL"
    c.data = {"estimate_gib": ours, "measured_gib": measured, "ratio": ratio}
    return c


def check_rollout(plan: Plan, work: Path, hf: Run) -> Check:
    import importlib.util

    c = Check("rollout vLLM vs HF")
    if importlib.util.find_spec("vllm") is None:
        c.status, c.detail = "skipped", "vllm not installed (GPU: pip install vllm; CPU: make install-vllm)"
        return c
    t0 = time.time()
    run = train(plan, work, "vllm", ("actor_rollout_ref.rollout.name=vllm", *plan.vllm))
    c.seconds = time.time() - t0
    if run.rc != 0:
        c.status, c.detail = "FAIL", f"exit {run.rc}: {_last(run.stderr)}"
        return c
    g_hf, g_vl = _median(hf.series("timing_s/gen", True)), _median(run.series("timing_s/gen", True))
    diff = max(run.series("rollout/sync_logprob_diff"), default=float("nan"))
    c.detail = f"gen {g_hf:.2f} s (hf) vs {g_vl:.2f} s (vllm): {g_hf / g_vl:.2f}x; sync probe |dlogp| {diff:.2g}"
    c.data = {"gen_hf_s": g_hf, "gen_vllm_s": g_vl, "sync_logprob_diff": diff}
    return c


def check_resume(plan: Plan, work: Path, full: Run) -> Check:
    c = Check("checkpoint resume")
    last = work / "ckpt" / f"global_step_{plan.steps}"
    if not (work / "ckpt" / f"global_step_{plan.steps - 1}").is_dir():
        c.status, c.detail = "FAIL", f"no checkpoint at step {plan.steps - 1} in {work / 'ckpt'}"
        return c
    shutil.rmtree(last, ignore_errors=True)
    from verl_core.checkpoint import TRACKER

    (work / "ckpt" / TRACKER).write_text(str(plan.steps - 1))
    t0 = time.time()
    run = train(plan, work, "resumed", (f"trainer.save_freq={plan.steps - 1}",
                                        f"trainer.default_local_dir={work / 'ckpt'}", "trainer.resume_mode=auto"))
    c.seconds = time.time() - t0
    if run.rc != 0 or plan.steps not in run.steps or plan.steps - 1 in run.steps:
        c.status = "FAIL"
        c.detail = f"exit {run.rc}, steps logged {sorted(run.steps)}: {_last(run.stderr)}"
        return c
    a, b = full.steps[plan.steps], run.steps[plan.steps]
    keys = [k for k in ("critic/score/mean", "actor/pg_loss") if k in a and k in b]
    diffs: dict[str, Any] = {k: abs(float(a[k]) - float(b[k])) for k in keys}
    worst = max(diffs.values(), default=float("nan"))
    c.detail = f"resumed at step {plan.steps - 1}; step {plan.steps} |diff| " + \
        ", ".join(f"{k} {v:.2g}" for k, v in diffs.items())
    # CPU is deterministic; on CUDA kernels may differ in the last bits (atomics in backward)
    c.status = "ok" if worst <= (0.0 if plan.device == "cpu" else 1e-2) else "FAIL"
    c.data = diffs
    return c


def check_reward_4bit(plan: Plan) -> Check:
    import importlib.util

    import torch

    c = Check("4-bit reward model")
    if plan.device != "cuda" or not torch.cuda.is_available():
        c.status, c.detail = "skipped", "bitsandbytes 4-bit needs CUDA"
        return c
    if importlib.util.find_spec("bitsandbytes") is None:
        c.status, c.detail = "skipped", "bitsandbytes not installed (pip install bitsandbytes)"
        return c
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BitsAndBytesConfig

    from verl_core.memory import ModelShape, read_model_config
    from verl_core.pretrained import ensure_smollm2

    t0 = time.time()
    path = ensure_smollm2(log=False)
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_type="nf4")
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, quantization_config=q,
                                                               device_map="auto", dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(path)
    model.config.pad_token_id = tok.pad_token_id
    enc = tok(["What is 2 + 3? 5", "What is 2 + 3? The answer is 7."] * 4, return_tensors="pt", padding=True)
    with torch.no_grad():
        scores = model(**enc.to(model.device)).logits[:, 0].float()
    c.seconds = time.time() - t0
    footprint = model.get_memory_footprint()
    shape = ModelShape.from_config({**read_model_config("builtin:smollm2"), "dtype": "bfloat16",
                                    "quantization_config": {"load_in_4bit": True}})
    est = shape.weight_bytes(shape.value_model_params())
    ok = bool(torch.isfinite(scores).all())
    c.status = "ok" if ok and 0.8 <= est / footprint <= 1.2 else "FAIL"
    layer = type(model.model.layers[0].mlp.up_proj).__name__
    c.detail = (f"{layer} layers, footprint {footprint / 2**20:.0f} MiB vs "
                f"estimate {est / 2**20:.0f} MiB (ratio {est / footprint:.2f}); scores finite: {ok}")
    return c

# ----------------------------------------------------------------------------- real verl through the driver
VERL_SPACE = "verl_grpo_gsm8k"
VERL_STUDY = "gpu-check-verl"
VERL_METRIC = "val-core/openai/gsm8k/reward/mean@1"
GPU_VERL_VENV = REPO / ".venv-gpu-verl"  # make gpu-check: verl[vllm]==0.9.1 (CUDA torch, vLLM) in a venv of its own
DRY_VERL_VENV = REPO / ".venv-verl"  # make install-verl: CPU verl 0.9.1, enough to compose and validate


def verl_space_overrides(work: Path, model_dir: Path, verl_python: str, n_trials: int) -> list[str]:
    """``--override`` texts shrinking the shipped verl space to a few minutes on one GPU: 2 steps per trial,
    validation at step 2 (the objective), no checkpoint, short responses, vLLM eager (no CUDA-graph capture), one
    mini-batch choice, the local model and the data in the work directory."""
    return [f"trial.python={verl_python}", "trial.timeout_s=480", f"study.n_trials={n_trials}",
            "params.mini_batch.choices=[16]",
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={work / 'gsm8k' / 'train.parquet'}", f"data.val_files={work / 'gsm8k' / 'test.parquet'}",
            "data.max_response_length=128", "trainer.total_training_steps=2", "trainer.test_freq=2",
            "trainer.val_before_train=false", "trainer.save_freq=-1",
            "actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]


def verl_search_argv(work: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "hpo", "search", "--space", VERL_SPACE, "--study", VERL_STUDY,
            "--studies-dir", str(work / "studies"), *(a for o in overrides for a in ("--override", o))]


def _model_dir(plan: Plan, work: Path) -> Path:
    """SmolLM2-135M-Instruct as a directory verl can load (CUDA); dry: a directory with only its config.json, which
    is all that composing and estimating read."""
    if plan.device == "cuda":
        from verl_core.pretrained import ensure_smollm2

        return Path(ensure_smollm2(log=False))
    from verl_core.pretrained import smollm2_config

    d = work / "smollm2-config"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(smollm2_config()))
    return d


class _PeakGpuMemory:
    """Peak used memory of GPU 0 (NVML, all processes) every ``period`` s, above what was used at start."""

    def __init__(self, period: float = 0.2) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.start = self.peak = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        self.total = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).total)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self.peak = max(self.peak, int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


def ray_processes(since: float) -> list[str]:
    """Ray's processes (raylet, gcs_server, ``ray::`` workers) started after ``since`` and still alive."""
    import psutil

    left = []
    for proc in psutil.process_iter(["name", "cmdline", "create_time"]):
        try:
            name, cmd = proc.info["name"] or "", " ".join(proc.info["cmdline"] or [])
            if proc.info["create_time"] >= since and (name in ("raylet", "gcs_server") or cmd.startswith("ray::")
                                                      or "ray/_private/workers" in cmd):
                left.append(f"{proc.pid} {name or cmd[:40]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


def verl_estimate(work: Path, overrides: list[str], values: dict[str, Any], verl_python: str,
                  gpu_total: int) -> Any:
    """``estimate_verl`` of the config a trial with ``values`` ran (composed by verl in ``verl_python``)."""
    from hpo._preflight import verl_memory_inputs
    from hpo._space import load_space
    from verl_core.memory_verl import estimate_verl

    space = load_space(VERL_SPACE, overrides, check=False)
    [(info, keys)] = verl_memory_inputs(space, [space.trainer_overrides(values)], 1, verl_python)
    return estimate_verl(keys, use_critic=bool(info["use_critic"]), use_ref=bool(info["use_reference_policy"]),
                         gpu_total_bytes=gpu_total)


def check_verl_dry(work: Path, argv: list[str], overrides: list[str], verl_python: str) -> Check:
    """The plumbing of the verl stage without a GPU: the search command, and ``validate`` of the same space and
    overrides (every corner composed by real verl on the CPU, with its memory estimate)."""
    c = Check("verl study")
    shown = " ".join(argv[1:])
    print(f"[gpu-check] verl study would run: {shown}", file=sys.stderr, flush=True)
    if not Path(verl_python).exists():
        c.status, c.detail = "skipped", f"no {verl_python} (make install-verl); would run: {shown}"
        return c
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", VERL_SPACE,
                           *(a for o in overrides for a in ("--override", o))], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    c.seconds = time.time() - t0
    out = proc.stdout
    print(out, file=sys.stderr, flush=True)
    corners = out.count("\ncorner ") + out.startswith("corner ")
    total = re.search(r"^TOTAL \(peak\)\s+cuda\s+([\d.]+)\s+persistent \+ phase (\w+)", out, re.M)
    if proc.returncode != 0 or "All checks passed" not in out or total is None:
        c.status, c.detail = "FAIL", f"validate exit {proc.returncode}: {_last(proc.stderr or out)}"
        return c
    c.detail = (f"validate: {corners} corner(s) composed by verl 0.9.1, largest estimate {total[1]} GiB (peak phase "
                f"{total[2]}) on the assumed GPU; would run: {shown}")
    c.data = {"argv": argv, "validate": out}
    return c


def check_verl(plan: Plan, work: Path, verl_python: str, n_trials: int) -> list[Check]:
    """Real verl on the GPU through the driver (module docstring, item 7); two rows: the study and its memory."""
    c, m = Check("verl study"), Check("verl memory estimate")
    model = _model_dir(plan, work)
    overrides = verl_space_overrides(work, model, verl_python, n_trials)
    argv = verl_search_argv(work, overrides)
    if plan.device != "cuda":
        c = check_verl_dry(work, argv, overrides, verl_python)
        m.status, m.detail = "skipped", "needs the GPU run (dry run: the estimate is printed by validate above)"
        return [c, m]
    if not Path(verl_python).exists():
        c.status = m.status = "skipped"
        c.detail = m.detail = f"no {verl_python}: make gpu-check builds it (verl[vllm]==0.9.1)"
        return [c, m]
    started = time.time()
    peak = _PeakGpuMemory()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    device_peak = peak.stop()
    c.seconds = time.time() - started
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=VERL_STUDY, storage=f"sqlite:///{work / 'studies' / VERL_STUDY}.db") \
        if (work / "studies" / f"{VERL_STUDY}.db").exists() else None
    trials = study.trials if study is not None else []
    problems = [] if proc.returncode == 0 else [f"search exit {proc.returncode}: {_last(proc.stderr)}"]
    lines, objective, allocated = 0, [], []
    for t in trials:
        tdir = work / "studies" / VERL_STUDY / "trials" / str(t.number)
        metrics = tdir / "metrics.jsonl"
        recs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        lines += len(recs)
        objective += [r["data"][VERL_METRIC] for r in recs if VERL_METRIC in r.get("data", {})]
        allocated += [float(r["data"]["perf/max_memory_allocated_gb"]) for r in recs
                      if "perf/max_memory_allocated_gb" in r.get("data", {})]
        if t.state != optuna.trial.TrialState.COMPLETE or not recs:
            problems.append(f"trial {t.number} {t.state.name} ({t.user_attrs.get('fail_reason', '')}), "
                            f"{len(recs)} metric lines")
    if len(trials) < n_trials:
        problems.append(f"{len(trials)} of {n_trials} trials")
    if not objective:
        problems.append(f"no {VERL_METRIC} recorded")
    left = ray_processes(started)
    if left:
        problems.append(f"Ray processes left: {', '.join(left[:5])}")
    c.status = "FAIL" if problems else "ok"
    c.detail = (f"{len(trials)} trial(s), {lines} metric lines, {VERL_METRIC} {objective}, "
                f"Ray processes left: {len(left)}" + (f"; {'; '.join(problems)}" if problems else ""))
    if not trials:
        m.status, m.detail = "FAIL", "no trial ran"
        return [c, m]
    est = verl_estimate(work, overrides, {k: v for k, v in trials[0].params.items()}, verl_python, peak.total)
    ratio = est.total / device_peak if device_peak > 0 else float("nan")
    ours_alloc = est.allocated_peak("actor") / 2**30
    alloc = max(allocated, default=float("nan"))
    m.detail = (f"estimate {est.total / 2**30:.2f} GiB vs device peak {device_peak / 2**30:.2f} GiB (NVML, all "
                f"processes): ratio {ratio:.2f} (peak phase {est.peak_phase}); actor allocator {ours_alloc:.2f} GiB "
                f"vs perf/max_memory_allocated_gb {alloc:.2f}: ratio {ours_alloc / alloc:.2f}")
    # a pre-flight estimate may be pessimistic (full-length sequences) but must not be far below what was used
    m.status = "ok" if 0.9 <= ratio <= 2.0 else "FAIL"
    m.data = {"estimate_gib": est.total / 2**30, "device_peak_gib": device_peak / 2**30, "ratio": ratio,
              "actor_allocated_estimate_gib": ours_alloc, "actor_allocated_gib": alloc, "table": est.render()}
    print(est.render(peak.total, "GPU 0 total"), file=sys.stderr, flush=True)
    return [c, m]


def render(checks: list[Check], plan: Plan, dry: bool) -> str:
    head = ("check", "status", "s", "detail")
    rows = [(c.name, c.status, f"{c.seconds:.0f}", c.detail) for c in checks]
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    mode = "DRY RUN on CPU (tiny model)" if dry else "CUDA"
    lines = [f"gpu-check: {mode}, config {plan.config} {' '.join(plan.overrides)}, {plan.steps} steps", ""]
    lines.append(f"{head[0]:<{w[0]}}  {head[1]:<{w[1]}}  {head[2]:>{w[2]}}  {head[3]}")
    lines.append("-" * (sum(w) + 6 + 60))
    lines += [f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="run the plan on CPU with the tiny model")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: 4 on CUDA, 3 dry)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    p.add_argument("--verl-python", default=None,
                   help=f"verl's interpreter (default {GPU_VERL_VENV.name}/bin/python; dry: {DRY_VERL_VENV.name})")
    p.add_argument("--verl-trials", type=int, default=1, help="trials of the verl study (default 1)")
    p.add_argument("--skip-verl", action="store_true", help="leave out the real verl stage")
    args = p.parse_args(argv)
    plan = DRY if args.dry_run else REAL
    if args.steps is not None:
        if args.steps < 2:
            print(f"error: --steps {args.steps}: the resume check needs at least 2", file=sys.stderr)
            return 2
        plan = Plan(plan.config, plan.overrides, plan.device, args.steps, plan.vllm)
    checks: list[Check] = []

    def guarded(name: str, fn: Callable[[], Check]) -> Check:
        try:
            c = fn()
        except Exception as err:  # one failing check must not hide the others
            c = Check(name, "FAIL", f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err) else ''}")
        checks.append(c)
        print(f"[gpu-check] {c.name}: {c.status} {c.detail}", file=sys.stderr, flush=True)
        return c

    dev = guarded("device", lambda: check_device(plan))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        if dev.status == "ok":
            holder: dict[str, Run] = {}

            def do_train() -> Check:
                c, holder["run"] = check_train(plan, work)
                return c

            t = guarded("train", do_train)
            if t.status == "ok":
                run = holder["run"]
                guarded("memory estimate", lambda: check_memory(plan, run))
                guarded("rollout vLLM vs HF", lambda: check_rollout(plan, work, run))
                guarded("checkpoint resume", lambda: check_resume(plan, work, run))
        guarded("4-bit reward model", lambda: check_reward_4bit(plan))
        if not args.skip_verl:
            verl_python = args.verl_python or str((DRY_VERL_VENV if args.dry_run else GPU_VERL_VENV) / "bin" / "python")
            rows: list[Check] = []

            def do_verl() -> Check:
                rows.extend(check_verl(plan, work, verl_python, args.verl_trials))
                return rows[0]

            guarded("verl study", do_verl)
            if len(rows) > 1:
                checks.append(rows[1])
                print(f"[gpu-check] {rows[1].name}: {rows[1].status} {rows[1].detail}", file=sys.stderr, flush=True)
    print(render(checks, plan, args.dry_run))
    if args.json is not None:
        args.json.write_text(json.dumps([{"name": c.name, "status": c.status, "detail": c.detail,
                                          "seconds": c.seconds} for c in checks], indent=1) + "\n")
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
