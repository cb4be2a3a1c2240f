"""Proof that a search pays (issue 22): the shipped ``kl_lr`` study, run as a user would (``verl-hpo search`` then
``verl-hpo confirm``), against its ``study.baseline`` (verl's defaults of the tuned keys: lr 1e-6, kl_coef 0.001),
over several study (sampler) seeds.

Per study seed: the search (16 trials, the shipped settings), then ``confirm`` (the top 3 settings x 3 fresh seeds,
full budget, the held-out test split at the last step, and the baseline on the same seeds), then what ``best``
recommends (:func:`hpo.reporting._verdict.study_verdict`: the best confirmed mean, or a tied setting preferred by the
documented rule). Rows: the pick's confirmed held-out test reward against the baseline's, the difference and its
Welch 95% interval per seed (goal: the interval excludes 0 on every seed), and the same on the validation values.

The baseline runs only in the first study: the trainer is deterministic for a seed (``tests/verl_core/
test_trainer.py::test_same_seed_same_metrics``) and every study confirms on the same seeds, so the other studies
reuse its runs (``study.baseline=null`` there) instead of repeating them.

Run alone: ``python -m benchmarks.pays [--smoke] [--workdir DIR]``; from ``benchmarks/run.py`` (part ``pays``) call
:func:`bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import Row, hpo_cli, log, make_row
from benchmarks.search_cost import TODAY

GROUP = "a search pays: kl_lr's pick vs its baseline (verl's defaults)"
SEEDS = (0, 1, 2)
SMOKE_SEEDS = (0,)
SMOKE = ["study.n_trials=3", "trainer.total_training_steps=4", "trainer.test_freq=2", "study.confirm.top_k=1",
         "study.confirm.seeds=2"]
TOP_K = 3  # settings confirmed per study, as kl_lr ships (study.confirm.top_k)


def _cli(args: list[str], studies: Path) -> None:
    wall = hpo_cli(args, studies, nice=True, timeout_s=7200)
    log(f"pays: verl-hpo {' '.join(args)}: {wall:.0f} s")


def one_study(seed: int, studies: Path, smoke: bool, with_baseline: bool) -> dict[str, Any]:
    """Search, confirm, and read back what best recommends (and the baseline's runs, when this study has them)."""
    import optuna

    from hpo.reporting._verdict import study_verdict
    from hpo.study._confirm import baseline_confirmed
    from hpo.study._optuna import load_stored

    name = f"pays_{seed}"
    # the method these rows measured (kl_lr shipped it until issue 37: median pruner, top 3 x 3 seeds, no budget)
    extra = [*TODAY, *(SMOKE if smoke else []), f"study.sampler.seed={seed}"]
    if not with_baseline:
        extra.append("study.baseline=null")
    over = [a for o in extra for a in ("--override", o)]
    _cli(["search", "--space", "kl_lr", "--study", name, *over], studies)
    _cli(["confirm", "--study", name, *([] if smoke else ["--top", str(TOP_K)])], studies)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space, study = load_stored(name, f"sqlite:///{studies / (name + '.db')}", None)
    v = study_verdict(study, space)
    assert v is not None, f"{name}: no confirmed setting"
    base = baseline_confirmed(study)

    def run_values(c: Any) -> dict[str, Any]:
        return {"trial": c.trial.number, "params": dict(c.trial.params), "values": list(c.values),
                "test_values": list(c.test_values), "seeds": list(c.seeds)}

    search = [t for t in study.trials if "confirm_of" not in t.user_attrs]
    return {"pick": run_values(v.pick), "top": run_values(v.top), "tied": [c.trial.number for c in v.tied],
            "baseline": run_values(base) if base else None,
            "search_trials": [{"number": t.number, "value": t.value, "params": t.params, "state": t.state.name,
                               "stop_reason": t.user_attrs.get("stop_reason"), "last_step": t.user_attrs.get(
                                   "last_step")} for t in search]}


def bench(smoke: bool, workdir: Path | None = None) -> tuple[list[Row], dict[str, Any]]:
    from hpo.study._compare import welch

    seeds = SMOKE_SEEDS if smoke else SEEDS
    details: dict[str, Any] = {"seeds": list(seeds)}
    with tempfile.TemporaryDirectory(prefix="bench_pays_") as tmp:
        studies = (workdir or Path(tmp)) / "studies"
        studies.mkdir(parents=True, exist_ok=True)
        from concurrent.futures import ThreadPoolExecutor

        def run(i: int, seed: int) -> None:  # the studies at once: each its own driver (trial.n_jobs as shipped)
            details[str(seed)] = one_study(seed, studies, smoke, with_baseline=i == 0)
            (studies / f"pays_{seed}.json").write_text(json.dumps(details[str(seed)], default=str))

        with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
            for f in [pool.submit(run, i, s) for i, s in enumerate(seeds)]:
                f.result()
    base = details[str(seeds[0])]["baseline"]
    rows: list[Row] = []
    for kind, key in (("held-out test", "test_values"), ("validation", "values")):
        picks, bases, diffs, lows = [], [], [], []
        notes = []
        for seed in seeds:
            pick = details[str(seed)]["pick"]
            d = welch(pick[key], base[key])
            picks.append(statistics.fmean(pick[key]))
            bases.append(statistics.fmean(base[key]))
            if d is not None:
                diffs.append(d.diff)
                lows.append(d.low)
            params = ", ".join(f"{k} {v:.3g}" for k, v in pick["params"].items())
            notes.append(f"seed {seed}: trial {pick['trial']} ({params}) {statistics.fmean(pick[key]):.4f} vs "
                         f"{statistics.fmean(base[key]):.4f}, diff {d.text() if d else 'n/a'}")
        note = (f"kl_lr as shipped, 16 trials per study seed, confirm top {TOP_K} x 3 fresh seeds (full budget); "
                f"baseline = study.baseline (lr 1e-6, kl_coef 0.001) on the same seeds; Welch 95% intervals; "
                + "; ".join(notes))
        rows.append(make_row(f"confirmed {kind} reward: search's pick vs baseline", "reward", picks, bases,
                             group=GROUP, note=note))
        rows.append(make_row(f"improvement over the baseline ({kind}), lower end of the 95% interval", "reward", lows,
                             group=GROUP, note=f"per study seed {list(seeds)}: {[round(x, 4) for x in lows]}; goal > 0 "
                                               f"on every seed; differences {[round(x, 4) for x in diffs]}"))
    return rows, details


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pays", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="one seed, 3 trials of 4 steps, confirm 1 x 2 seeds")
    p.add_argument("--workdir", type=Path, default=None, help="keep the studies here")
    args = p.parse_args(argv)
    rows, details = bench(args.smoke, args.workdir)
    for r in rows:
        print(f"{r.name}: {r.ours} {r.unit} [{r.note}]")
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
