"""Population-based training against TPE and random search at equal total trainer steps on the default task.

Every method searches ``kl_coef`` in [0.01, 2] and ``actor_lr`` in [1e-7, 3e-3] (both log; ``kl_lr``'s ranges) for
a policy trained ``HORIZON`` steps (``trainer.test_freq`` = ``INTERVAL``), with pruning and early stopping off so
that each method spends exactly its budget of trainer steps:

* PBT: ``search_spaces/pbt_kl_lr.yaml``, ``POPULATION`` members x ``HORIZON`` steps in segments of ``INTERVAL``.
* TPE and random: ``search_spaces/kl_lr.yaml``, ``2 x POPULATION`` trials x ``HORIZON`` steps; their best after the
  first ``POPULATION`` trials is the equal-budget figure, after all of them twice PBT's budget.

The value of a method is the best final objective (greedy accuracy at step ``HORIZON``) of a trial (TPE, random)
or of a member that reached the last step (PBT); the trainer steps used are summed over the trials (segments)
from each one's first step to its last. Over ``SEEDS`` search seeds (sampler seed, PBT seed; the trainer seed stays
1), median and min-max. Goal (issue 24): PBT matches TPE's median best with at most 60% of its trainer steps, or
beats it at equal budget.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Row, log, main_python, make_row, run_measured, tail

HORIZON, INTERVAL, POPULATION = 20, 5, 4
SEEDS = (0, 1, 2)
COMMON = [f"trainer.total_training_steps={HORIZON}", f"trainer.test_freq={INTERVAL}", "early_stopping.enabled=false",
          "study.pruner.type=none", "trial.n_jobs=2", "trainer.cpu_threads=1"]


def _run(studies: Path, study: str, space: str, overrides: list[str]) -> list[Any]:
    argv = [main_python(), "-m", "hpo", "search", "--space", space, "--study", study, "--studies-dir", str(studies)]
    for o in [*COMMON, *overrides]:
        argv += ["--override", o]
    m = run_measured(argv, env={"PYTHONPATH": str(REPO)}, cwd=str(REPO), rss_children=False)
    if m.returncode != 0:
        raise RuntimeError(f"verl-hpo search {study} failed (exit {m.returncode}):\n{tail(m.stderr)}")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return list(optuna.load_study(study_name=study, storage=f"sqlite:///{studies / (study + '.db')}").trials)


def _steps(t: Any) -> int:
    return int(t.user_attrs.get("last_step") or 0) - int(t.system_attrs.get("pbt:start", 0))


def pbt_once(studies: Path, seed: int, population: int) -> dict[str, Any]:
    trials = _run(studies, f"pbt-{population}-{seed}", "search_spaces/pbt_kl_lr.yaml",
                  [f"study.pbt.population={population}", f"study.pbt.interval_steps={INTERVAL}",
                   f"study.pbt.burn_in_steps={INTERVAL}", f"study.pbt.seed={seed}"])
    finals = [t.values[0] for t in trials if t.state.name == "COMPLETE" and t.values
              and t.system_attrs.get("pbt:end") == HORIZON and t.user_attrs.get("last_step") == HORIZON]
    exploits = sum(t.system_attrs.get("pbt:action") == "exploit" for t in trials)
    rollbacks = sum(t.system_attrs.get("pbt:action") == "rollback" for t in trials)
    return {"best": max(finals) if finals else None, "steps": sum(_steps(t) for t in trials),
            "segments": len(trials), "exploits": exploits, "rollbacks": rollbacks}


def optuna_once(studies: Path, seed: int, sampler: str, n_trials: int) -> dict[str, Any]:
    trials = _run(studies, f"{sampler}-{seed}", "kl_lr",
                  [f"study.sampler.type={sampler}", f"study.sampler.seed={seed}", f"study.n_trials={n_trials}"])
    trials = [t for t in trials if t.user_attrs.get("stop_reason") != "surplus"]

    def best(upto: int) -> float | None:
        vals = [t.values[0] for t in trials[:upto] if t.state.name == "COMPLETE" and t.values]
        return max(vals) if vals else None

    return {"best_half": best(n_trials // 2), "best": best(n_trials),
            "steps_half": sum(_steps(t) for t in trials[: n_trials // 2]), "steps": sum(_steps(t) for t in trials)}


def bench(smoke: bool, workdir: Path | None = None) -> tuple[list[Row], dict[str, Any]]:
    seeds = SEEDS[:1] if smoke else SEEDS
    global HORIZON, INTERVAL, COMMON
    if smoke:  # the plumbing only: 2 members / 4 trials x 4 steps
        HORIZON, INTERVAL = 4, 2
        COMMON = [c.replace("=20", "=4").replace("test_freq=5", "test_freq=2") for c in COMMON]
    pop = 2 if smoke else POPULATION
    runs: dict[str, list[dict[str, Any]]] = {"pbt": [], "tpe": [], "random": []}
    with tempfile.TemporaryDirectory(prefix="bench-pbt-", dir=workdir) as tmp:
        for seed in seeds:
            for kind in ("pbt", "tpe", "random"):
                log(f"pbt bench: {kind} seed {seed}")
                res = pbt_once(Path(tmp), seed, pop) if kind == "pbt" else optuna_once(Path(tmp), seed, kind, 2 * pop)
                log(f"  {res}")
                runs[kind].append(res)
    g = "population-based training (default task)"

    def col(kind: str, key: str) -> list[float]:
        return [float(r[key]) for r in runs[kind] if r[key] is not None]

    budget = statistics.median(col("pbt", "steps")) if col("pbt", "steps") else 0
    note_eq = (f"{pop} members x {HORIZON} steps (segments of {INTERVAL}) vs the first {pop} trials x {HORIZON} steps; "
               f"search seeds {', '.join(map(str, seeds))}")
    rows = [
        make_row("best final objective at equal trainer steps: PBT vs TPE", "acc", col("pbt", "best"),
                 col("tpe", "best_half"), group=g, note=note_eq),
        make_row("best final objective at equal trainer steps: PBT vs random", "acc", col("pbt", "best"),
                 col("random", "best_half"), group=g, note=note_eq),
        make_row("best final objective: PBT vs TPE with twice the steps", "acc", col("pbt", "best"), col("tpe", "best"),
                 group=g, note=f"TPE: {2 * pop} trials x {HORIZON} steps; PBT uses "
                               f"{budget / max(statistics.median(col('tpe', 'steps')) or 1, 1):.0%} of its steps"),
        make_row("trainer steps used: PBT vs TPE (equal budget)", "steps", col("pbt", "steps"),
                 col("tpe", "steps_half"), higher_is_better=False, group=g,
                 note=f"PBT exploits per run {col('pbt', 'exploits')}, rollbacks {col('pbt', 'rollbacks')}"),
    ]
    return rows, {"runs": runs, "horizon": HORIZON, "interval": INTERVAL, "population": pop}


if __name__ == "__main__":
    import json
    import sys

    rows, details = bench("--smoke" in sys.argv)
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, indent=1, default=str))
