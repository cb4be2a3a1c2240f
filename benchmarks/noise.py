"""Objective noise and rank consistency of what the default study (``search_spaces/kl_lr.yaml``) records.

A study does not record "the final reward": it records its objective's **aggregate** (``last``, ``best``,
``mean_last_k``) over the evaluations a trial ran before **its own stopping rules** (``early_stopping``: the
plateau rule and the spread rule; the diagnosis) ended it. This benchmark measures that recorded value's noise over
trainer seeds, and how consistently it ranks settings, for each candidate default:

1. ``SETTINGS`` (kl_coef, lr) of the kl_lr space, each trained for the full budget (60 steps, evaluations every 10)
   on every seed of ``SEEDS`` (10 trainer seeds), with the held-out test split evaluated at the last step;
2. each run's metric lines are replayed through the driver's own :class:`hpo.study._watch.Watch` (the real
   aggregate, plateau rule, spread rule and diagnosis of kl_lr.yaml with one ``RULES`` override set): the value a
   trial would have recorded and the step it would have stopped at (a stopped run's lines are a prefix of the full
   run's: the trainer is deterministic for a seed);
3. per rule: the seed std of the recorded value (pooled over settings, and per setting), the rank consistency
   (Spearman rank correlation of the settings' ranking by mean over seed set A vs seed set B, and the mean over
   all seed pairs of the single-seed rankings, which is what a one-seed search sees), how well the single-seed
   ranking predicts the held-out test ranking, and the evaluations a trial runs (cost);
4. the default to ship (:func:`choose`): the issue's measure is rank consistency between two seed sets (the
   settings ranked by their mean over 5 seeds against their ranking over the other 5), taken here over all 126
   ways to split the 10 seeds in halves rather than over one split (one split of 6 settings moves in steps of
   0.057, a single adjacent swap); a ranking that is consistent across seeds but disagrees with the held-out test
   ranking is consistently wrong, so only rules whose mean single-seed agreement with the held-out test ranking is
   within ``CLOSE`` of the best rule's are eligible; among those, the highest split consistency, and among rules
   within ``CLOSE`` of it, the one that runs the fewest evaluations. (Consistency alone picks ``best, no plateau
   stop``, whose ranking agrees least with the held-out test: ``best`` rewards an early peak the final policy does
   not keep. The previous rule, the smaller of single-seed consistency and test agreement, was decided by the
   test agreement alone and picked ``mean of last 3, plateau 2 evals``, which the issue's measure ranks lower.)

Runs are cached in ``<workdir>/runs/`` (one metrics file each), so an interrupted run resumes and the analysis can
be redone without training. Run alone: ``python -m benchmarks.noise [--smoke] [--workdir DIR] [--jobs N]``; from
``benchmarks/run.py`` (part ``noise``) call :func:`bench`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Row, log, main_python, make_row, run_measured, tail

GROUP = "objective noise and rank consistency"
KL, LR = "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.optim.lr"
# (label, kl_coef, lr): the tiny_arith default and its neighbours, both sides of the good region, and verl's defaults
SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("kl0.05_lr1e-5", 0.05, 1e-5), ("kl0.02_lr3e-5", 0.02, 3e-5), ("kl0.2_lr1e-5", 0.2, 1e-5),
    ("kl0.05_lr1e-4", 0.05, 1e-4), ("kl0.05_lr3e-6", 0.05, 3e-6), ("kl0.001_lr1e-6", 0.001, 1e-6),
)
SEEDS = tuple(range(1, 11))  # set A = the first half, set B = the second
SMOKE_SETTINGS = SETTINGS[:3]
SMOKE_SEEDS = (1, 2)
SMOKE_STEPS = ["trainer.total_training_steps=4", "trainer.test_freq=2"]
# candidate defaults: (label, kl_lr.yaml overrides)
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("last, plateau 2 evals", ("objective.aggregate=last", "early_stopping.plateau_evals=2")),
    ("last, no plateau stop", ("objective.aggregate=last", "early_stopping.plateau_evals=null")),
    ("best, plateau 2 evals", ("objective.aggregate=best", "early_stopping.plateau_evals=2")),
    ("best, no plateau stop", ("objective.aggregate=best", "early_stopping.plateau_evals=null")),
    ("mean of last 3, plateau 2 evals", ("objective.aggregate=mean_last_k", "objective.k=3",
                                         "early_stopping.plateau_evals=2")),
    ("mean of last 3, no plateau stop", ("objective.aggregate=mean_last_k", "objective.k=3",
                                         "early_stopping.plateau_evals=null")),
    ("mean of last 3, plateau 3 evals", ("objective.aggregate=mean_last_k", "objective.k=3",
                                         "early_stopping.plateau_evals=3")),
)


CLOSE = 0.02  # rank consistencies this close are a tie: the cheaper rule wins


def choose(res: dict[str, Any]) -> str:
    """The rule to ship (step 4 of the module docstring)."""
    names = [name for name, _ in RULES]
    vs_test = {n: statistics.fmean(res[n]["spearman_vs_test"]) for n in names}
    eligible = [n for n in names if vs_test[n] >= max(vs_test.values()) - CLOSE]
    splits = {n: statistics.fmean(res[n]["spearman_splits"]) for n in eligible}
    top = max(splits.values())
    return min((n for n in eligible if splits[n] >= top - CLOSE), key=lambda n: (res[n]["evals"], -splits[n]))


def split_consistency(val: dict[tuple[str, int], float], labels: list[str], seeds: list[int]) -> list[float]:
    """Spearman correlation of the settings' ranking by mean over one half of ``seeds`` against the other half's,
    for every split of the seeds into two halves (each split once: the first seed always in the first half)."""
    half = len(seeds) // 2
    out = []
    for a in itertools.combinations(seeds, half):
        if seeds[0] not in a:
            continue
        b = [s for s in seeds if s not in a]
        out.append(spearman([statistics.fmean(val[(lab, s)] for s in a) for lab in labels],
                            [statistics.fmean(val[(lab, s)] for s in b) for lab in labels]))
    return out


@dataclass
class Run:
    """One full-budget run: its metric lines, the held-out test value at the last step, its wall time."""

    label: str
    seed: int
    lines: list[tuple[int, dict[str, Any]]]
    wall_s: float

    @property
    def test(self) -> float:
        return float(next(d["test/reward_mean"] for _, d in reversed(self.lines) if "test/reward_mean" in d))


def _space_overrides() -> list[str]:
    import yaml

    space = yaml.safe_load((REPO / "search_spaces" / "kl_lr.yaml").read_text())
    return [f"{k}={v}" for k, v in space["overrides"].items() if k != "trainer.seed"]


def run_one(label: str, kl: float, lr: float, seed: int, extra: list[str], runs_dir: Path) -> Run:
    """The trainer at one setting and seed for the full budget (cached in ``runs_dir``)."""
    metrics = runs_dir / f"{label}_seed{seed}.jsonl"
    done = runs_dir / f"{label}_seed{seed}.done"
    if not done.exists():
        metrics.unlink(missing_ok=True)
        argv = [main_python(), "-m", "verl_core", "train", "--config", "tiny_arith", "--metrics-file", str(metrics),
                *_space_overrides(), *extra, f"{KL}={kl}", f"{LR}={lr}", f"trainer.seed={seed}",
                "trainer.cpu_threads=1", "data.test_files=builtin:arith", "trainer.logger=[file]",
                f"trainer.default_local_dir={runs_dir / ('ckpt_' + label + str(seed))}", "trainer.save_freq=-1",
                "trainer.resume_mode=disable"]
        m = run_measured(["nice", "-n", "10", *argv], env={"PYTHONPATH": str(REPO)}, cwd=REPO)
        if m.returncode != 0:
            raise RuntimeError(f"{label} seed {seed}: trainer exited {m.returncode}:\n{tail(m.stderr)}")
        done.write_text(json.dumps({"wall_s": m.wall_s}))
    lines = [(int(r["step"]), r["data"]) for r in map(json.loads, metrics.read_text().splitlines()) if r]
    run = Run(label, seed, lines, float(json.loads(done.read_text())["wall_s"]))
    curve = {s: d["eval/reward_mean"] for s, d in lines if "eval/reward_mean" in d}
    log(f"objective noise: {label} seed {seed}: {run.wall_s:.0f} s, curve "
        f"{' '.join(f'{s}:{v:.3f}' for s, v in sorted(curve.items()))}, test {run.test:.3f}")
    return run


@functools.cache
def _rule_space(rule: tuple[str, ...]) -> Any:
    """kl_lr.yaml with its objective's aggregate (and ``k``) and plateau rule replaced by ``rule``."""
    from hpo.backends import stored_space
    from hpo.experiment._space import SPACES_DIR, apply_overrides, read_yaml

    raw = read_yaml(SPACES_DIR / "kl_lr.yaml")
    raw["objective"].pop("k", None)
    apply_overrides(raw, list(rule))
    return stored_space(raw, "kl_lr.yaml", "kl_lr")  # parsed, with the trainer's defaults (its spread metric)


def recorded(run: Run, rule: tuple[str, ...]) -> tuple[float, int]:
    """What a kl_lr trial with ``rule`` would record for ``run`` (the driver's Watch, fed its lines until it decides
    to stop), and the step it stops at."""
    import optuna

    from hpo.analysis._diagnosis import Diagnoser
    from hpo.backends import backend_of
    from hpo.study._watch import Watch

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = _rule_space(rule)
    trial = optuna.create_study(direction="maximize").ask()
    names = backend_of(space).metrics  # the trainer's metric names, as the driver's trial reads them
    diag = Diagnoser(space.diagnosis, space.objective.primary_metric, True, names) if space.diagnosis.enabled \
        else None
    watch = Watch(trial, space, 60, lambda s, v: None, diag, prune=False, step_time=names.step_time)
    stop = run.lines[-1][0]
    for step, data in run.lines:
        if watch(step, data) is not None:
            stop = step
            break
    assert watch.value is not None
    return float(watch.value), stop


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); 0 when one side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / den if den else 0.0


def analyse(runs: dict[tuple[str, int], Run], labels: list[str], seeds: list[int]) -> dict[str, Any]:
    """Per rule: recorded values, seed noise, rank consistency and cost (see the module docstring)."""
    test_mean = [statistics.fmean(runs[(lab, s)].test for s in seeds) for lab in labels]
    out: dict[str, Any] = {"test_mean": dict(zip(labels, test_mean, strict=True))}
    for name, rule in RULES:
        rec = {(lab, s): recorded(runs[(lab, s)], rule) for lab in labels for s in seeds}
        evals = statistics.fmean(sum(1 for st, d in runs[k].lines if "eval/reward_mean" in d and st <= stop)
                                 for k, (_, stop) in rec.items())
        out[name] = summarise({k: v for k, (v, _) in rec.items()}, evals, labels, seeds, test_mean)
    return out


def summarise(val: dict[tuple[str, int], float], evals: float, labels: list[str], seeds: list[int],
              test_mean: list[float]) -> dict[str, Any]:
    """One rule's statistics from its recorded value per (setting, seed) and its mean evaluations per trial."""
    std = {lab: statistics.stdev([val[(lab, s)] for s in seeds]) for lab in labels}
    splits = split_consistency(val, labels, seeds)
    return {
        "pooled_std": math.sqrt(statistics.fmean(v * v for v in std.values())), "std": std,
        "mean": {lab: statistics.fmean(val[(lab, s)] for s in seeds) for lab in labels},
        # the first split is the first half of the seeds against the second: the one fixed split of earlier reports
        "spearman_sets": splits[0], "spearman_splits": splits,
        "spearman_pairs": [spearman([val[(lab, s)] for lab in labels], [val[(lab, t)] for lab in labels])
                           for s, t in itertools.combinations(seeds, 2)],
        "spearman_vs_test": [spearman([val[(lab, s)] for lab in labels], test_mean) for s in seeds],
        "evals": evals, "values": {f"{lab}@{s}": v for (lab, s), v in val.items()},
    }


def reanalyse(stored: dict[str, Any]) -> dict[str, Any]:
    """The analysis of an earlier run's ``details`` (results.json ``details.noise``) from its recorded values, with
    no training: what a change of the statistics or of :func:`choose` gives on the same runs."""
    labels = [s[0] for s in stored["settings"]]
    seeds = [int(s) for s in stored["seeds"]]
    test_mean = [float(stored["test_mean"][lab]) for lab in labels]
    out: dict[str, Any] = {"test_mean": stored["test_mean"]}
    for name, _ in RULES:
        vals = stored[name]["values"]
        val = {(lab, s): float(vals[f"{lab}@{s}"]) for lab in labels for s in seeds}
        out[name] = summarise(val, float(stored[name]["evals"]), labels, seeds, test_mean)
    out["settings"], out["seeds"] = stored["settings"], seeds
    out["chosen"] = choose(out)
    return out


def rows_of(res: dict[str, Any]) -> list[Row]:
    """The RESULTS.md rows of an analysis (:func:`analyse` plus ``settings``, ``seeds``, ``chosen``)."""
    seeds, settings = res["seeds"], res["settings"]
    half = len(seeds) // 2
    rows: list[Row] = []
    what = (f"{len(settings)} kl_lr settings x {len(seeds)} trainer seeds, full 60-step runs replayed through the "
            f"driver's Watch with kl_lr.yaml's stopping rules")
    for name, _ in RULES:
        r = res[name]
        splits, pairs = r["spearman_splits"], r["spearman_pairs"]
        chosen = " (CHOSEN: kl_lr.yaml's default)" if name == res["chosen"] else ""
        rows.append(make_row(
            f"rank consistency, {half} seeds vs {len(seeds) - half}: {name}{chosen}", "Spearman", splits, group=GROUP,
            note=f"{what}; median over the {len(splits)} splits of the seeds in halves of the Spearman correlation "
                 f"of the settings' rankings by mean over each half (mean {statistics.fmean(splits):.3f}; the split "
                 f"{seeds[:half]} vs {seeds[half:]}: {r['spearman_sets']:.3f}); one seed vs another (what a one-seed "
                 f"search sees): mean {statistics.fmean(pairs):.3f}, min {min(pairs):.2f} over {len(pairs)} pairs; "
                 f"single seed vs held-out test ranking: mean {statistics.fmean(r['spearman_vs_test']):.3f}; "
                 f"{r['evals']:.1f} evaluations per trial",
            raw={k: v for k, v in r.items() if k not in ("values", "spearman_splits")}))
        rows.append(make_row(f"objective noise (seed std of the recorded value): {name}", "reward",
                             list(r["std"].values()), group=GROUP, higher_is_better=False,
                             note=f"median over settings of the std over {len(seeds)} seeds (pooled "
                                  f"{r['pooled_std']:.4f}); per setting: "
                                  + ", ".join(f"{k} {v:.4f}" for k, v in r["std"].items())))
    return rows


def bench(smoke: bool, workdir: Path | None = None, jobs: int = 2, cached_only: bool = False
          ) -> tuple[list[Row], dict[str, Any]]:
    """Train what is missing (``cached_only``: nothing; analyse the seeds every setting has finished) and analyse."""
    settings = SMOKE_SETTINGS if smoke else SETTINGS
    seeds = list(SMOKE_SEEDS if smoke else SEEDS)
    extra = SMOKE_STEPS if smoke else []
    with tempfile.TemporaryDirectory(prefix="bench_noise_") as tmp:
        runs_dir = (workdir or Path(tmp)) / ("runs_smoke" if smoke else "runs")
        runs_dir.mkdir(parents=True, exist_ok=True)
        if cached_only:
            seeds = [s for s in seeds if all((runs_dir / f"{lab}_seed{s}.done").exists() for lab, _, _ in settings)]
            if len(seeds) < 2:
                raise RuntimeError(f"{runs_dir}: fewer than 2 seeds finished for every setting")
        # seed-major order: an interrupted run leaves every setting measured on the same first seeds
        order = [(lab, kl, lr, s) for s in seeds for lab, kl, lr in settings]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(lambda a: run_one(a[0], a[1], a[2], a[3], extra, runs_dir), order))
        runs = {(r.label, r.seed): r for r in done}
        labels = [lab for lab, _, _ in settings]
        res = analyse(runs, labels, seeds)
    res["settings"] = [list(s) for s in settings]
    res["seeds"] = seeds
    res["chosen"] = choose(res)
    return rows_of(res), res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.noise", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help=f"{len(SMOKE_SETTINGS)} settings, seeds {SMOKE_SEEDS}, 4 steps")
    p.add_argument("--workdir", type=Path, default=None, help="keep (and reuse) the runs here")
    p.add_argument("--jobs", type=int, default=2, help="trainer runs at once (one torch thread each)")
    p.add_argument("--cached-only", action="store_true",
                   help="train nothing: analyse the seeds of --workdir that every setting has finished")
    p.add_argument("--reanalyse", type=Path, default=None, metavar="RESULTS_JSON",
                   help="train nothing: redo the analysis of the recorded values in RESULTS_JSON's details.noise")
    p.add_argument("--out", type=Path, default=None,
                   help="also write DIR/results.json (for `python -m benchmarks.run --update DIR`)")
    args = p.parse_args(argv)
    from benchmarks._common import load_average, machine

    meta: dict[str, Any] = {"machine": machine(), "load_start": load_average(), "parts": ["noise"], "errors": {},
                            "command": "python -m benchmarks.noise " + " ".join(sys.argv[1:] if argv is None else argv),
                            "smoke": args.smoke}
    t0 = time.time()
    if args.reanalyse is not None:
        details = reanalyse(json.loads(args.reanalyse.read_text())["details"]["noise"])
        rows = rows_of(details)
    else:
        rows, details = bench(args.smoke, args.workdir, args.jobs, args.cached_only)
    meta.update(load_end=load_average(), elapsed_min=(time.time() - t0) / 60)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"meta": meta, "rows": [r.to_json() for r in rows], "details": {"noise": details}}, default=str))
    for r in rows:
        print(f"{r.name}: {r.ours:.4g} {r.unit} [{r.note}]")
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
