"""Model-size fidelity (issue 51): ``search_spaces/kl_lr_proxy.yaml`` searches on the smallest model of the tiny_arith
family (``builtin:tiny_arith_s``) for the largest (``builtin:tiny_arith_l``), against searching on the target itself.

* **agreement**: 8 settings x 2 trainer seeds, each run for the full budget on the proxy and on the target
  (:func:`benchmarks.noise.run_one`, the model named by ``actor_rollout_ref.model.path``), scored as a kl_lr trial
  records them (:func:`benchmarks.noise.recorded`: the shipped objective and stopping rules); Kendall's tau-b of the
  settings' mean values, proxy against target, with its 95% bootstrap interval over the settings and the exact
  permutation p-value (the study's own check: :mod:`hpo.samplers._check`).
* **cost**: per study seed 0-2, three studies of the same experiment, each searched then confirmed: ``proxy``
  (kl_lr_proxy as shipped), ``racing`` (the same on the target alone: ``study.fidelity=null``, today's racing method)
  and ``today`` (the 21-run method of before issue 37, on the target: :data:`benchmarks.search_cost.TODAY`). Each
  row: target full-run equivalents to the confirmed pick (:func:`hpo.record.study_cost`, a proxy step at the study's
  measured ratio), without and with the baseline's runs of a fresh host, and the pick's held-out test mean. The proxy
  study's check (tau, its decision) is in the notes; when the proxy does not hold, the fallback's cost is its row.
* **quality**: each study seed's picks (the proxy's and the 21-run method's, the racing method's where it ran) run
  again on the target on :data:`QUALITY_SEEDS`, fresh trainer seeds that neither the search (seed 1) nor any
  confirmation used, so no pick is scored on the draws that chose it; per seed the paired difference of the held-out
  test values, proxy - 21-run, with its 95% paired-t interval. A confirmed pick's own test values are 2-3 draws of
  the seeds that selected it (one setting's test values differ by up to 0.05 between seeds), too few to tell a 0.01
  gap; this part measures the gap the goal names.

Run alone: ``python -m benchmarks.proxy [--smoke] [--workdir DIR] [--only agreement|cost|quality]``; from
``benchmarks/run.py`` call :func:`bench`. Slow: the target model's full runs (~1-2 min each on 2 cores) dominate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._common import Row, hpo_cli, log, make_row

GROUP = "model-size fidelity: search on a small model of the family"
SPACE = "kl_lr_proxy"
PROXY, TARGET = "builtin:tiny_arith_s", "builtin:tiny_arith_l"
MODEL_KEY = "actor_rollout_ref.model.path"
SEEDS = (0, 1, 2)
TRAINER_SEEDS = (1, 2)
# quality: fresh trainer seeds for re-running the picks (the search trains on seed 1, the confirmations on
# study.confirm.seed_base = 1000 upwards)
QUALITY_SEEDS = (101, 102, 103, 104, 105, 106)
# (label, kl_coef, lr): benchmarks/noise.py's six (the good region and both sides of it, verl's defaults) and two more
SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("kl0.05_lr1e-5", 0.05, 1e-5), ("kl0.02_lr3e-5", 0.02, 3e-5), ("kl0.2_lr1e-5", 0.2, 1e-5),
    ("kl0.05_lr1e-4", 0.05, 1e-4), ("kl0.05_lr3e-6", 0.05, 3e-6), ("kl0.001_lr1e-6", 0.001, 1e-6),
    ("kl0.5_lr1e-5", 0.5, 1e-5), ("kl0.05_lr3e-4", 0.05, 3e-4),
)
SHIPPED_RULE = ("objective.aggregate=mean_last_k", "objective.k=3", "early_stopping.plateau_evals=3")
SMOKE_STEPS = ["trainer.total_training_steps=4", "trainer.test_freq=2"]
SMOKE_STUDY = [*SMOKE_STEPS, "study.n_trials=3", "study.pruner.min_resource=2", "study.confirm.seeds=2",
               "study.fidelity.proxy.promote=2"]


# The rule the agreement part also measures when kl_lr_proxy ships none: the target's learning rate at 3 x the
# proxy's, read off the first build's grid (RESULTS.md, "model-size fidelity") and shipped until a second build's
# grid showed it lowering the agreement (tau 0.86 -> 0.36).
CANDIDATE_TRANSFER = {"actor_lr": 3.0}


def shipped_transfer() -> dict[str, float]:
    """kl_lr_proxy's transfer factors by parameter name (the target runs factor x the proxy's value)."""
    from hpo.backends import backend_of, load_space, transfer_factors

    space = load_space(SPACE)
    return transfer_factors(space, backend_of(space))


def agreement(runs_dir: Path, smoke: bool) -> dict[str, Any]:
    """(a): each setting's mean recorded value on the proxy and on the target, and tau between them: the proxy at the
    same values (no transfer), and at the values kl_lr_proxy's transfer rules give it (the target's value / factor;
    :data:`CANDIDATE_TRANSFER` when it ships none)."""
    from benchmarks.noise import recorded, run_one
    from hpo.samplers._check import kendall_tau, tau_interval, tau_p_value

    settings = SETTINGS[:3] if smoke else SETTINGS
    seeds = TRAINER_SEEDS[:1] if smoke else TRAINER_SEEDS
    extra = SMOKE_STEPS if smoke else []
    factors = shipped_transfer() or CANDIDATE_TRANSFER
    kl_f, lr_f = factors.get("kl_coef", 1.0), factors.get("actor_lr", 1.0)
    # (column, model path, label suffix, kl divisor, lr divisor)
    columns = [("proxy", PROXY, "", 1.0, 1.0), ("target", TARGET, "", 1.0, 1.0)]
    if factors:
        columns.append(("proxy_transfer", PROXY, f"_t{kl_f:g}_{lr_f:g}", kl_f, lr_f))
    jobs = [(col, path, label + sfx, kl / kf, lr / lf, s) for col, path, sfx, kf, lf in columns
            for label, kl, lr in settings for s in seeds]
    for col, *_ in columns:
        (runs_dir / ("proxy" if col.startswith("proxy") else col)).mkdir(parents=True, exist_ok=True)

    def one(job: tuple[str, str, str, float, float, int]) -> float:
        col, path, label, kl, lr, s = job
        where = runs_dir / ("proxy" if col.startswith("proxy") else col)
        return recorded(run_one(label, kl, lr, s, [*extra, f"{MODEL_KEY}={path}"], where), SHIPPED_RULE)[0]

    # Two runs at a time (each one torch thread: the two cores), as the studies run their trials.
    with ThreadPoolExecutor(max_workers=2) as pool:
        values = dict(zip(jobs, pool.map(one, jobs), strict=True))
    means: dict[str, list[float]] = {}
    for col, path, sfx, kf, lf in columns:
        means[col] = [statistics.fmean(values[(col, path, label + sfx, kl / kf, lr / lf, s)] for s in seeds)
                      for label, kl, lr in settings]
    out: dict[str, Any] = {"settings": [s[0] for s in settings], "seeds": list(seeds), "transfer": factors, **means}
    for col, key in (("proxy", ""), ("proxy_transfer", "_transfer")):
        if col not in means:
            continue
        tau = kendall_tau(means[col], means["target"])
        out.update({f"tau{key}": tau, f"interval{key}": tau_interval(means[col], means["target"]),
                    f"p_value{key}": None if tau is None else tau_p_value(means[col], means["target"], tau)})
    return out


def one_study(method: str, seed: int, studies: Path, smoke: bool) -> dict[str, Any]:
    """Search then confirm one study of ``method``; what it spent (target full runs) and what ``best`` picks."""
    import optuna

    from benchmarks.search_cost import TODAY, racing
    from hpo.record import ATTR_FIDELITY_CHECK, is_baseline, is_confirm, study_cost
    from hpo.reporting._verdict import study_verdict
    from hpo.samplers import ties_line
    from hpo.study._compare import race_state
    from hpo.study._optuna import load_stored

    # racing: kl_lr_proxy's own budget (9, the baseline's runs included), as kl_lr ships it; search_cost's 7 assumes
    # a host that keeps the baseline's runs, and on a fresh studies dir left the search one run (a 0.07 pick)
    over = {"proxy": [], "racing": [*racing(2 if smoke else 10, 9.0), "study.fidelity=null"],
            "today": [*TODAY, "study.fidelity=null"]}[method]
    if smoke:
        over = [o for o in over if not o.startswith("study.budget")] + SMOKE_STUDY + ["study.budget=null"]
        if method != "proxy":
            over = [o for o in over if not o.startswith("study.fidelity.proxy")]
    name = f"proxy_{method}_{seed}"
    # A generous kill bound: the benchmark may share the host, and a target run killed at the shipped 600 s would
    # count as a failed run (the bound changes nothing else).
    args = [a for o in [*over, f"study.sampler.seed={seed}", "trial.timeout_s=1800"] for a in ("--override", o)]
    wall = hpo_cli(["search", "--space", SPACE, "--study", name, *args], studies, nice=True, timeout_s=14400)
    wall += hpo_cli(["confirm", "--study", name], studies, nice=True, timeout_s=14400)
    log(f"proxy: {name}: {wall:.0f} s")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space, study = load_stored(name, f"sqlite:///{studies / (name + '.db')}", None)
    trials = study.get_trials(deepcopy=False)
    cost = study_cost(trials)
    fresh = sum(int(t.user_attrs.get("last_step") or 0) for t in trials
                if is_confirm(t) and is_baseline(t) and t.user_attrs.get("baseline_reused"))
    v = study_verdict(study, space)
    assert v is not None, f"{name}: no confirmed setting"
    return {"name": name, "wall_s": wall, "full": cost.full, "split": cost.split, "ratio": cost.proxy_ratio,
            "runs": cost.total_runs - cost.split["baseline"], "runs_fresh_host": cost.total_runs + cost.runs(fresh),
            "pick": {"trial": v.pick.trial.number, "params": dict(v.pick.trial.params),
                     "values": list(v.pick.values), "test_values": list(v.pick.test_values)},
            "check": study.user_attrs.get(ATTR_FIDELITY_CHECK), "ties": ties_line(study),
            "race_end": (race.end, race.rounds) if (race := race_state(study, space)) is not None else None,
            "race_field": list(race.candidates) if race is not None else None}


def family_build() -> dict[str, str | None]:
    """Which build of the family this machine holds: each member's weights, sha256 (16 hex digits). The build's bits
    follow the machine's CPU kernels (two machines of one kind have made two builds, whose target values and proxy
    rankings differ: RESULTS.md), so figures from two builds are not one experiment."""
    from verl_core.tiny_model import builtin_model_dir

    out: dict[str, str | None] = {}
    for name in (PROXY, TARGET):
        weights = builtin_model_dir(name.removeprefix("builtin:")) / "model.safetensors"
        out[name] = hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.is_file() else None
    return out


def quality(details: dict[str, Any], seeds: tuple[int, ...], runs_dir: Path, smoke: bool) -> dict[str, Any]:
    """(c): each study seed's picks re-run on the target on :data:`QUALITY_SEEDS` (full runs, the held-out test value
    at the last step, as a confirmation run records it); per seed each method's mean and the paired difference proxy -
    21-run with its 95% interval. Picks shared by two methods run once."""
    from benchmarks.noise import run_one
    from hpo.study._compare._intervals import paired

    trainer_seeds = QUALITY_SEEDS[:2] if smoke else QUALITY_SEEDS
    extra = [*(SMOKE_STEPS if smoke else []), f"{MODEL_KEY}={TARGET}"]
    runs_dir.mkdir(parents=True, exist_ok=True)
    picks = {(m, s): details[f"{m}/{s}"]["pick"]["params"] for m in METHODS for s in seeds if f"{m}/{s}" in details}
    settings = sorted({(p["kl_coef"], p["actor_lr"]) for p in picks.values()})
    jobs = [(kl, lr, t) for kl, lr in settings for t in trainer_seeds]

    def one(job: tuple[float, float, int]) -> float:
        kl, lr, t = job
        return run_one(f"pick_kl{kl:.6g}_lr{lr:.6g}", kl, lr, t, extra, runs_dir).test

    with ThreadPoolExecutor(max_workers=2) as pool:  # two runs at a time, one torch thread each, as the studies run
        tests = dict(zip(jobs, pool.map(one, jobs), strict=True))
    out: dict[str, Any] = {"trainer_seeds": list(trainer_seeds)}
    for s in seeds:
        per = {m: [tests[(p["kl_coef"], p["actor_lr"], t)] for t in trainer_seeds]
               for (m, s2), p in picks.items() if s2 == s}
        row: dict[str, Any] = {m: {"params": picks[(m, s)], "tests": v, "mean": statistics.fmean(v)}
                               for m, v in per.items()}
        if "proxy" in per and "today" in per:
            d = paired(per["proxy"], per["today"])
            row["proxy_minus_today"] = None if d is None else {"diff": d.diff, "low": d.low, "high": d.high}
        out[str(s)] = row
    return out


METHODS = ("proxy", "racing", "today")


def bench(smoke: bool, workdir: Path | None = None, parts: tuple[str, ...] = ("agreement", "cost", "quality"),
          methods: tuple[str, ...] = METHODS) -> tuple[list[Row], dict[str, Any]]:
    seeds = SEEDS[:1] if smoke else SEEDS
    details: dict[str, Any] = {"seeds": list(seeds), "family_build": family_build()}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench_proxy_") as tmp:
        root = workdir or Path(tmp)
        done = root / "results"  # each part's result as it ends: a re-run with the same --workdir goes on from there
        done.mkdir(parents=True, exist_ok=True)

        def kept(key: str) -> Path:
            return done / f"{key.replace('/', '_')}.json"

        def cached(key: str, make: Any) -> Any:
            if kept(key).is_file():
                return json.loads(kept(key).read_text())
            value = make()
            kept(key).write_text(json.dumps(value, default=str))
            return value

        if "cost" in parts:
            studies = root / "studies"
            studies.mkdir(parents=True, exist_ok=True)
            # The proxy first (its figures are the point), then the agreement, the racing method and the 21-run
            # method last (the quality reference, ~3x the racing method's time). A host's baseline runs are kept
            # (studies/.baselines): the first study pays them, the others reuse them, and each row counts them as a
            # fresh host would (runs_fresh_host).
            for s in seeds if "proxy" in methods else ():
                details[f"proxy/{s}"] = cached(f"proxy/{s}", lambda s=s: one_study("proxy", s, studies, smoke))
        if "agreement" in parts:
            details["agreement"] = a = cached("agreement", lambda: agreement(root / "runs", smoke))
            rows.append(make_row("proxy vs target rank agreement (Kendall's tau of the settings' mean values)", "tau",
                                 [a["tau"]] if a["tau"] is not None else None, None, group=GROUP,
                                 note=f"{len(a['settings'])} settings x {len(a['seeds'])} seeds, {PROXY} vs {TARGET};"
                                      f" 95% interval {a['interval']}, p {a['p_value']}; proxy "
                                      f"{[round(x, 3) for x in a['proxy']]}, target "
                                      f"{[round(x, 3) for x in a['target']]}"))
            if a.get("tau_transfer") is not None:
                rows.append(make_row("the same with a transfer rule (the proxy at the target's value / factor)",
                                     "tau", [a["tau_transfer"]], [a["tau"]] if a["tau"] is not None else None,
                                     group=GROUP,
                                     note=f"factors {a['transfer']}; 95% interval {a['interval_transfer']}, p "
                                          f"{a['p_value_transfer']}; proxy "
                                          f"{[round(x, 3) for x in a['proxy_transfer']]}"))
        if "cost" in parts:
            for method in [m for m in ("racing", "today") if m in methods]:
                for s in seeds:
                    details[f"{method}/{s}"] = cached(f"{method}/{s}", lambda m=method, s=s: one_study(m, s, studies,
                                                                                                     smoke))
            if all(f"{m}/{s}" in details for m in METHODS for s in seeds):
                rows += _cost_rows(seeds, details)
        if "quality" in parts:
            for key in [f"{m}/{s}" for m in METHODS for s in seeds]:  # the cost part's studies, this run's or kept
                if key not in details and kept(key).is_file():
                    details[key] = json.loads(kept(key).read_text())
            # the seeds whose proxy and 21-run studies have ended (each run is kept: a later call adds the others)
            have = tuple(s for s in seeds if all(f"{m}/{s}" in details for m in ("proxy", "today")))
            if have:
                details["quality"] = q = cached(f"quality/{'_'.join(map(str, have))}",
                                                lambda: quality(details, have, root / "quality", smoke))
                rows.append(_quality_row(have, q, details["family_build"]))
    return rows, details


def _quality_row(seeds: tuple[int, ...], q: dict[str, Any], build: dict[str, str | None]) -> Row:
    def paired_text(d: dict[str, float] | None) -> str:
        return "-" if d is None else f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"

    diffs = [q[str(s)].get("proxy_minus_today") for s in seeds]
    note = "; ".join(f"study seed {s}: proxy {q[str(s)]['proxy']['mean']:.4f}, 21-run {q[str(s)]['today']['mean']:.4f}"
                     f", paired {paired_text(d)}" for s, d in zip(seeds, diffs, strict=True))
    return make_row(f"the picks re-run on {len(q['trainer_seeds'])} fresh seeds: held-out test, proxy - 21-run method,"
                    f" {SPACE}", "reward", [d["diff"] if d else float("nan") for d in diffs], None, group=GROUP,
                    note=f"{note} (goal: within 0.01 on every seed); family build {build}")


def _cost_rows(seeds: tuple[int, ...], details: dict[str, Any]) -> list[Row]:
    by = {m: [details[f"{m}/{s}"] for s in seeds] for m in ("proxy", "racing", "today")}
    checks = [(d["check"] or {}) for d in by["proxy"]]
    notes = "; ".join(f"seed {s}: proxy {d['runs']:.1f} (split {({k: round(v, 2) for k, v in d['split'].items()})}, "
                      f"ratio {d['ratio']}, check tau {c.get('tau')} holds {c.get('holds')}), racing "
                      f"{r['runs']:.1f}, today {t['runs']:.1f}"
                      for s, d, r, t, c in zip(seeds, by["proxy"], by["racing"], by["today"], checks, strict=True))
    rows = [make_row(f"target full-run equivalents to a confirmed pick, {SPACE}: proxy vs racing on the target",
                     "target runs", [d["runs"] for d in by["proxy"]], [d["runs"] for d in by["racing"]],
                     higher_is_better=False, group=GROUP, note=f"goal <= 3; today's 21-run method "
                     f"{[round(d['runs'], 1) for d in by['today']]}; {notes}"),
            make_row(f"the same with a fresh host's baseline runs, {SPACE}", "target runs",
                     [d["runs_fresh_host"] for d in by["proxy"]], [d["runs_fresh_host"] for d in by["racing"]],
                     higher_is_better=False, group=GROUP, note="goal <= 5")]
    tests = {m: [statistics.fmean(d["pick"]["test_values"]) if d["pick"]["test_values"] else float("nan")
                 for d in by[m]] for m in by}
    rows.append(make_row(f"confirmed pick's held-out test value, proxy vs the 21-run method, {SPACE}", "reward",
                         tests["proxy"], tests["today"], group=GROUP,
                         note=f"per seed {list(seeds)}: proxy {[round(x, 4) for x in tests['proxy']]}, racing "
                              f"{[round(x, 4) for x in tests['racing']]}, today {[round(x, 4) for x in tests['today']]}"
                              " (goal: within 0.01 of today's on every seed)"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.proxy", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="one seed, 3 settings, studies of 3 trials of 4 steps")
    p.add_argument("--workdir", type=Path, default=None, help="keep the runs and studies here")
    p.add_argument("--only", nargs="+", choices=("agreement", "cost", "quality"),
                   default=("agreement", "cost", "quality"))
    p.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS,
                   help="the cost part's studies to run (each kept in --workdir: a later run adds the others)")
    args = p.parse_args(argv)
    rows, details = bench(args.smoke, args.workdir, tuple(args.only), tuple(args.methods))
    for r in rows:
        print(f"{r.name}: {r.ours} vs {r.baseline} {r.unit} [{r.note}]")
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
