"""GPU readiness check, one script and one table (``make gpu-check``; about 10 minutes on one GPU, 4-5 of them real
verl, 2-3 more with two GPUs; ``--skip-verl`` leaves verl out).

    python benchmarks/gpu_check.py             # CUDA: SmolLM2-135M-Instruct, bf16 autocast, gradient checkpointing
    python benchmarks/gpu_check.py --dry-run   # CPU: the same plan on the builtin tiny model (what CPU can run)

The plan, each check one row (``ok`` / ``FAIL`` / ``skipped``, with why in the detail), with the expected time on
one H100/H200-class GPU:

1. ``device`` (1 s): torch, CUDA device and bf16 support (dry run: the CPU);
2. ``train`` (~1 min): ``python -m verl_core train --config smollm2_addition`` on CUDA for ``--steps`` steps with
   ``enable_gradient_checkpointing=true`` (bf16 autocast is the trainer's CUDA default), saving a checkpoint
   one step before the end; seconds per step, reward, ``perf/max_memory_allocated_gb``, NVML utilization
   (``perf/actor_gpu_util``, ``perf/gpu_util``) when the trainer logs it;
3. ``memory estimate`` (1 s): ``verl_core.memory.estimate`` for that config vs the measured peak
   (``max_memory_allocated`` on CUDA, peak RSS on CPU), ratio estimate / measured;
4. ``rollout vLLM vs HF`` (~1.5 min): the same run with ``rollout.name=vllm``; ``timing_s/gen`` of both (steps
   after the first) and the vLLM weight-sync probe ``rollout/sync_logprob_diff``; skipped when vLLM is missing;
5. ``checkpoint resume`` (~45 s): the last checkpoint removed, the run started again in the same directory resumes
   from the one before and must reproduce the last step's metrics (|diff| of score and policy loss);
6. ``4-bit reward model`` (~20 s): the policy checkpoint loaded as ``AutoModelForSequenceClassification`` in 4 bits
   (bitsandbytes, ``device_map="auto"``), scoring a batch; its memory footprint vs the estimator's 4-bit
   formula; skipped without CUDA or bitsandbytes;
7. REAL verl 0.9.1 through the driver, as a user runs it: ``python -m hpo search --space verl_grpo_gsm8k`` with
   SmolLM2-135M-Instruct (its local directory), a small GSM8K-format parquet in the work directory, short
   responses, vLLM eager (:func:`verl_space_overrides`); verl runs in ``--verl-python`` (``make gpu-check`` builds
   ``.venv-gpu-verl`` with ``verl[vllm]==0.9.1``). Four rows:

   * ``verl study`` and ``verl SIGTERM + resume`` (one study, ~4-5 min: two verl start-ups of ~1.5 min, Ray,
     vLLM and FSDP, 4 steps, the driver's config checks): ``--verl-trials`` trials of :data:`VERL_STEPS` steps,
     a checkpoint after every step (``trainer.save_freq=1``), validation (the objective) at the last. The driver
     gets SIGTERM once a trial has a complete checkpoint (waited on: ``verl._launch.checkpoint_step`` of its
     ``checkpoints/``); it must exit 143 with the trial queued (a WAITING retry) and no Ray process (raylet,
     gcs_server, ``ray::``) left. Then ``python -m hpo resume``: the retry must complete with a finite value and
     the objective in its metrics, resumed from that checkpoint or a later one (``trainer.resume_from_path``),
     continuing after it (its first logged step after the checkpoint's, or verl's "Resuming from" in its log),
     and no Ray process left. ``verl study``: every trial but the interrupted one COMPLETE without a
     ``fail_reason`` (a crash is COMPLETE with the worst value), its metric lines, the objective logged. Measured:
     seconds to the checkpoint, to the driver's exit, of the resume; the step resumed from.
   * ``verl two trials at once`` (~2.5 min, two GPUs): ``trial.n_jobs=2``, ``trial.gpus_per_trial=1``, two trials
     of :data:`PAIR_STEPS` steps: both COMPLETE with the objective, on different GPUs, and their wall-time
     intervals (``command.json`` written at spawn, plus the driver's ``wall_time_s``) overlap. This is what
     catches trials colliding on one host (verl's ZMQ sockets under ``/tmp``, Ray clusters, device locks).
     With one GPU: ``skipped``, "one GPU" (trials sharing one GPU are not attempted).
   * ``verl memory estimate`` (~15 s): ``verl_core.memory_verl.judge_verl`` of a completed trial's composed config,
     at the expected lengths (the largest ``prompt_length/mean`` / ``response_length/mean`` the study logged) and
     in the worst case (every sequence at its maximum), vs the GPU's peak used memory during the study (NVML
     every 0.2 s, all processes, above what was used before); ok when expected / measured is within
     :data:`EXPECTED_RATIO` (the pre-flight refuses by the expected estimate) and worst / measured is at least
     :data:`WORST_MIN_RATIO`; also verl's ``perf/max_memory_allocated_gb`` vs the estimate's actor allocator peak.

   Dry run: nothing runs on a GPU: the plan (every command: search, SIGTERM point, resume, the pair's search) is
   printed, ``python -m hpo validate`` of the study's space and overrides composes every corner with real verl
   (``.venv-verl``, CPU) and prints its estimate (row ``verl study``; skipped without ``.venv-verl``), the pair's
   space is loaded; the other verl rows are ``skipped`` with their plan.

Exit code 0 when no check failed (skipped ones do not fail). ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import signal
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
VERL_STUDY = "gpu-check-verl"  # SIGTERMed and resumed: rows verl study, verl SIGTERM + resume, verl memory estimate
PAIR_STUDY = "gpu-check-verl-pair"  # row verl two trials at once
VERL_STEPS = 4  # a trial of the resumed study: a checkpoint after every step, validation (the objective) at the last
PAIR_STEPS = 2
GPU_VERL_VENV = REPO / ".venv-gpu-verl"  # make gpu-check: verl[vllm]==0.9.1 (CUDA torch, vLLM) in a venv of its own
DRY_VERL_VENV = REPO / ".venv-verl"  # make install-verl: CPU verl 0.9.1, enough to compose and validate
EXIT_SIGTERM = 128 + int(signal.SIGTERM)  # the driver's exit code when SIGTERM stopped it (hpo._cli.EXIT_SIGNAL)
# verl memory estimate: the expected estimate (what the pre-flight refuses by) must be near the measured peak; the
# worst case (every sequence at max_prompt_length + max_response_length, a warning only) must not be below it
EXPECTED_RATIO = (0.9, 1.5)
WORST_MIN_RATIO = 0.9


def verl_space_overrides(work: Path, model_dir: Path, verl_python: str, n_trials: int, steps: int = VERL_STEPS,
                         save_freq: int = 1, n_jobs: int = 1) -> list[str]:
    """``--override`` texts shrinking the shipped verl space to minutes on one GPU: ``steps`` steps per trial with
    validation (the objective) at the last, a checkpoint every ``save_freq`` steps (-1: none), ``n_jobs`` trials at
    once on one GPU each, short responses, vLLM eager (no CUDA-graph capture), one mini-batch choice, the local
    model and the data in the work directory (:func:`write_verl_data`)."""
    return [f"trial.python={verl_python}", "trial.timeout_s=480", f"study.n_trials={n_trials}",
            f"trial.n_jobs={n_jobs}", "trial.gpus_per_trial=1", "params.mini_batch.choices=[16]",
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={work / 'gsm8k' / 'train.parquet'}", f"data.val_files={work / 'gsm8k' / 'test.parquet'}",
            "data.max_response_length=128", f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
            "trainer.val_before_train=false", f"trainer.save_freq={save_freq}",
            "actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]


def verl_pair_overrides(work: Path, model_dir: Path, verl_python: str) -> list[str]:
    """Two trials of :data:`PAIR_STEPS` steps at once (``trial.n_jobs=2``), one GPU each, no checkpoint."""
    return verl_space_overrides(work, model_dir, verl_python, 2, PAIR_STEPS, -1, n_jobs=2)


def verl_search_argv(work: Path, overrides: list[str], study: str = VERL_STUDY) -> list[str]:
    return [sys.executable, "-m", "hpo", "search", "--space", VERL_SPACE, "--study", study,
            "--studies-dir", str(work / "studies"), *(a for o in overrides for a in ("--override", o))]


def write_verl_data(work: Path) -> None:
    """The GSM8K-format parquet files the overrides name (the driver's prepare step writes only the shipped set)."""
    from hpo.backends.verl._data import write_parquet

    for name, split in (("train.parquet", "train"), ("test.parquet", "test")):
        if not (work / "gsm8k" / name).is_file():
            write_parquet(work / "gsm8k" / name, split)


@dataclass(frozen=True)
class StudyRun:
    """One study of the verl stages: how its driver starts (``search``: ``python -m hpo search ...``, any space)
    and where the study lives (``<studies>/<study>.db``, trial directories under ``<studies>/<study>/trials``)."""

    search: list[str]
    studies: Path
    study: str
    env: dict[str, str]
    log: Path  # the drivers' stdout and stderr (a pipe would fill up and block them)

    @classmethod
    def of(cls, work: Path, overrides: list[str], study: str = VERL_STUDY,
           env: dict[str, str] | None = None) -> StudyRun:
        return cls(verl_search_argv(work, overrides, study), work / "studies", study,
                   env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}, work / f"{study}.log")

    @property
    def resume(self) -> list[str]:
        """``resume`` of the stored experiment: its overrides make it differ from the space file, and this check
        made it (``--trust-stored-experiment``)."""
        return [sys.executable, "-m", "hpo", "resume", "--study", self.study, "--studies-dir", str(self.studies),
                "--trust-stored-experiment"]

    def trial_dir(self, number: int) -> Path:
        return self.studies / self.study / "trials" / str(number)

    def trials(self) -> list[Any]:
        """The study's FrozenTrials ([] before the driver created it)."""
        db = self.studies / f"{self.study}.db"
        if not db.exists():
            return []
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return list(optuna.load_study(study_name=self.study, storage=f"sqlite:///{db}").trials)

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            return subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def last_line(self) -> str:
        return _last(self.log.read_text(errors="replace")) if self.log.is_file() else ""


def read_steps(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The ``{"step": N, "data": {...}}`` lines of a metrics file (an unreadable line is skipped)."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
            out.append((int(rec["step"]), dict(rec["data"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


@dataclass(frozen=True)
class TrialFacts:
    """One trial of a study as the checks judge it (:func:`trial_facts`)."""

    number: int
    state: str  # Optuna's: COMPLETE, FAIL, WAITING, ...
    value: float | None
    fail_reason: str  # the driver's (oom, crash, timeout, killed, ...; a COMPLETE trial with the worst value has one)
    lines: int  # metric lines this attempt logged
    objective: tuple[float, ...]  # the objective metric's logged values
    start: float  # epoch s: its command.json, written right before the trainer is spawned
    end: float  # start + the driver's wall_time_s of the trainer
    devices: str  # CUDA_VISIBLE_DEVICES the trial got
    params: dict[str, Any]
    retry_of: int | None
    first_step: int | None  # the first step this attempt logged
    allocated_gb: float  # verl's perf/max_memory_allocated_gb (NaN when not logged)
    metrics: str  # this attempt's metrics file

    @property
    def ok(self) -> bool:
        return (self.state == "COMPLETE" and not self.fail_reason and self.value is not None
                and math.isfinite(self.value) and self.lines > 0 and bool(self.objective))

    def problem(self) -> str:
        return (f"trial {self.number} {self.state}{f' ({self.fail_reason})' if self.fail_reason else ''}, value "
                f"{self.value}, {self.lines} metric lines, {len(self.objective)} objective values")


def trial_facts(run: StudyRun, metric: str) -> list[TrialFacts]:
    from hpo.backends.verl._launch import verl_metrics_path

    out = []
    for t in run.trials():
        tdir = run.trial_dir(t.number)
        metrics = verl_metrics_path(tdir, len(t.system_attrs.get("retry_history", [])))
        recs = read_steps(metrics)
        command = tdir / "command.json"
        try:
            devices = str(json.loads(command.read_text()).get("env", {}).get("CUDA_VISIBLE_DEVICES", ""))
            start = command.stat().st_mtime
        except (OSError, ValueError):
            devices, start = "", float("nan")
        wall = t.user_attrs.get("wall_time_s")
        end = start + float(wall) if isinstance(wall, (int, float)) else float("nan")
        allocated = [float(d["perf/max_memory_allocated_gb"]) for _, d in recs
                     if isinstance(d.get("perf/max_memory_allocated_gb"), (int, float))]
        out.append(TrialFacts(
            t.number, t.state.name, t.value if t.values is not None and len(t.values) == 1 else None,
            str(t.user_attrs.get("fail_reason") or ""), len(recs),
            tuple(float(d[metric]) for _, d in recs if isinstance(d.get(metric), (int, float))), start, end, devices,
            dict(t.params), t.system_attrs.get("failed_trial"), recs[0][0] if recs else None,
            max(allocated, default=float("nan")), str(metrics)))
    return out


def checkpoint_in(run: StudyRun) -> tuple[int, int] | None:
    """(trial, step) of the newest complete checkpoint of any trial of the study so far, else None."""
    from hpo.backends.verl._launch import checkpoint_step

    trials = run.studies / run.study / "trials"
    found = []
    for tdir in trials.iterdir() if trials.is_dir() else []:
        step = checkpoint_step(tdir / "checkpoints") if tdir.name.isdigit() else None
        if step is not None:
            found.append((step, int(tdir.name)))
    return None if not found else (max(found)[1], max(found)[0])


def _resumed_from(trial_dir: Path) -> int | None:
    """The step of the checkpoint the trial's command resumed from (``verl._launch.resumed_from``), else None."""
    from hpo.backends.verl._launch import resumed_from

    source = resumed_from(trial_dir)
    m = re.fullmatch(r"global_step_(\d+)", source.name) if source is not None else None
    return int(m.group(1)) if m else None


@dataclass
class Interrupted:
    """What happened around the SIGTERM and the resume (:func:`sigterm_and_resume`; judged by :func:`resume_row`)."""

    trial: int | None = None  # the trial whose checkpoint was waited for
    checkpoint_step: int | None = None  # its newest complete checkpoint when the SIGTERM was sent
    checkpoint_s: float = float("nan")  # search start -> that checkpoint
    exit_code: int | None = None  # the driver's, after the SIGTERM
    stop_s: float = float("nan")  # SIGTERM -> the driver gone
    queued: bool = False  # a WAITING retry of `trial` in the study after the SIGTERM
    ray_after_stop: list[str] = field(default_factory=list)
    resume_exit: int | None = None
    resume_s: float = float("nan")
    retry: int | None = None  # the retry's trial number
    resumed_from: int | None = None  # N of trainer.resume_from_path=.../global_step_N in the retry's command
    first_step: int | None = None  # the first step the retry logged
    loaded_log: bool = False  # the retry's log says verl loaded the checkpoint ("Resuming from ...")
    value: float | None = None  # the retry's objective value
    ray_left: list[str] = field(default_factory=list)
    error: str = ""
    trials: list[TrialFacts] = field(default_factory=list)


def sigterm_and_resume(run: StudyRun, metric: str, timeout_s: float = 900.0, poll_s: float = 0.2) -> Interrupted:
    """What a user does: start the search, SIGTERM the driver once a trial has written a complete checkpoint
    (``hpo.backends.verl._launch.checkpoint_step``; waited on, not timed), then ``resume`` the study."""
    out = Interrupted()
    started, t0 = time.time(), time.monotonic()
    driver = run.start(run.search)
    found = None
    while driver.poll() is None and time.monotonic() - t0 < timeout_s:
        found = checkpoint_in(run)
        if found is not None:
            break
        time.sleep(poll_s)
    if driver.poll() is not None:  # before any checkpoint, or the trial finished before the SIGTERM
        out.exit_code, out.error = driver.returncode, (
            f"the search exited {driver.returncode} before the SIGTERM "
            f"({'after' if found else 'without'} a checkpoint): {run.last_line()}")
        out.trials = trial_facts(run, metric)
        return out
    if found is None:
        out.error = f"no complete checkpoint after {timeout_s:.0f} s"
    else:
        out.trial, out.checkpoint_step = found
        out.checkpoint_s = time.monotonic() - t0
    t1 = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    try:
        out.exit_code = driver.wait(timeout=300)
    except subprocess.TimeoutExpired:
        driver.kill()
        out.exit_code, out.error = driver.wait(), "the driver did not exit within 300 s of the SIGTERM"
    out.stop_s = time.monotonic() - t1
    out.ray_after_stop = ray_processes(started)
    if out.error:
        return out
    out.queued = any(t.state.name == "WAITING" and t.system_attrs.get("failed_trial") == out.trial
                     for t in run.trials())
    t2 = time.monotonic()
    resume = run.start(run.resume)
    try:
        out.resume_exit = resume.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        resume.send_signal(signal.SIGTERM)
        out.resume_exit, out.error = resume.wait(timeout=300), f"resume ran over {timeout_s:.0f} s"
    out.resume_s = time.monotonic() - t2
    out.ray_left = ray_processes(started)
    out.trials = trial_facts(run, metric)
    retries = [f for f in out.trials if f.retry_of == out.trial]
    if retries:
        retry = retries[-1]
        tdir = run.trial_dir(retry.number)
        out.retry, out.first_step, out.value = retry.number, retry.first_step, retry.value
        out.resumed_from = _resumed_from(tdir)
        logs = "".join((tdir / n).read_text(errors="replace") for n in ("stdout.log", "stderr.log")
                       if (tdir / n).is_file())
        out.loaded_log = "Resuming from" in logs  # verl's _load_checkpoint: "Resuming from <dir>, setting global step"
    if out.resume_exit != 0 and not out.error:
        out.error = f"resume exit {out.resume_exit}: {run.last_line()}"
    return out


def resume_row(o: Interrupted) -> Check:
    """``ok`` when the driver exited 143 with the trial queued and no Ray process left, and the resumed retry
    continued after the checkpoint, completed and recorded the objective."""
    c = Check("verl SIGTERM + resume", seconds=sum(s for s in (o.checkpoint_s, o.stop_s, o.resume_s) if s == s))
    problems = [o.error] if o.error else []
    if o.exit_code != EXIT_SIGTERM and not o.error:
        problems.append(f"driver exit {o.exit_code} after SIGTERM (expected {EXIT_SIGTERM})")
    if o.trial is not None and not o.queued and not o.error:
        problems.append(f"trial {o.trial} not queued (no WAITING retry of it)")
    if o.ray_after_stop:
        problems.append(f"Ray processes left after the SIGTERM: {', '.join(o.ray_after_stop[:5])}")
    retry = next((f for f in o.trials if f.number == o.retry), None)
    if o.resume_exit is not None:
        if retry is None:
            problems.append(f"no retry of trial {o.trial} ran")
        elif not retry.ok:
            problems.append(retry.problem())
        if retry is not None and o.resumed_from is None:
            problems.append("the retry started afresh (no trainer.resume_from_path)")
        elif retry is not None and o.checkpoint_step is not None and (o.resumed_from or 0) < o.checkpoint_step:
            problems.append(f"the retry resumed from step {o.resumed_from}, before the checkpoint {o.checkpoint_step}")
        continued = o.first_step is not None and o.checkpoint_step is not None and o.first_step > o.checkpoint_step
        if retry is not None and not (continued or o.loaded_log):
            problems.append(f"the retry's first step {o.first_step} is not after the checkpoint's "
                            f"{o.checkpoint_step} and its log does not say it loaded one")
    if o.ray_left:
        problems.append(f"Ray processes left: {', '.join(o.ray_left[:5])}")
    parts = []
    if o.checkpoint_step is not None:
        parts.append(f"trial {o.trial} checkpoint at step {o.checkpoint_step} after {o.checkpoint_s:.0f} s")
    if o.exit_code is not None:
        parts.append(f"SIGTERM -> exit {o.exit_code} in {o.stop_s:.1f} s"
                     + (f", trial {o.trial} queued" if o.queued else ""))
    if o.resume_exit is not None:
        parts.append(f"resume exit {o.resume_exit} in {o.resume_s:.0f} s")
    if o.retry is not None:
        parts.append(f"retry {o.retry} resumed from step {o.resumed_from}, first step logged {o.first_step}"
                     + (" ('Resuming from' in its log)" if o.loaded_log else "") + f", value {o.value}")
    parts.append(f"Ray processes left: {len(o.ray_after_stop) + len(o.ray_left)}")
    c.status = "FAIL" if problems else "ok"
    c.detail = "; ".join(parts) + (f"; {'; '.join(problems)}" if problems else "")
    c.data = dataclasses.asdict(o)
    return c


def study_row(trials: list[TrialFacts], n_trials: int, metric: str, ray_left: list[str],
              interrupted: int | None = None) -> Check:
    """``ok`` when ``n_trials`` trials finished COMPLETE with the objective ``metric`` logged and a finite value
    (the worst value of a failed trial does not count), and no Ray process is left. The ``interrupted`` trial
    (FAIL, retried) is not judged here."""
    c = Check("verl study")
    judged = [f for f in trials if f.number != interrupted]
    problems = [f.problem() for f in judged if not f.ok]
    done = sum(f.ok for f in judged)
    if done < n_trials:
        problems.append(f"{done} of {n_trials} trials complete")
    if not any(f.objective for f in judged):
        problems.append(f"no {metric} recorded")
    if ray_left:
        problems.append(f"Ray processes left: {', '.join(ray_left[:5])}")
    c.status = "FAIL" if problems else "ok"
    c.detail = (f"{done} trial(s) complete, {sum(f.lines for f in trials)} metric lines, {metric} "
                f"{[round(f.objective[-1], 4) for f in judged if f.objective]}, Ray processes left: {len(ray_left)}"
                + (f"; {'; '.join(problems)}" if problems else ""))
    c.seconds = sum(f.end - f.start for f in trials if f.end == f.end and f.start == f.start)
    return c


def overlap_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which every interval ``(start, end)`` ran at once (negative: the gap; NaN: none given)."""
    if not intervals:
        return float("nan")
    return min(e for _, e in intervals) - max(s for s, _ in intervals)


@dataclass
class Pair:
    """Two trials at once (:func:`run_pair`; judged by :func:`pair_row`)."""

    exit_code: int | None = None
    seconds: float = float("nan")
    trials: list[TrialFacts] = field(default_factory=list)
    ray_left: list[str] = field(default_factory=list)
    error: str = ""


def run_pair(run: StudyRun, metric: str, timeout_s: float = 900.0) -> Pair:
    out = Pair()
    started, t0 = time.time(), time.monotonic()
    driver = run.start(run.search)
    try:
        out.exit_code = driver.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        driver.send_signal(signal.SIGTERM)
        out.exit_code, out.error = driver.wait(timeout=300), f"the search ran over {timeout_s:.0f} s"
    out.seconds = time.monotonic() - t0
    out.ray_left = ray_processes(started)
    out.trials = trial_facts(run, metric)
    if out.exit_code != 0 and not out.error:
        out.error = f"search exit {out.exit_code}: {run.last_line()}"
    return out


def pair_row(o: Pair) -> Check:
    """``ok`` when both trials completed with the objective, on different GPUs, and their wall-time intervals
    overlap (what catches trials that collide on one host: verl's ZMQ sockets under /tmp, Ray clusters, GPUs)."""
    c = Check("verl two trials at once", seconds=o.seconds if o.seconds == o.seconds else 0.0)
    problems = [o.error] if o.error else []
    problems += [f.problem() for f in o.trials if not f.ok]
    if len(o.trials) != 2:
        problems.append(f"{len(o.trials)} trials ran, not 2")
    both = o.trials[:2]
    overlap = overlap_s([(f.start, f.end) for f in both])
    if not overlap > 0:
        problems.append(f"the trials did not run at once (overlap {overlap:.1f} s)")
    if len({f.devices for f in both}) != len(both):
        problems.append(f"both trials got GPU(s) {both[0].devices!r}" if both else "no trial")
    if o.ray_left:
        problems.append(f"Ray processes left: {', '.join(o.ray_left[:5])}")
    c.status = "FAIL" if problems else "ok"
    shown = ", ".join(f"trial {f.number} on GPU {f.devices or '-'} {f.state} {f.end - f.start:.0f} s value {f.value}"
                      for f in both)
    c.detail = (f"{shown}; overlapping {overlap:.0f} s; Ray processes left: {len(o.ray_left)}"
                + (f"; {'; '.join(problems)}" if problems else ""))
    c.data = {"overlap_s": overlap, "trials": [dataclasses.asdict(f) for f in o.trials]}
    return c


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
    """Peak used memory of every GPU (NVML, all processes) every ``period`` s, above what each used at start."""

    def __init__(self, period: float = 0.2) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.start = [self._used(h) for h in self._handles]
        self.peak = list(self.start)
        self.total = [int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in self._handles]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _used(self, handle: Any) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self.peak = [max(p, self._used(h)) for p, h in zip(self.peak, self._handles, strict=True)]

    def stop(self) -> tuple[int, int]:
        """(the largest rise over the GPUs, the total memory of that GPU): one trial at a time, so its GPU's."""
        self._stop.set()
        self._thread.join()
        rise, i = max((p - s, i) for i, (p, s) in enumerate(zip(self.peak, self.start, strict=True)))
        return rise, self.total[i]


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


def verl_estimate(overrides: list[str], values: dict[str, Any], verl_python: str, gpu_total: int,
                  lengths: Any = None) -> Any:
    """``judge_verl`` (the estimate at the expected ``lengths`` and in the worst case) of the config a trial with
    ``values`` ran (composed by verl in ``verl_python``)."""
    from hpo.backends._preflight import verl_memory_inputs
    from hpo.experiment._space import load_space
    from verl_core.memory_verl import judge_verl

    space = load_space(VERL_SPACE, overrides, check=False)
    [(info, keys)] = verl_memory_inputs(space, [space.trainer_overrides(values)], 1, verl_python)
    return judge_verl(keys, use_critic=bool(info["use_critic"]), use_ref=bool(info["use_reference_policy"]),
                      lengths=lengths, gpu_total_bytes=gpu_total)


def study_lengths(trials: list[TrialFacts]) -> Any:
    """The largest mean prompt and response lengths the trials logged (``SequenceLengths``), else None."""
    from verl_core.config import ConfigError
    from verl_core.memory_verl import SequenceLengths, read_sequence_lengths

    found = []
    for f in trials:
        try:
            found.append(read_sequence_lengths(f.metrics))
        except ConfigError:
            continue
    if not found:
        return None
    prompts = [x.prompt for x in found if x.prompt is not None]
    responses = [x.response for x in found if x.response is not None]
    return SequenceLengths(max(prompts, default=None), max(responses, default=None), "largest means of the study")


@dataclass(frozen=True)
class MemoryFacts:
    """The verl estimate of a trial's config against what its GPU used (:func:`memory_row`)."""

    expected_gib: float  # judge_verl's estimate at the study's mean lengths
    worst_gib: float  # ... with every sequence at max_prompt_length + max_response_length
    measured_gib: float  # the GPU's peak used memory above its start (NVML, all processes)
    lengths: str  # where the expected lengths came from
    peak_phase: str
    actor_estimate_gib: float  # the estimate's actor allocator peak
    actor_allocated_gib: float  # verl's perf/max_memory_allocated_gb


def _ratio(a: float, b: float) -> float:
    return a / b if b == b and b > 0 else float("nan")


def memory_row(m: MemoryFacts) -> Check:
    """``ok`` when the expected estimate / measured is within :data:`EXPECTED_RATIO` and the worst case /
    measured is at least :data:`WORST_MIN_RATIO`."""
    c = Check("verl memory estimate")
    expected, worst = _ratio(m.expected_gib, m.measured_gib), _ratio(m.worst_gib, m.measured_gib)
    actor = _ratio(m.actor_estimate_gib, m.actor_allocated_gib)
    c.detail = (f"expected {m.expected_gib:.2f} GiB ({m.lengths}), worst case {m.worst_gib:.2f} GiB vs device peak "
                f"{m.measured_gib:.2f} GiB (NVML, all processes): ratios {expected:.2f} / {worst:.2f} (peak phase "
                f"{m.peak_phase}); actor allocator {m.actor_estimate_gib:.2f} GiB vs perf/max_memory_allocated_gb "
                f"{m.actor_allocated_gib:.2f}: ratio {actor:.2f}")
    ok = EXPECTED_RATIO[0] <= expected <= EXPECTED_RATIO[1] and worst >= WORST_MIN_RATIO
    c.status = "ok" if ok else "FAIL"
    if not ok:
        c.detail += (f"; want expected/measured in [{EXPECTED_RATIO[0]}, {EXPECTED_RATIO[1]}] and worst/measured "
                     f">= {WORST_MIN_RATIO}")
    c.data = {**dataclasses.asdict(m), "expected_ratio": expected, "worst_ratio": worst, "actor_ratio": actor}
    return c


def check_verl_dry(run: StudyRun, pair: StudyRun, overrides: list[str], pair_overrides: list[str],
                   verl_python: str) -> list[Check]:
    """The plumbing of the verl stages without a GPU: the plan (every command) printed, ``validate`` of the resumed
    study's space and overrides (every corner composed by real verl on the CPU, with its worst-case estimate), the
    pair's space loaded (its fields)."""
    from hpo.experiment._space import load_space

    shown, resume, pair_shown = (" ".join(a[1:]) for a in (run.search, run.resume, pair.search))
    plan = (f"would run: {shown}; SIGTERM once a trial has a complete checkpoint "
            f"(hpo.backends.verl._launch.checkpoint_step); then: {resume}")
    for name, text in (("verl study", f"would run: {shown}"), ("verl SIGTERM + resume", plan),
                       ("verl two trials at once", f"with 2+ GPUs would run: {pair_shown}")):
        print(f"[gpu-check] {name} {text}", file=sys.stderr, flush=True)
    c = Check("verl study")
    r = Check("verl SIGTERM + resume", "skipped", f"dry run: {plan}", data={"argv": [run.search, run.resume]})
    space = load_space(VERL_SPACE, pair_overrides, check=False)
    p = Check("verl two trials at once", "skipped",
              f"dry run: trial.n_jobs={space.trial.n_jobs}, trial.gpus_per_trial={space.trial.gpus_per_trial}; "
              f"with 2+ GPUs would run: {pair_shown}", data={"argv": pair.search})
    m = Check("verl memory estimate", "skipped",
              "needs the GPU run (dry run: validate prints the worst-case estimate of every corner)")
    if not Path(verl_python).exists():
        c.status, c.detail = "skipped", f"no {verl_python} (make install-verl); would run: {shown}"
        return [c, r, p, m]
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
        return [c, r, p, m]
    c.detail = (f"validate: {corners} corner(s) composed by verl 0.9.1, largest estimate {total[1]} GiB (peak phase "
                f"{total[2]}) on the assumed GPU; would run: {shown}")
    c.data = {"argv": run.search, "validate": out}
    return [c, r, p, m]


def check_verl(plan: Plan, work: Path, verl_python: str, n_trials: int) -> list[Check]:
    """Real verl on the GPU through the driver (module docstring, item 7): the study (SIGTERMed and resumed), the
    resume, two trials at once, the memory estimate; four rows."""
    from hpo.execution._devices import detect_devices
    from hpo.experiment._space import load_space

    model = _model_dir(plan, work)
    write_verl_data(work)
    overrides = verl_space_overrides(work, model, verl_python, n_trials)
    pair_overrides = verl_pair_overrides(work, model, verl_python)
    run, pair = StudyRun.of(work, overrides), StudyRun.of(work, pair_overrides, PAIR_STUDY)
    if plan.device != "cuda":
        return check_verl_dry(run, pair, overrides, pair_overrides, verl_python)
    names = ("verl study", "verl SIGTERM + resume", "verl two trials at once", "verl memory estimate")
    if not Path(verl_python).exists():
        return [Check(n, "skipped", f"no {verl_python}: make gpu-check builds it (verl[vllm]==0.9.1)") for n in names]
    metric = load_space(VERL_SPACE, overrides, check=False).objective.primary_metric
    peak = _PeakGpuMemory()
    try:
        o = sigterm_and_resume(run, metric)
    except Exception as err:  # the rows below still run
        o = Interrupted(error=_failed("", err).detail)
    device_peak, gpu_total = peak.stop()
    study = study_row(o.trials, n_trials, metric, o.ray_left, o.trial)
    resume = resume_row(o)
    m = _guarded("verl memory estimate",
                 lambda: verl_memory_row(o.trials, overrides, verl_python, device_peak, gpu_total))
    gpus = detect_devices()
    if len(gpus) < 2:
        p = Check("verl two trials at once", "skipped",
                  f"one GPU ({len(gpus)} visible): trial.n_jobs=2 with trial.gpus_per_trial=1 needs two")
    else:
        p = _guarded("verl two trials at once", lambda: pair_row(run_pair(pair, metric)))
    return [study, resume, p, m]


def verl_memory_row(trials: list[TrialFacts], overrides: list[str], verl_python: str, device_peak: int,
                    gpu_total: int) -> Check:
    """:func:`memory_row` of the first completed trial's config, at the study's logged lengths."""
    done = [f for f in trials if f.ok]
    if not done:
        return Check("verl memory estimate", "FAIL", "no trial completed")
    lengths = study_lengths(trials)
    v = verl_estimate(overrides, done[0].params, verl_python, gpu_total, lengths)
    print(v.expected.render(gpu_total, "the trial's GPU total"), file=sys.stderr, flush=True)
    return memory_row(MemoryFacts(
        v.expected.total / 2**30, v.worst.total / 2**30, device_peak / 2**30,
        lengths.describe() if lengths is not None else "no lengths logged: worst case", v.expected.peak_phase,
        v.expected.allocated_peak("actor") / 2**30, max((f.allocated_gb for f in done), default=float("nan"))))


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


def _failed(name: str, err: Exception) -> Check:
    return Check(name, "FAIL", f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err) else ''}")


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    """``fn()``, or a FAIL row ``name`` naming the exception: one failing check must not hide the others."""
    try:
        return fn()
    except Exception as err:
        return _failed(name, err)


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

    def show(c: Check) -> Check:
        checks.append(c)
        print(f"[gpu-check] {c.name}: {c.status} {c.detail}", file=sys.stderr, flush=True)
        return c

    def guarded(name: str, fn: Callable[[], Check]) -> Check:
        return show(_guarded(name, fn))

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
            try:
                rows = check_verl(plan, work, verl_python, args.verl_trials)
            except Exception as err:  # each stage is guarded inside; this is the set-up (model, data, spaces)
                rows = [_failed("verl study", err)]
            for c in rows:
                show(c)
    print(render(checks, plan, args.dry_run))
    if args.json is not None:
        args.json.write_text(json.dumps([{"name": c.name, "status": c.status, "detail": c.detail,
                                          "seconds": c.seconds} for c in checks], indent=1) + "\n")
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
