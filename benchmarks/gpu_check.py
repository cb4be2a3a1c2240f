"""GPU readiness check, one script and one table (``make gpu-check``; about 10-12 minutes on one GPU, 4-5 of them real
verl, 2-3 the throughput part, 2-3 more with two GPUs; ``--skip-verl`` leaves verl out, ``--only`` picks parts).

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
7. REAL verl 0.9.1 through the driver (``benchmarks/gpu_check_verl.py``, judged in ``gpu_check_rows.py``), as a
   user runs it: ``python -m hpo search --space verl_grpo_gsm8k`` with SmolLM2-135M-Instruct (its local
   directory), a small GSM8K-format parquet in the work directory, short responses, vLLM eager
   (:func:`verl_space_overrides`); verl runs in ``--verl-python`` (``make gpu-check`` builds ``.venv-gpu-verl``
   with ``verl[vllm]==0.9.1``). Four rows:

   * ``verl study`` and ``verl SIGTERM + resume`` (one study, ~4-5 min: two verl start-ups of ~1.5 min, Ray,
     vLLM and FSDP, 4 steps, the driver's config checks): ``--verl-trials`` trials of :data:`VERL_STEPS` steps,
     a checkpoint after every step (``trainer.save_freq=1``), validation (the objective) at the last. The driver
     gets SIGTERM once a trial has a complete checkpoint (waited on: ``hpo.backends.verl.checkpoint_step`` of its
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
   * ``verl memory estimate`` (~15 s): ``hpo.backends.verl._memory_model.judge_verl`` of a completed trial's composed
     config, at the expected lengths (the largest ``prompt_length/mean`` / ``response_length/mean`` the study
     logged) and in the worst case (every sequence at its maximum), vs the GPU's peak used memory during the study
     (NVML every 0.2 s, all processes, above what was used before); ok when expected / measured is within
     :data:`EXPECTED_RATIO` (the pre-flight refuses by the expected estimate) and worst / measured is at least
     :data:`WORST_MIN_RATIO`; also verl's ``perf/max_memory_allocated_gb`` vs the estimate's actor allocator peak.

   Dry run: nothing runs on a GPU: the plan (every command: search, SIGTERM point, resume, the pair's search) is
   printed, ``python -m hpo validate`` of the study's space and overrides composes every corner with real verl
   (``.venv-verl``, CPU) and prints its estimate (row ``verl study``; skipped without ``.venv-verl``), the pair's
   space is loaded; the other verl rows are ``skipped`` with their plan.

8. throughput through the driver (``benchmarks/gpu_check_speed.py``, ~2-3 min on one GPU, estimated: not measured
   yet; dry run ~4 min on 2 cores at a load of 7-9): verl_core's SmolLM2 task in bf16 (dry: tiny_arith), a ``study.kind:
   throughput`` experiment file written to the work directory: its one trial the pick (actor micro-batch 32,
   gradient checkpointing off), ``study.baseline`` a deliberately poor config (micro-batch 2, checkpointing on);
   ``python -m hpo search`` then ``python -m hpo confirm``, which re-measures both interleaved on 2 seeds (poor,
   control, pick, pick, poor) and checks the first update is the same. Rows ``throughput ratio`` (the paired ratio,
   at least :data:`~benchmarks.gpu_check_speed.MIN_SPEEDUP`, same math) and ``speed health`` (the poor runs'
   ``gpu_underused`` / ``generation_bound`` labels against the utilisation and generation share they logged);
   both ``skipped`` without optuna (an interpreter without the driver's packages, ``GPU_PYTHON``).

``--only PART ...`` runs some parts: ``trainer`` (rows 2-5), ``reward`` (6), ``verl`` (7), ``throughput`` (8); the
``device`` row always runs. Exit code 0 when no check failed (skipped ones do not fail). ``--json PATH`` also
writes the rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_check_rows import (  # noqa: E402
    EXPECTED_RATIO,
    WORST_MIN_RATIO,
    Check,
    Interrupted,
    MemoryFacts,
    Pair,
    Plan,
    TrialFacts,
    failed_check,
    guarded_check,
    last_line_of,
    memory_row,
    overlap_s,
    pair_row,
    resume_row,
    study_row,
)
from benchmarks.gpu_check_speed import check_throughput  # noqa: E402
from benchmarks.gpu_check_verl import (  # noqa: E402
    DRY_VERL_VENV,
    GPU_VERL_VENV,
    PAIR_STUDY,
    StudyRun,
    _model_dir,
    _resumed_from,
    check_verl,
    checkpoint_in,
    ray_processes,
    run_pair,
    sigterm_and_resume,
    verl_memory_row,
    verl_pair_overrides,
    verl_space_overrides,
    write_verl_data,
)
from benchmarks.memory_estimate import peak_rss_of  # noqa: E402

# the verl stages' names, re-exported for ``from benchmarks import gpu_check as g``
__all__ = ["EXPECTED_RATIO", "PAIR_STUDY", "WORST_MIN_RATIO", "Check", "Interrupted", "MemoryFacts", "Pair", "Plan",
           "StudyRun", "TrialFacts", "_model_dir", "_resumed_from", "check_verl", "checkpoint_in", "main",
           "memory_row", "overlap_s", "pair_row", "ray_processes", "render", "resume_row", "run_pair",
           "sigterm_and_resume", "study_row", "verl_memory_row", "verl_pair_overrides", "verl_space_overrides",
           "write_verl_data"]

PARTS = ("trainer", "reward", "verl", "throughput")  # --only
THROUGHPUT_ROWS = ("throughput ratio", "speed health")

COMMON = ["trainer.val_before_train=false", "trainer.test_freq=0", "trainer.logger=file",
          "evaluation.latency.enable=false", "evaluation.toxicity.enable=false",
          "actor_rollout_ref.model.enable_gradient_checkpointing=true"]


REAL = Plan("smollm2_addition", ("data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
                                 "data.max_response_length=64"), "cuda", 4,
            ("actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.enforce_eager=true"))
DRY = Plan("tiny_arith", ("data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                          "actor_rollout_ref.actor.ppo_epochs=1"),
           "cpu", 3, ("actor_rollout_ref.rollout.cpu_kvcache_space_gb=0.25",))


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
        c.status, c.detail = "FAIL", f"exit {run.rc}: {last_line_of(run.stderr)}"
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
        c.status, c.detail = "FAIL", f"exit {run.rc}: {last_line_of(run.stderr)}"
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
        c.detail = f"exit {run.rc}, steps logged {sorted(run.steps)}: {last_line_of(run.stderr)}"
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
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), metavar="PART",
                   help=f"run only these parts ({', '.join(PARTS)}); the device row always runs")
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
        return show(guarded_check(name, fn))

    dev = guarded("device", lambda: check_device(plan))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        if dev.status == "ok" and "trainer" in args.only:
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
        if "reward" in args.only:
            guarded("4-bit reward model", lambda: check_reward_4bit(plan))
        if not args.skip_verl and "verl" in args.only:
            verl_python = args.verl_python or str((DRY_VERL_VENV if args.dry_run else GPU_VERL_VENV) / "bin" / "python")
            try:
                rows = check_verl(plan, work, verl_python, args.verl_trials)
            except Exception as err:  # each stage is guarded inside; this is the set-up (model, data, spaces)
                rows = [failed_check("verl study", err)]
            for c in rows:
                show(c)
        if "throughput" in args.only:
            if dev.status != "ok":
                rows = [Check(n, "skipped", "no usable device (row device)") for n in THROUGHPUT_ROWS]
            elif importlib.util.find_spec("optuna") is None:
                rows = [Check(n, "skipped", "optuna not installed: the driver's packages (pip install -e ., or "
                                            "carry the wheels: docs/benchmarks.md)") for n in THROUGHPUT_ROWS]
            else:
                try:
                    rows = check_throughput(plan, work)
                except Exception as err:  # the set-up or reading the study; the runs themselves are judged
                    rows = [failed_check(n, err) for n in THROUGHPUT_ROWS]
            for c in rows:
                show(c)
    print(render(checks, plan, args.dry_run))
    if args.json is not None:
        args.json.write_text(json.dumps([{"name": c.name, "status": c.status, "detail": c.detail,
                                          "seconds": c.seconds} for c in checks], indent=1) + "\n")
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
