"""Items 2-4: the real driver (``python -m hpo search``) running the real trainer, small budgets.

2. Driver overhead: spawn -> first metrics line of a trial (``first_metric_s``) against the same
   trainer command launched by hand (what a user would do without the driver), its share of the
   trial's wall time, the driver's own launch time, and the driver process's peak RSS.
3. Pruning + early stopping: ``search_spaces/kl_lr.yaml`` with the same sampler seed, once as
   shipped (median pruner + reward-aware early stopping) and once with both off.
4. Search efficiency: TPE vs random sampling, best ``eval/reward_mean`` after N trials, several seeds.

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
    for o in overrides:
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
    space_overrides = [f"study.n_trials={n_trials}", "trial.n_jobs=1", "study.pruner.type=none",
                       "early_stopping.enabled=false", f"trainer.total_training_steps={steps}"]
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


def pruning(seeds: list[int], n_trials: int, steps: int, workdir: Path) -> tuple[list[Row], dict[str, Any]]:
    """Item 3: same space and sampler seed, with vs without pruning + early stopping."""
    base = [f"study.n_trials={n_trials}", f"trainer.total_training_steps={steps}"]
    off = ["study.pruner.type=none", "early_stopping.enabled=false"]
    with_s, without_s, best_with, best_without, wall_with, wall_without = [], [], [], [], [], []
    details: dict[str, Any] = {}
    order = [(i, side) for i, seed in enumerate(seeds) for side in (["on", "off"] if i % 2 == 0 else ["off", "on"])]
    for i, side in order:
        seed = seeds[i]
        log(f"pruning: seed {seed} {side}")
        ov = [*base, f"study.sampler.seed={seed}", *(off if side == "off" else [])]
        res = search(workdir / f"prune_{side}_{seed}", f"prune_{side}_{seed}", ov)
        details[f"{side}_seed{seed}"] = res
        secs, best = trial_seconds(res["trials"]), best_value(res["trials"])
        if side == "on":
            with_s.append(secs)
            best_with.append(best if best is not None else float("nan"))
            wall_with.append(res["wall_s"])
        else:
            without_s.append(secs)
            best_without.append(best if best is not None else float("nan"))
            wall_without.append(res["wall_s"])
    savings = [100 * (1 - w / wo) for w, wo in zip(with_s, without_s)]
    g = "pruning + early stopping"
    note = (f"kl_lr space, {n_trials} trials x {steps} steps, 2 trials in parallel, sampler seeds {seeds}; "
            "ours = median pruner + early stopping on, baseline = both off")
    rows = [
        make_row("total trial-seconds (on vs off)", "trial-s", with_s, without_s, higher_is_better=False, group=g,
                 note=note),
        make_row("compute saved by pruning + early stopping", "%", savings, group=g,
                 note="1 - trial-seconds(on) / trial-seconds(off), per seed"),
        make_row("study wall time (on vs off)", "s", wall_with, wall_without, higher_is_better=False, group=g),
        make_row("best eval/reward_mean reached (on vs off)", "reward", best_with, best_without, group=g,
                 note="best COMPLETE trial; ratio < 1 means pruning lost the best setting"),
    ]
    for side in ("on", "off"):
        stops = [t.get("stop_reason") for k, r in details.items() if k.startswith(side) for t in r["trials"]]
        rows[-1].raw[f"stop_reasons_{side}"] = {s or "ran to end": stops.count(s) for s in set(stops)}
    return rows, details


def search_efficiency(seeds: list[int], n_trials: int, steps: int, workdir: Path) -> tuple[list[Row], dict[str, Any]]:
    """Item 4: TPE vs random, best value after N trials, per seed (shipped kl_lr settings otherwise)."""
    base = [f"study.n_trials={n_trials}", f"trainer.total_training_steps={steps}"]
    best: dict[str, list[float]] = {"tpe": [], "random": []}
    curves: dict[str, list[list[float | None]]] = {"tpe": [], "random": []}
    details: dict[str, Any] = {}
    for i, seed in enumerate(seeds):
        for sampler in (["tpe", "random"] if i % 2 == 0 else ["random", "tpe"]):
            log(f"search efficiency: seed {seed} {sampler}")
            ov = [*base, f"study.sampler.seed={seed}", f"study.sampler.type={sampler}"]
            res = search(workdir / f"se_{sampler}_{seed}", f"se_{sampler}_{seed}", ov)
            details[f"{sampler}_seed{seed}"] = res
            b = best_value(res["trials"])
            best[sampler].append(b if b is not None else float("nan"))
            curves[sampler].append([best_value(res["trials"], k) for k in range(1, n_trials + 1)])
    g = "search efficiency"
    note = (f"kl_lr space (median pruner + early stopping as shipped), {n_trials} trials x {steps} steps, "
            f"sampler seeds {seeds}; TPE with 4 random start-up trials")
    row = make_row(f"best eval/reward_mean after {n_trials} trials (TPE vs random)", "reward", best["tpe"],
                   best["random"], group=g, note=note, raw={"best_so_far_curves": curves})
    return [row], details


def bench(smoke: bool, workdir: Path | None = None, parts: tuple[str, ...] = ("overhead", "pruning", "search")
          ) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_driver_") as tmp:
        work = workdir or Path(tmp)
        if "overhead" in parts:
            rows += overhead(reps=1 if smoke else 3, steps=2 if smoke else 10, n_trials=1 if smoke else 2,
                             workdir=work)
        if "pruning" in parts:
            r, d = pruning(seeds=[0] if smoke else [0, 1], n_trials=4 if smoke else 10, steps=20 if smoke else 60,
                           workdir=work)
            rows += r
            details["pruning"] = d
        if "search" in parts:
            r, d = search_efficiency(seeds=[0] if smoke else [0, 1, 2], n_trials=4 if smoke else 8,
                                     steps=10 if smoke else 30, workdir=work)
            rows += r
            details["search"] = d
    return rows, details
