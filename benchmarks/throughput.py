"""Throughput studies (issue 42): the pick of a shipped throughput study against the config a user would run, measured
side by side by ``verl-hpo confirm`` (interleaved ABBA runs, the paired ratio with its 95% interval, the same-math
check), on ``verl_core`` (``search_spaces/throughput_cpu.yaml``) and on real verl 0.9.1 on the CPU
(``search_spaces/verl_throughput_cpu.yaml``; skipped without ``.venv-verl``).

Per experiment, one run of this part:

1. ``search`` the shipped experiment as it is (its ``study.baseline`` is a deliberately poor start: tiny
   micro-batches, gradient checkpointing on) and ``confirm`` it: the pick against that start.
2. The pick against the *shipped learning config* (``tiny_arith`` / ``verl_grpo_cpu``'s values of the same keys): a
   second throughput study whose parameters hold the pick's values only and whose ``study.baseline`` is the shipped
   config, confirmed the same way. This is the honest row: if the shipped config is already near its best on this
   host, it says so.

Rows: the ratio (x, higher is faster) with its interval, the same-math verdict, the number of trials, and the
studies' wall times. Run alone: ``python -m benchmarks.throughput [--smoke] [--workdir DIR] [--only verl_core|verl]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import REPO, Row, hpo_cli, log, make_row

GROUP = "throughput: a throughput study's pick against the user's config"
SPACES = {"verl_core": "throughput_cpu", "verl": "verl_throughput_cpu"}
# the shipped learning runs' values of the tuned keys (verl_core/configs/tiny_arith.yaml; verl_grpo_cpu.yaml with
# verl's default gradient checkpointing)
SHIPPED = {
    "verl_core": {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None,
                  "critic.ppo_micro_batch_size_per_gpu": None,
                  "actor_rollout_ref.model.enable_gradient_checkpointing": False, "trainer.cpu_threads": 0},
    "verl": {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64,
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 64,
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64,
             "actor_rollout_ref.model.enable_gradient_checkpointing": True},
}
# --smoke: the whole path on the fewest runs (2 trials, one confirmation pair, 3 steps of which 1 is warm-up; the
# comparison with the shipped config, the same search and confirmation on another file, left out)
SMOKE = ["study.n_trials=2", "study.throughput.repeats=1", "study.throughput.top_k=1", "trainer.total_training_steps=3"]


def _report(studies: Path, name: str) -> dict[str, Any]:
    """The confirmed study's speed report as plain data."""
    from hpo.reporting._speed import speed_lines, speed_report
    from hpo.study._optuna import load_stored

    space, study = load_stored(name, f"sqlite:///{studies / (name + '.db')}", None)
    report = speed_report(study, space)
    assert report is not None, f"study {name} has no finished run of the user's config"
    top = report.picks[0]
    trials = [t for t in study.get_trials(deepcopy=False) if "hpo:confirm_of" not in t.system_attrs]
    return {"ratio": top.ratio, "low": top.low, "high": top.high, "pairs": top.pairs, "same_math": top.same_math,
            "disagreements": top.disagreements, "params": dict(top.trial.params),
            "settings": {p.key: top.trial.params[p.name] for p in space.params if p.name in top.trial.params},
            "recommended": report.recommended is not None, "search_trials": len(trials),
            "states": sorted({t.state.name for t in trials}), "lines": speed_lines(report, space),
            "skipped_oom": sum(1 for t in trials if t.user_attrs.get("fail_reason") == "predicted_oom")}


def one(backend: str, studies: Path, smoke: bool) -> dict[str, Any]:
    """Search + confirm the shipped experiment, then the pick against the shipped learning config."""
    space = SPACES[backend]
    extra = [a for o in (SMOKE if smoke else []) for a in ("--override", o)]
    t0 = time.monotonic()
    search_s = hpo_cli(["search", "--space", space, "--study", space, *extra], studies)
    confirm_s = hpo_cli(["confirm", "--study", space], studies)
    poor = _report(studies, space)
    log(f"throughput {backend}: pick {poor['params']} {poor['ratio']:.3f}x the poor start")
    if smoke:  # the second study is the same search and confirmation on another file: the smoke runs one
        return {"space": space, "poor": poor, "shipped": None, "search_s": search_s, "confirm_s": confirm_s,
                "shipped_s": 0.0, "wall_s": time.monotonic() - t0}
    # the pick alone (one choice per parameter) against the shipped learning config's values
    raw = yaml.safe_load((REPO / "search_spaces" / f"{space}.yaml").read_text())
    raw["params"] = {n: {"key": p["key"], "type": "categorical", "choices": [poor["params"][n]]}
                     for n, p in raw["params"].items()}
    raw["study"]["n_trials"] = 1
    raw["study"]["baseline"] = SHIPPED[backend]
    raw["study"]["throughput"]["top_k"] = 1
    path = studies / f"{space}_vs_shipped.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    shipped_s = hpo_cli(["search", "--space", str(path)], studies)
    shipped_s += hpo_cli(["confirm", "--study", path.stem], studies)
    shipped = _report(studies, path.stem)
    log(f"throughput {backend}: pick {shipped['ratio']:.3f}x the shipped config")
    return {"space": space, "poor": poor, "shipped": shipped, "search_s": search_s, "confirm_s": confirm_s,
            "shipped_s": shipped_s, "wall_s": time.monotonic() - t0}


def _rows(backend: str, d: dict[str, Any]) -> list[Row]:
    label = {"verl_core": "verl_core (tiny_arith)", "verl": "real verl 0.9.1 on the CPU (verl_grpo_cpu)"}[backend]
    rows = []
    for key, against in (("poor", "a deliberately poor start (the experiment's study.baseline)"),
                         ("shipped", "the shipped learning config")):
        r = d[key]
        if r is None:  # --smoke: the pick against the poor start only
            continue
        ours = [a / b for _, a, b in r["pairs"]]
        interval = "" if r["low"] is None else f" [{r['low']:.3f}, {r['high']:.3f}] (95%, paired)"
        same = "same math: agrees" if r["same_math"] else f"same math: {r['same_math']} {r['disagreements'][:2]}"
        control = next((line for line in r["lines"] if line.startswith("control")), None)
        same += f" ({control.split(': ', 1)[1]})" if control else ""
        rows.append(make_row(
            f"throughput study's pick vs {against}, {label}", "x faster", ours, None, group=GROUP,
            note=f"{r['ratio']:.3f}x{interval} over {len(r['pairs'])} interleaved pair(s); {same}; pick "
                 f"{r['settings']}; " + (f"search {d['poor']['search_trials']} trials {d['poor']['states']} in "
                                         f"{d['search_s'] / 60:.1f} min, confirm {d['confirm_s'] / 60:.1f} min"
                                         if key == "poor" else f"shipped {SHIPPED[backend]}; "
                                         f"{d['shipped_s'] / 60:.1f} min"),
            raw={"report": r}))
    return rows


def bench(smoke: bool, workdir: Path | None = None, backends: tuple[str, ...] = ("verl_core", "verl")
          ) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_throughput_") as tmp:
        studies = (workdir or Path(tmp)) / "studies"
        studies.mkdir(parents=True, exist_ok=True)
        for backend in backends:
            if backend == "verl" and (smoke or not (REPO / ".venv-verl" / "bin" / "python").exists()):
                log("throughput verl: smoke or no .venv-verl (make install-verl): skipped")
                continue
            d = one(backend, studies, smoke)
            (studies / f"throughput_{backend}.json").write_text(json.dumps(d, default=str))
            details[backend] = d
            rows += _rows(backend, d)
    return rows, details


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--only", nargs="+", choices=tuple(SPACES), default=None)
    args = p.parse_args(argv)
    rows, details = bench(args.smoke, args.workdir, tuple(args.only or SPACES))
    for r in rows:
        print(f"{r.name}: {r.note}")
    print(json.dumps({"rows": [r.to_json() for r in rows]}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
