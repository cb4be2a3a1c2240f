"""What a confirmed pick costs (issue 37): full-run equivalents spent by the search and its confirmation together,
today's method against multi-fidelity search with racing confirmation, both run here on the same study seeds.

* **today**: the shipped method before issue 37: the median pruner after 2 evaluations, plateau and collapse stops,
  then ``confirm`` of the top 3 settings on 3 fresh seeds each at the full budget, and the baseline on the same seeds.
* **racing**: asynchronous successive halving in steps (Optuna's ``SuccessiveHalvingPruner``: rungs at
  ``test_freq`` x 3^k steps, the top third promoted), the same stops, a study budget (``--budget``) that keeps the
  confirmation's least, and racing confirmation of the top 2 (seed by seed, at most 3 seeds, paired intervals).

Cost: every trainer step the study ran (a retry's replayed steps excluded) over a full run's length
(:func:`hpo.record.study_cost`). Baseline runs: today's tool ran them in every study, so today's cost counts them even
where this host's kept runs were reused; the racing method reuses them (run once per host: counted on the first
study, reported apart). Quality: the confirmed pick's held-out test mean of each method (``best``'s pick,
:func:`hpo.reporting._verdict.study_verdict`) and, with a baseline, its improvement over it (Welch 95%).

Real verl (:func:`bench_verl`, part ``search_cost_verl``): ``search_spaces/verl_grpo_cpu.yaml`` on the CPU, the racing
method alone on one study seed (today's confirmation alone would be 12 verl runs), its budget paying the baseline's
runs (verl trials never reuse kept ones).

Run alone: ``python -m benchmarks.search_cost [--smoke] [--workdir DIR] [--space kl_lr ...]`` (``--space
verl_grpo_cpu`` for the verl row); from ``benchmarks/run.py`` (parts ``search_cost``, ``search_cost_verl``) call
:func:`bench` / :func:`bench_verl`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import REPO, Row, hpo_cli, log, make_row

GROUP = "search cost: full-run equivalents to a confirmed pick"
SEEDS = (0, 1, 2)
SPACES = ("kl_lr", "kl_lr_clip")
TODAY = ["study.pruner.type=median", "study.pruner.n_startup_trials=4", "study.pruner.n_warmup_evals=2",
         "study.confirm.race=false", "study.confirm.top_k=3", "study.confirm.seeds=3", "study.budget=null"]
BUDGET = 7.0


def racing(test_freq: int, budget: float = BUDGET) -> list[str]:
    return ["study.pruner.type=successive_halving", f"study.pruner.min_resource={test_freq}",
            "study.pruner.reduction_factor=3", "study.pruner.n_warmup_evals=0", "study.confirm.race=true",
            "study.confirm.top_k=2", "study.confirm.seeds=3", "study.confirm.min_seeds=2", f"study.budget={budget:g}"]


METHODS = ("today", "racing")
# real verl 0.9.1 on the CPU (search_spaces/verl_grpo_cpu.yaml, ~4 min a full run here): the racing method alone, one
# study seed; verl trials never reuse kept baseline runs, so its budget also pays the baseline's 2 runs
VERL_SPACE = "verl_grpo_cpu"
VERL_BUDGET = 8.0
VERL_EXTRA = ["study.n_trials=12", "study.confirm.seeds=2"]
SMOKE = ["study.n_trials=3", "trainer.total_training_steps=4", "trainer.test_freq=2"]


def _overrides(space: str, method: str, smoke: bool) -> list[str]:
    raw = yaml.safe_load((REPO / "search_spaces" / f"{space}.yaml").read_text())
    test_freq = 2 if smoke else int(raw["overrides"]["trainer.test_freq"])
    if space == VERL_SPACE:
        return [*racing(test_freq, VERL_BUDGET), *VERL_EXTRA]
    out = TODAY if method == "today" else racing(test_freq)
    if smoke:
        out = [o for o in out if not o.startswith("study.budget")] + [*SMOKE, "study.confirm.seeds=2"]
        out += ["study.budget=null"] if method == "today" else ["study.budget=6"]
    return out


def one_study(space: str, method: str, seed: int, studies: Path, smoke: bool) -> dict[str, Any]:
    """Search then confirm one study; what it spent and what ``best`` picks."""
    import optuna

    from hpo.record import is_baseline, is_confirm, steps_run, study_cost
    from hpo.reporting._verdict import study_verdict
    from hpo.study._compare import race_state
    from hpo.study._confirm import baseline_confirmed
    from hpo.study._optuna import load_stored

    name = f"cost_{space}_{method}_{seed}"
    over = [a for o in [*_overrides(space, method, smoke), f"study.sampler.seed={seed}"] for a in ("--override", o)]
    wall = hpo_cli(["search", "--space", space, "--study", name, *over], studies, nice=True, timeout_s=7200)
    wall += hpo_cli(["confirm", "--study", name], studies, nice=True, timeout_s=7200)
    log(f"search_cost: {name}: {wall:.0f} s")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sp, study = load_stored(name, f"sqlite:///{studies / (name + '.db')}", None)
    trials = study.get_trials(deepcopy=False)
    cost = study_cost(trials)
    reused = [t for t in trials if is_confirm(t) and is_baseline(t) and t.user_attrs.get("baseline_reused")]
    reused_steps = sum(int(t.user_attrs.get("last_step") or 0) for t in reused)
    baseline_steps = sum(steps_run(t) for t in trials if is_confirm(t) and is_baseline(t))
    v = study_verdict(study, sp)
    assert v is not None, f"{name}: no confirmed setting"
    base = baseline_confirmed(study)
    race = race_state(study, sp)
    from hpo.reporting._verdict import improvement

    test = improvement(v.pick.test_values, base.test_values, True) if base and v.pick.test_values and \
        base.test_values else None
    search = [t for t in trials if not is_confirm(t)]
    return {"name": name, "wall_s": wall, "full": cost.full, "search_steps": cost.search_steps,
            "confirm_steps": cost.confirm_steps, "baseline_steps_run": baseline_steps,
            "baseline_steps_reused": reused_steps, "search_trials": len(search),
            "states": {s: sum(1 for t in search if t.state.name == s) for s in ("COMPLETE", "PRUNED", "FAIL")},
            "pick": {"trial": v.pick.trial.number, "params": dict(v.pick.trial.params), "values": list(v.pick.values),
                     "test_values": list(v.pick.test_values)},
            "tied": [c.trial.number for c in v.tied],
            "race": None if race is None else {"end": race.end, "rounds": race.rounds, "dropped": sorted(race.dropped),
                                               "baseline_runs": race.baseline_runs},
            "improvement_test": None if test is None else [test.diff, test.low, test.high],
            "confirm_runs": sum(1 for t in trials if is_confirm(t) and t.state.name == "COMPLETE")}


def runs(d: dict[str, Any], method: str) -> float:
    """Full-run equivalents to the pick: today's counts its baseline's runs even where they were reused."""
    steps = d["search_steps"] + d["confirm_steps"] + (d["baseline_steps_reused"] if method == "today" else 0)
    return float(steps / d["full"])


def bench(smoke: bool, workdir: Path | None = None, spaces: tuple[str, ...] = SPACES) -> tuple[list[Row],
                                                                                                 dict[str, Any]]:
    seeds = (0,) if smoke else SEEDS
    details: dict[str, Any] = {"seeds": list(seeds), "budget": BUDGET}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench_cost_") as tmp:
        studies = (workdir or Path(tmp)) / "studies"
        studies.mkdir(parents=True, exist_ok=True)

        def run(space: str, method: str, seed: int) -> None:
            key = f"{space}/{method}/{seed}"
            details[key] = one_study(space, method, seed, studies, smoke)
            (studies / f"cost_{space}_{method}_{seed}.json").write_text(json.dumps(details[key], default=str))

        for space in spaces:
            # today's studies first (3 at once, as the pays part runs them): the first to finish its baseline keeps it
            # for this host; the racing studies then reuse it
            with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
                for f in [pool.submit(run, space, "today", s) for s in seeds]:
                    f.result()
            with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
                for f in [pool.submit(run, space, "racing", s) for s in seeds]:
                    f.result()
            rows += _rows(space, seeds, details)
    return rows, details


def bench_verl(smoke: bool, workdir: Path | None = None) -> tuple[list[Row], dict[str, Any]]:
    """The racing method on real verl on the CPU, one study seed (skipped without ``.venv-verl``). Today's method is
    not run here: its confirmation alone is 12 full runs (top 3 x 3 seeds + the baseline's 3), ~50 min on 2 cores."""
    if not (REPO / ".venv-verl" / "bin" / "python").exists():
        log("search_cost verl: no .venv-verl (make install-verl): skipped")
        return [], {"skipped": "no .venv-verl"}
    with tempfile.TemporaryDirectory(prefix="bench_cost_verl_") as tmp:
        studies = (workdir or Path(tmp)) / "studies"
        studies.mkdir(parents=True, exist_ok=True)
        d = one_study(VERL_SPACE, "racing", 0, studies, smoke)
        (studies / f"cost_{VERL_SPACE}_racing_0.json").write_text(json.dumps(d, default=str))
    details = {"budget": VERL_BUDGET, f"{VERL_SPACE}/racing/0": d}
    cost = runs(d, "racing")
    rows = [make_row(f"search cost: full-run equivalents to a confirmed pick (search + confirmation), {VERL_SPACE} "
                     "(real verl 0.9.1 on the CPU)", "full runs", [cost], None, higher_is_better=False, group=GROUP,
                     note=f"racing method, study seed 0, budget {VERL_BUDGET:g} (the baseline's 2 runs included: "
                          f"verl trials never reuse kept ones); {d['search_steps']} search + {d['confirm_steps']} "
                          f"confirm steps, a full run = {d['full']} steps, {d['search_trials']} search trials "
                          f"{d['states']}, race {d['race']}, {d['wall_s'] / 60:.0f} min; today's method not run "
                          "(its confirmation alone is 12 full runs)")]
    if d["improvement_test"]:
        diff, low, high = d["improvement_test"]
        rows.append(make_row(f"racing pick's improvement over the baseline (held-out test), {VERL_SPACE}", "reward",
                             [diff], None, group=GROUP,
                             note=f"pick {d['pick']['params']} test {[round(x, 4) for x in d['pick']['test_values']]}"
                                  f"; difference {diff:+.4f} [{low:+.4f}, {high:+.4f}] (Welch 95%) over verl's "
                                  "defaults (lr 1e-6, kl_loss_coef 0.001); the race and the pick use the validation "
                                  "file's values, the test file is validated beside it (study.confirm.test_metric)"))
    return rows, details


def _rows(space: str, seeds: tuple[int, ...], details: dict[str, Any]) -> list[Row]:
    new = [details[f"{space}/racing/{s}"] for s in seeds]
    old = [details[f"{space}/today/{s}"] for s in seeds]
    cost_new, cost_old = [runs(d, "racing") for d in new], [runs(d, "today") for d in old]
    notes = []
    for s, n, o in zip(seeds, new, old, strict=True):
        notes.append(f"seed {s}: racing {runs(n, 'racing'):.1f} ({n['search_steps']} search + {n['confirm_steps']} "
                     f"confirm steps, {n['search_trials']} trials, race {n['race']}) vs today {runs(o, 'today'):.1f} "
                     f"({o['search_steps']} + {o['confirm_steps'] + o['baseline_steps_reused']})")
    base_once = max((d["baseline_steps_run"] for d in old), default=0) / (old[0]["full"] or 1)
    rows = [make_row(f"search cost: full-run equivalents to a confirmed pick (search + confirmation), {space}",
                     "full runs", cost_new, cost_old, higher_is_better=False, group=GROUP,
                     note=f"{space} as shipped, study seeds {list(seeds)}; racing = successive halving + budget "
                          f"{BUDGET:g} + racing confirmation of the top 2; today = median pruner + top 3 x 3 seeds + "
                          f"the baseline in every study; baseline runs made once on this host "
                          f"({base_once:.1f} full runs) are reused by the racing studies; " + "; ".join(notes))]
    test_new = [statistics.fmean(d["pick"]["test_values"]) for d in new if d["pick"]["test_values"]]
    test_old = [statistics.fmean(d["pick"]["test_values"]) for d in old if d["pick"]["test_values"]]
    if test_new and len(test_new) == len(test_old):
        diffs = [round(a - b, 4) for a, b in zip(test_new, test_old, strict=True)]
        shown = [round(x, 4) for x in test_new]
        rows.append(make_row(f"confirmed pick's held-out test value, racing vs today, {space}", "reward", test_new,
                             test_old, group=GROUP, note=f"per seed {list(seeds)}: racing {shown}, today "
                             f"{[round(x, 4) for x in test_old]}, differences {diffs} (goal: within 0.01)"))
    lows = [d["improvement_test"][1] for d in new if d["improvement_test"]]
    if lows and len(lows) == len(seeds):
        rows.append(make_row(f"racing pick's improvement over the baseline (held-out test), lower end of the 95% "
                             f"interval, {space}", "reward", lows, [d["improvement_test"][1] for d in old
                                                                     if d["improvement_test"]] or None,
                             group=GROUP, note=f"per seed {list(seeds)}: racing "
                             f"{[[round(x, 4) for x in d['improvement_test']] for d in new]} (diff, low, high); today "
                             f"{[[round(x, 4) for x in d['improvement_test']] for d in old if d['improvement_test']]}; "
                             "goal: low > 0 on every seed"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.search_cost", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="one seed, 3 trials of 4 steps")
    p.add_argument("--workdir", type=Path, default=None, help="keep the studies here")
    p.add_argument("--space", action="append", default=None, choices=(*SPACES, VERL_SPACE),
                   help=f"default: {' and '.join(SPACES)} ({VERL_SPACE}: real verl, the racing method alone)")
    args = p.parse_args(argv)
    spaces = tuple(args.space or SPACES)
    rows, details = bench(args.smoke, args.workdir, tuple(s for s in spaces if s != VERL_SPACE))
    if VERL_SPACE in spaces:
        more, details["verl"] = bench_verl(args.smoke, args.workdir)
        rows += more
    for r in rows:
        print(f"{r.name}: {r.ours} vs {r.baseline} {r.unit} [{r.note}]")
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
