"""Items 2-4: the real driver (``python -m hpo search``) running the real trainer, small budgets.

2. Driver overhead: spawn -> first metrics line of a trial (``first_metric_s``) against the same
   trainer command launched by hand (what a user would do without the driver), its share of the
   trial's wall time, the driver's own launch time, and the driver process's peak RSS.
3. Pruning + early stopping + collapse stopping: the 3-parameter ``search_spaces/kl_lr_clip.yaml`` with TPE,
   once as shipped and once with all three off, over 3 sampler seeds: trial-seconds saved, best value kept.
4. Search efficiency: trials TPE (and GP) need to reach random search's median best-of-16, 3 sampler seeds.
5. Objective noise and rank consistency (``benchmarks/noise.py``): what the default study records, over 10 trainer
   seeds, under each candidate aggregate and plateau rule.

Studies live in a temporary directory; results are read back from the SQLite storage.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Row, interleave, log, main_python, make_row, run_measured, tail


def search(studies: Path, study: str, overrides: list[str], space: str = "kl_lr") -> dict[str, Any]:
    """Run one study to completion; return the driver's wall time, its own peak RSS, and its trials."""
    argv = [main_python(), "-m", "hpo", "search", "--space", space, "--study", study, "--studies-dir", str(studies)]
    for o in [*overrides, *_EXTRA]:
        argv += ["--override", o]
    m = run_measured(argv, env={"PYTHONPATH": str(REPO)}, cwd=str(REPO), rss_children=False)
    if m.returncode != 0:
        raise RuntimeError(f"verl-hpo search {study} failed (exit {m.returncode}):\n{tail(m.stderr)}")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = optuna.load_study(study_name=study, storage=f"sqlite:///{studies / (study + '.db')}")
    trials = []
    for t in s.trials:
        a = t.user_attrs
        trials.append({"number": t.number, "state": t.state.name, "value": t.value,
                       "wall_time_s": a.get("wall_time_s"), "first_metric_s": a.get("first_metric_s"),
                       "launch_overhead_s": a.get("launch_overhead_s"), "stop_reason": a.get("stop_reason"),
                       "fail_reason": a.get("fail_reason"), "last_step": a.get("last_step"),
                       "compute_saved_s": a.get("compute_saved_s"), "params": t.params,
                       "last_value": (t.intermediate_values[max(t.intermediate_values)]
                                      if t.intermediate_values else None)})
    return {"wall_s": m.wall_s, "driver_peak_rss_gb": m.peak_rss_gb, "trials": trials}


def best_value(trials: list[dict[str, Any]], upto: int | None = None) -> float | None:
    """Best final value among COMPLETE trials (pruned ones never count as best, as in Optuna)."""
    vals = [t["value"] for t in trials[:upto] if t["state"] == "COMPLETE" and t["value"] is not None
            and math.isfinite(t["value"])]
    return max(vals) if vals else None


def trial_seconds(trials: list[dict[str, Any]]) -> float:
    return float(sum(t["wall_time_s"] or 0.0 for t in trials))


def _direct_first_metric(overrides: list[str], work: Path) -> tuple[float, float]:
    """Launch the trainer by hand (no driver) and time spawn -> first metrics line, and the whole run."""
    import subprocess

    metrics = work / "direct.jsonl"
    metrics.unlink(missing_ok=True)
    argv = [main_python(), "-m", "verl_core", "train", "--config", "tiny_arith", "--metrics-file", str(metrics),
            *overrides, f"trainer.default_local_dir={work / 'ckpt'}", "trainer.resume_mode=disable"]
    t0 = time.monotonic()
    # own session, as the driver gives its trials (and a terminal gives a user's command): with the kernel's
    # autogroup scheduling a session is the unit of CPU fairness, so this matters on a shared machine
    proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and metrics.stat().st_size > 0:
            first = time.monotonic() - t0
        time.sleep(0.02)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"direct trainer run failed: {tail(proc.stderr.read() if proc.stderr else '')}")
    if first is None:
        first = wall
    return first, wall


def overhead(reps: int, steps: int, n_trials: int, workdir: Path) -> list[Row]:
    """Item 2. Interleaved: one study of ``n_trials`` sequential trials, then the same number of direct runs."""
    fixed = [f"trainer.total_training_steps={steps}", "trainer.test_freq=10", "trainer.val_before_train=true",
             "trainer.cpu_threads=1", "trainer.seed=1", "algorithm.gamma=1.0", "reward_model.temperature=1.0"]
    # no stop of any kind (pruner, plateau, collapse): every driver trial runs the steps a direct launch runs
    space_overrides = [f"study.n_trials={n_trials}", "trial.n_jobs=1", "study.pruner.type=none",
                       "early_stopping.enabled=false", "diagnosis.enabled=false",
                       f"trainer.total_training_steps={steps}"]
    driver_first, direct_first, shares, launch, rss, direct_wall, driver_wall = [], [], [], [], [], [], []
    for rep, side in interleave(reps, ["driver", "direct"]):
        log(f"driver overhead: rep {rep + 1}/{reps} {side}")
        if side == "driver":
            res = search(workdir / f"overhead{rep}", f"overhead{rep}", space_overrides)
            ts = [t for t in res["trials"] if t["first_metric_s"] is not None]
            driver_first.append(statistics.median(t["first_metric_s"] for t in ts))
            shares.append(statistics.median(100 * t["first_metric_s"] / t["wall_time_s"] for t in ts))
            launch.append(statistics.median(t["launch_overhead_s"] for t in ts if t["launch_overhead_s"] is not None))
            driver_wall.append(statistics.median(t["wall_time_s"] for t in ts))
            rss.append(res["driver_peak_rss_gb"])
        else:
            runs = [_direct_first_metric(fixed, workdir) for _ in range(n_trials)]
            direct_first.append(statistics.median(f for f, _ in runs))
            direct_wall.append(statistics.median(w for _, w in runs))
    g = "driver overhead"
    note = (f"kl_lr space, {n_trials} sequential trials x {steps} steps per repetition; baseline = the same trainer "
            "command launched by hand (median per repetition)")
    return [
        make_row("spawn -> first metric line (driver trial vs direct launch)", "s", driver_first, direct_first,
                 higher_is_better=False, group=g, note=note),
        make_row("first-metric latency, share of a trial's wall time", "%", shares, group=g,
                 note="trainer start-up (imports, model load, step-0 validation) dominates; no baseline"),
        make_row("trial wall time (driver trial vs direct launch)", "s", driver_wall, direct_wall,
                 higher_is_better=False, group=g, note=note),
        make_row("driver launch overhead (device free -> spawn)", "s", launch, group=g,
                 note="writing trial files and validating the config in the driver"),
        make_row("driver peak RSS during a study (driver process only)", "GB", rss, group=g),
    ]


SEARCH_SPACE = "kl_lr_clip"  # the 3-parameter space of the search-efficiency and pruning rows
OFF = ["study.pruner.type=none", "early_stopping.enabled=false", "diagnosis.enabled=false"]


REUSE: dict[str, Any] = {}  # study name -> an earlier run's result for it (run.py --reuse-studies): not re-run


def _studies(kind: str, seeds: list[int], n_trials: int, extra: list[str], workdir: Path, space: str,
             details: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """One study per sampler seed (``kind`` names it); returns each study's trials."""
    out = []
    for seed in seeds:
        name = f"{kind}_{seed}"
        if name in REUSE:
            log(f"{kind}: sampler seed {seed}: reusing the earlier run's study")
            details[name] = {**REUSE[name], "reused": True}
            out.append(REUSE[name]["trials"])
            continue
        log(f"{kind}: sampler seed {seed} ({n_trials} trials of {space})")
        res = search(workdir / name, name, [f"study.n_trials={n_trials}", f"study.sampler.seed={seed}", *extra], space)
        details[name] = res
        out.append(res["trials"])
    return out


def trials_to_reach(trials: list[dict[str, Any]], target: float, n_trials: int) -> int:
    """The first k such that the best COMPLETE value among trials 0..k-1 reaches ``target``; n_trials + 1 when
    the study never does."""
    for k in range(1, n_trials + 1):
        b = best_value(trials, k)
        if b is not None and b >= target - 1e-12:
            return k
    return n_trials + 1


def search_and_pruning(seeds: list[int], n_trials: int, workdir: Path, space: str = SEARCH_SPACE,
                       samplers: tuple[str, ...] = ("tpe",), pruning_rows: bool = True
                       ) -> tuple[list[Row], dict[str, Any]]:
    """Items 3-4 of issue 16, over ``seeds`` sampler seeds, all with the space's shipped settings (pruning, early
    stopping and collapse stopping on) unless said otherwise:

    * search efficiency: random search's median best-of-``n_trials`` is the target; how many trials TPE (and GP)
      need to reach it, per seed (``n_trials + 1`` = not reached), against random's own count;
    * pruning + early stopping + collapse stopping: the TPE studies above against the same studies with all
      three off: trial-seconds saved, and the best value each reached.
    """
    details: dict[str, Any] = {}
    random_runs = _studies("random", seeds, n_trials, ["study.sampler.type=random"], workdir, space, details)
    runs = {sampler: _studies(sampler, seeds, n_trials, [f"study.sampler.type={sampler}"], workdir, space, details)
            for sampler in samplers}
    bests = [best_value(t, n_trials) for t in random_runs]
    target = statistics.median(b for b in bests if b is not None)
    g = "search efficiency"
    note = (f"{space} space (3 parameters; pruning, early stopping and collapse stopping as shipped), {n_trials} "
            f"trials per study, sampler seeds {seeds}; target = random search's median best-of-{n_trials} "
            f"= {target:.4g}; {n_trials + 1} = not reached")
    rows = []
    base = [trials_to_reach(t, target, n_trials) for t in random_runs]
    for sampler, studies in runs.items():
        counts = [trials_to_reach(t, target, n_trials) for t in studies]
        per_seed = ", ".join(f"seed {s}: {c}" for s, c in zip(seeds, counts, strict=True))
        goal = "met" if all(c <= 10 for c in counts) else "NOT met"
        rows.append(make_row(f"trials to reach random's median best-of-{n_trials} ({sampler.upper()} vs random)",
                             "trials", counts, base, higher_is_better=False, group=g,
                             note=f"{note}; per seed {per_seed} (goal <= 10 on every seed: {goal})",
                             raw={"target": target, "random_best": bests,
                                  "curves": {s: [[best_value(t, k) for k in range(1, n_trials + 1)] for t in st]
                                             for s, st in (("random", random_runs), (sampler, studies))}}))
        rows.append(make_row(f"best value after {n_trials} trials ({sampler.upper()} vs random)", "reward",
                             [b or float("nan") for b in (best_value(t, n_trials) for t in studies)],
                             [b or float("nan") for b in bests], group=g, note=note))
    if not pruning_rows:
        return rows, details
    off = _studies("tpe_off", seeds, n_trials, ["study.sampler.type=tpe", *OFF], workdir, space, details)
    on = runs["tpe"]
    g = "pruning + early stopping + collapse stopping"
    note = (f"{space} space, TPE, {n_trials} trials per study, 2 in parallel, sampler seeds {seeds}; ours = median "
            "pruner (+ patience / warm-up as shipped), early stopping and collapse stopping on; baseline = all off")
    on_s, off_s = [trial_seconds(t) for t in on], [trial_seconds(t) for t in off]
    steps_on, steps_off = ([float(sum(int(x.get("last_step") or 0) for x in t)) for t in side] for side in (on, off))
    best_on = [best_value(t) or float("nan") for t in on]
    best_off = [best_value(t) or float("nan") for t in off]
    rows += [
        make_row("total trial-seconds (on vs off)", "trial-s", on_s, off_s, higher_is_better=False, group=g, note=note),
        make_row("compute saved by pruning + early stopping + collapse stopping", "%",
                 [100 * (1 - a / b) for a, b in zip(on_s, off_s)], group=g,
                 note="1 - trial-seconds(on) / trial-seconds(off), per seed; goal >= 40%"),
        make_row("trainer steps run (on vs off)", "steps", steps_on, steps_off, higher_is_better=False, group=g,
                 note="the sum of each trial's last step: what the trial-seconds rows measure, without the machine's "
                      "load (studies run at different times share the CPU with different neighbours)"),
        make_row("compute saved, in trainer steps", "%", [100 * (1 - a / b) for a, b in zip(steps_on, steps_off)],
                 group=g, note="1 - steps(on) / steps(off), per seed"),
        make_row("best value reached (on vs off)", "reward", best_on, best_off, group=g,
                 note="best COMPLETE trial per seed; goal: within 0.02 of off"),
        make_row("best value gap (off - on)", "reward", [b - a for a, b in zip(best_on, best_off)], group=g,
                 note="per seed; > 0 means the pruned study found less"),
    ]
    for side, studies in (("on", on), ("off", off)):
        stops = [t.get("stop_reason") for st in studies for t in st]
        rows[-1].raw[f"stop_reasons_{side}"] = {str(s or "ran to end"): stops.count(s) for s in set(stops)}
    return rows, details


def bench(smoke: bool, workdir: Path | None = None, parts: tuple[str, ...] = ("overhead", "pruning", "search", "noise")
          ) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_driver_") as tmp:
        work = workdir or Path(tmp)
        if "overhead" in parts:
            rows += overhead(reps=1 if smoke else 3, steps=2 if smoke else 10, n_trials=1 if smoke else 2,
                             workdir=work)
        if "search" in parts or "pruning" in parts:
            seeds = [0] if smoke else [0, 1, 2]
            n = 3 if smoke else 16
            space_over = ["trainer.total_training_steps=10"] if smoke else []
            r, d = _with_overrides(space_over, lambda: search_and_pruning(
                seeds, n, work, samplers=("tpe",) if smoke else ("tpe", "gp"), pruning_rows="pruning" in parts))
            rows += r
            details["search"] = d
        if "noise" in parts:
            from benchmarks import noise

            r, d = noise.bench(smoke, work / "noise")
            rows += r
            details["noise"] = d
    return rows, details


_EXTRA: list[str] = []


def _with_overrides(extra: list[str], fn: Any) -> Any:
    """Run ``fn`` with ``extra`` added to every study's overrides (smoke sizes)."""
    _EXTRA[:] = extra
    try:
        return fn()
    finally:
        _EXTRA[:] = []
