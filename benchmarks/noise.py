"""Objective noise of the default study (``search_spaces/kl_lr.yaml``): how much the final objective of ONE fixed
configuration moves when only ``trainer.seed`` changes.

A search can only rank two settings whose objectives differ by more than this spread, so it is the resolution of
every HPO result on the default task. Measured on both sides of the task redesign:

* **before**: the old default (commit ``OLD_COMMIT``, run from a ``git worktree`` of this repository): 80 prompts
  SAMPLED at temperature 1, model ``tiny_arith_v1`` (cached separately from v2), the old kl_lr overrides;
* **after**: this checkout: greedy validation on 225 prompts, model ``tiny_arith_v2``, the current kl_lr overrides.

Each side runs its own ``kl_lr.yaml`` ``overrides:`` plus a good fixed value of each tuned parameter
(``BEFORE_PARAMS`` / ``AFTER_PARAMS``), once per seed, interleaved (before, after | after, before ...). The
objective is ``eval/reward_mean`` at the last evaluation (what a trial reports); "mean of last 3 evaluations" is
computed from the same runs. Cost rows: the trial's wall time and its summed validation time
(``timing_s/testing``). A failing worktree step skips the before rows with a logged note.

Run alone: ``python -m benchmarks.noise [--smoke]``; from ``benchmarks/run.py`` call :func:`bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import REPO, Row, interleave, log, main_python, make_row, run_measured, tail

GROUP = "objective noise"
OLD_COMMIT = "48ed3e6"  # the last commit with the old default task (sampled validation on 80 prompts)
# A good fixed value of each kl_lr parameter, by trainer key: the tiny_arith.yaml defaults of each side.
BEFORE_PARAMS = {"algorithm.kl_ctrl.kl_coef": 0.05, "actor_rollout_ref.actor.optim.lr": 2e-4}
AFTER_PARAMS = {"algorithm.kl_ctrl.kl_coef": 0.05, "actor_rollout_ref.actor.optim.lr": 1e-5}  # tiny_arith.yaml
SEEDS = (1, 2, 3, 4, 5)
SMOKE_SEEDS = (1, 2)
SMOKE_STEPS = ["trainer.total_training_steps=4", "trainer.test_freq=2"]  # evaluations at steps 0, 2, 4


@dataclass(frozen=True)
class Side:
    """One checkout of the repository and the fixed configuration its trials run."""

    label: str
    root: Path
    params: dict[str, float]

    def overrides(self) -> list[str]:
        """The ``overrides:`` of this checkout's ``search_spaces/kl_lr.yaml``, then the fixed parameters."""
        space = yaml.safe_load((self.root / "search_spaces" / "kl_lr.yaml").read_text())
        fixed = {k: v for k, v in space["overrides"].items() if k != "trainer.seed"}  # the seed is what varies
        return [f"{k}={v}" for k, v in fixed.items()] + [f"{k}={v}" for k, v in self.params.items()]


@dataclass
class Run:
    """One finished trial: its evaluation stream ``{step: eval/reward_mean}``, wall time and validation time."""

    seed: int
    curve: dict[int, float]
    wall_s: float
    eval_s: float

    @property
    def last(self) -> float:
        return self.curve[max(self.curve)]

    @property
    def last3(self) -> float:
        steps = sorted(self.curve)[-3:]
        return statistics.fmean(self.curve[s] for s in steps)


def run_trial(side: Side, seed: int, extra: list[str], work: Path) -> Run:
    """The trainer of ``side`` on ``seed``, as a trial runs it (own session, one torch thread)."""
    name = f"{side.label}_seed{seed}"
    metrics = work / f"{name}.jsonl"
    metrics.unlink(missing_ok=True)
    argv = [main_python(), "-m", "verl_core", "train", "--config", "tiny_arith", "--metrics-file", str(metrics),
            *side.overrides(), *extra, f"trainer.seed={seed}", "trainer.cpu_threads=1",
            f"trainer.default_local_dir={work / ('ckpt_' + name)}", "trainer.save_freq=-1"]
    m = run_measured(argv, env={"PYTHONPATH": str(side.root)}, cwd=side.root)
    if m.returncode != 0:
        raise RuntimeError(f"{side.label} trainer (seed {seed}) exited {m.returncode}:\n{tail(m.stderr)}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    curve = {r["step"]: r["data"]["eval/reward_mean"] for r in rows if "eval/reward_mean" in r["data"]}
    eval_s = sum(r["data"].get("timing_s/testing", 0.0) for r in rows)
    log(f"objective noise: {side.label} seed {seed}: {m.wall_s:.1f} s, eval {eval_s:.1f} s, "
        f"curve {', '.join(f'{s}:{v:.3f}' for s, v in sorted(curve.items()))}")
    return Run(seed, curve, m.wall_s, eval_s)


def old_worktree(dest: Path) -> Path | None:
    """A detached worktree of ``OLD_COMMIT`` at ``dest``, or None (logged) when git cannot make one."""
    try:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(dest), OLD_COMMIT],
                       check=True, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or err
        log(f"objective noise: no worktree of {OLD_COMMIT} ({str(detail).strip()}); skipping the before rows")
        return None
    return dest


def prepare(side: Side) -> None:
    """Build the side's model and data outside the measured runs."""
    out = subprocess.run([main_python(), "-m", "verl_core", "prepare", "--config", "tiny_arith"], cwd=side.root,
                         env={**os.environ, "PYTHONPATH": str(side.root)}, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{side.label}: verl_core prepare exited {out.returncode}:\n{tail(out.stderr)}")


def _spread(values: list[float]) -> dict[str, float]:
    return {"std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values),
            "mean": statistics.fmean(values)}


def noise_row(name: str, values: list[float], seeds: list[int], before: list[float] | None, what: str) -> Row:
    """Value = the std of ``values`` across seeds (lower is better); baseline = the before side's std."""
    s = _spread(values)
    note = (f"{what}; {len(values)} seeds {seeds}: mean {s['mean']:.3f}, min-max {s['min']:.3f}-{s['max']:.3f} "
            f"(range {s['max'] - s['min']:.3f})")
    base = [_spread(before)["std"]] if before else None
    if base:
        note += f"; baseline = the before std ({base[0]:.3f})"
    return make_row(name, "std", [s["std"]], base, higher_is_better=False, group=GROUP, note=note,
                    raw={"objectives": values, "seeds": seeds, **{k: round(v, 4) for k, v in s.items()}})


def bench(smoke: bool, workdir: Path | None = None) -> tuple[list[Row], dict[str, Any]]:
    seeds = list(SMOKE_SEEDS if smoke else SEEDS)
    extra = SMOKE_STEPS if smoke else []
    details: dict[str, Any] = {"old_commit": OLD_COMMIT, "seeds": seeds, "smoke": smoke}
    with tempfile.TemporaryDirectory(prefix="bench_noise_") as tmp:
        work = workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        after = Side("after", REPO, AFTER_PARAMS)
        sides = [after]
        tree = old_worktree(Path(tmp) / "old")
        if tree is not None:
            sides.insert(0, Side("before", tree, BEFORE_PARAMS))
        try:
            for side in list(sides):
                try:
                    prepare(side)
                except RuntimeError as err:
                    if side is after:
                        raise
                    log(f"objective noise: the old checkout cannot build its model ({err}); skipping the before rows")
                    sides.remove(side)
                    continue
                details[f"{side.label}_overrides"] = side.overrides()
            runs: dict[str, list[Run]] = {s.label: [] for s in sides}
            by_label = {s.label: s for s in sides}
            for rep, label in interleave(len(seeds), list(by_label)):
                runs[label].append(run_trial(by_label[label], seeds[rep], extra, work))
        finally:
            if tree is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    details["curves"] = {label: {r.seed: r.curve for r in rs} for label, rs in runs.items()}
    rows: list[Row] = []
    before = runs.get("before")
    b_last = [r.last for r in before] if before else None
    if before:
        rows.append(noise_row("objective noise before (old default: 80 prompts sampled at T=1, last evaluation)",
                              b_last or [], seeds, None, f"kl_lr fixed overrides of {OLD_COMMIT} + {BEFORE_PARAMS}"))
    a = runs["after"]
    rows.append(noise_row("objective noise after (225 prompts greedy, last evaluation)", [r.last for r in a], seeds,
                          b_last, f"kl_lr fixed overrides + {AFTER_PARAMS}"))
    rows.append(noise_row("objective noise after, mean of last 3 evaluations", [r.last3 for r in a], seeds,
                          b_last, "same runs as the row above"))
    b_wall = [r.wall_s for r in before] if before else None
    b_eval = [r.eval_s for r in before] if before else None
    rows.append(make_row("objective noise: trial wall time (after vs before)", "s", [r.wall_s for r in a], b_wall,
                         higher_is_better=False, group=GROUP,
                         note="whole trainer process, one torch thread; baseline = the before side"))
    rows.append(make_row("objective noise: validation time per trial (after vs before)", "s",
                         [r.eval_s for r in a], b_eval, higher_is_better=False, group=GROUP,
                         note="sum of timing_s/testing over the trial's evaluations; baseline = the before side"))
    return rows, details


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.noise", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help=f"seeds {SMOKE_SEEDS}, 4 steps")
    p.add_argument("--workdir", type=Path, default=None, help="keep the metrics files here")
    args = p.parse_args(argv)
    rows, details = bench(args.smoke, args.workdir)
    for r in rows:
        print(f"{r.name}: {r.ours:.4g} {r.unit}" + (f" (baseline {r.baseline:.4g}, ratio {r.ratio:.3g})"
                                                    if r.baseline is not None and r.ratio is not None else "")
              + f"  [{r.note}]")
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
