"""Calibration of ``verl_core.memory.estimate``: the estimate against the measured peak of real training runs.

    python -m benchmarks.memory_estimate [--smoke] [--only tiny smollm2] [--out DIR]

Each case runs ``python -m verl_core train`` in a child process for ``STEPS`` steps without validation and
takes the child's peak resident memory from the kernel (``ru_maxrss`` of ``os.wait4``: VmHWM, which keeps the
peak after memory is freed). The pretrained cases split each step into two mini-batches, so the second
optimizer step runs with the AdamW states of the first already allocated: the steady-state peak within one step.
Rows: ``memory estimate: <case>``, ours = estimate (GiB), baseline = measured (GiB), ratio = estimate /
measured (1.0 is exact; the goal is 0.8-1.2). GPU: ``benchmarks/gpu_check.py`` compares with
``torch.cuda.max_memory_allocated``.

Run alone it merges its rows into ``benchmarks/results.json`` and re-renders ``RESULTS.md`` (rows of an
earlier calibration are replaced; the other parts' rows are kept); ``python -m benchmarks.run --only memory``
runs it as a part. ``--smoke``: the tiny-model cases only, results under ``benchmarks/smoke/``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Row, log, main_python, make_row
from benchmarks._results import merge_into

GROUP = "memory estimate (CPU, peak RSS)"
STEPS = 2
# every case: no validation, no checkpoint, no latency evaluator (they are not what is calibrated here)
COMMON = ["trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=-1", "trainer.logger=file",
          "evaluation.latency.enable=false", "trainer.resume_mode=disable"]
# pretrained cases: 4 prompts x 4 samples, two mini-batches per step (see the module docstring)
SMOL = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    overrides: tuple[str, ...]
    steps: int = STEPS
    model: str = "tiny"  # "tiny" or "smollm2"


CASES: tuple[Case, ...] = (
    Case("tiny_arith", "tiny_arith", ()),
    Case("tiny_arith batch 256 micro 64", "tiny_arith",
         ("data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=128",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64")),
    Case("tiny_arith response 64", "tiny_arith", ("data.max_response_length=64",)),
    Case("smollm2_addition micro 8", "smollm2_addition",
         (*SMOL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"), 1, "smollm2"),
    Case("smollm2_addition micro 2", "smollm2_addition",
         (*SMOL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"), 1, "smollm2"),
    Case("smollm2_addition micro 8 response 32", "smollm2_addition",
         (*SMOL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.max_response_length=32"), 1,
         "smollm2"),
    Case("smollm2 PPO (critic + reference) micro 4", "smollm2_addition",
         (*SMOL, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=gae",
          "algorithm.use_kl_in_reward=true", "critic.optim.lr=1e-5"), 1, "smollm2"),
)


def argv_of(case: Case, metrics: Path) -> list[str]:
    return [main_python(), "-m", "verl_core", "train", "--config", case.config, "--metrics-file", str(metrics),
            *COMMON, f"trainer.total_training_steps={case.steps}", *case.overrides]


def peak_rss_of(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, float, str]:
    """Run ``argv``; return (exit code, peak RSS in GiB from the kernel's ru_maxrss of that child, stderr tail)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
        deadline = time.time() + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = "\n".join(err.read().strip().splitlines()[-5:])
    return proc.returncode, usage.ru_maxrss * 1024 / 2**30, tail  # ru_maxrss is in KiB on Linux


def estimate_gib(case: Case) -> tuple[float, dict[str, Any]]:
    from verl_core.config import load_config
    from verl_core.memory import estimate

    cfg = load_config(case.config, [*COMMON, f"trainer.total_training_steps={case.steps}", *case.overrides])
    est = estimate(cfg, device="cpu")
    return est.total / 2**30, est.as_dict()


def bench(smoke: bool = False, only: tuple[str, ...] = ("tiny", "smollm2")) -> tuple[list[Row], dict[str, Any]]:
    """One measurement per case (memory is deterministic enough: repeated tiny runs differ by < 1%)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    cases = [c for c in CASES if c.model in only and (not smoke or c.model == "tiny")]
    if any(c.model == "smollm2" for c in cases):  # build the model outside the measured runs
        subprocess.run([main_python(), "-m", "verl_core", "prepare", "--model", "smollm2"], cwd=REPO, env=env,
                       check=True, stdout=subprocess.DEVNULL)
    rows: list[Row] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mem-est-") as tmp:
        for case in cases:
            est, parts = estimate_gib(case)
            t0 = time.time()
            rc, peak, tail = peak_rss_of(argv_of(case, Path(tmp) / f"{len(rows)}.jsonl"), env, 1800)
            wall = time.time() - t0
            if rc != 0:
                raise RuntimeError(f"{case.name}: trainer exited {rc}: {tail}")
            log(f"memory estimate: {case.name}: estimate {est:.2f} GiB, measured peak RSS {peak:.2f} GiB "
                f"(ratio {est / peak:.2f}, {wall:.0f} s)")
            cmd = shlex.join(argv_of(case, Path("m.jsonl"))[1:])
            rows.append(make_row(f"memory estimate: {case.name}", "GiB", [est], [peak], group=GROUP,
                                 note=f"ratio = estimate / measured peak RSS; {case.steps} step(s)",
                                 raw={"command": cmd, "wall_s": wall}))
            details[case.name] = {"estimate": parts, "measured_gib": peak, "wall_s": wall, "command": cmd}
    return rows, details


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_estimate", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny-model cases only, results under benchmarks/smoke/")
    p.add_argument("--only", nargs="+", choices=("tiny", "smollm2"), default=("tiny", "smollm2"))
    p.add_argument("--out", type=Path, default=None, help="output directory (default benchmarks/ or benchmarks/smoke/)")
    args = p.parse_args(argv)
    out_dir = args.out or (REPO / "benchmarks" / ("smoke" if args.smoke else ""))
    t0 = time.time()
    rows, details = bench(args.smoke, tuple(args.only))
    command = "python -m benchmarks.memory_estimate " + shlex.join(argv if argv is not None else sys.argv[1:])
    merge_into(out_dir, rows, details, command.strip(), args.smoke)
    log(f"wrote {len(rows)} memory-estimate rows into {out_dir / 'results.json'} ({(time.time() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
