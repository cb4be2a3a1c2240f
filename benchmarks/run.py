"""``python -m benchmarks.run [--smoke] [--only NAME ...] [--skip-trl] [--out DIR]``: run the benchmarks and
write ``RESULTS.md`` (a table with machine, date, versions, load and commands) and ``results.json`` (raw rows).

Parts (``--only``): ``trainer`` (ours vs TRL), ``overhead``, ``pruning``, ``search``, ``noise`` (driver items 2-5),
``rollout`` (HF vs vLLM), ``memory`` (memory estimate vs measured peak; ``benchmarks/memory_estimate.py``, also
runnable alone), ``workers`` (3 vs 1 ``verl-hpo worker`` on one PostgreSQL study; ``benchmarks/workers.py``),
``footprint`` (the driver's peak RSS in a ``kl_lr`` search and a worker's start-up to its first trial;
``--before DIR`` compares with another checkout; ``benchmarks/footprint.py``), ``pays`` (the kl_lr study's confirmed
pick against its baseline on the held-out test split, over 3 study seeds; ``benchmarks/pays.py``), ``search_cost``
(full-run equivalents to a confirmed pick: today's method against successive halving with racing confirmation, on
kl_lr and kl_lr_clip over 3 study seeds; ``benchmarks/search_cost.py``), ``search_cost_verl`` (the racing method on
real verl on the CPU, one study seed), ``proxy`` (model-size fidelity: kl_lr_proxy's search on the small tiny_arith
model against racing and the 21-run method on the large one, and the two models' rank agreement on 8 settings;
``benchmarks/proxy.py``), ``pbt``
(population-based training vs TPE and random at equal trainer steps; ``benchmarks/pbt.py``), ``verl_cpu`` (real
verl 0.9.1 trials on the CPU through the driver: start-up, step times, the driver's own CPU, RSS and wall beside
them; skipped without ``.venv-verl``; ``benchmarks/verl_cpu.py``), ``rehearse`` (``verl-hpo rehearse`` of the shipped
CPU and GPU verl experiments on the CPU: each one's wall, the time before the first launch, each corner;
``benchmarks/rehearse.py``), ``throughput`` (a throughput study's pick against a poor start and against the shipped
config, on verl_core and real verl on the CPU; ``benchmarks/throughput.py``), ``verl_ray`` (the same real verl
trial as a Ray job on a local cluster of logical GPUs and as a local subprocess: walls and the driver's CPU;
``benchmarks/verl_ray.py``).
``--smoke`` = one repetition, tiny sizes, written to ``benchmarks/smoke/`` (or ``--out``), never over the real
results.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Row, all_versions, load_average, log, machine
from benchmarks._results import render

PARTS = ("trainer", "overhead", "pruning", "search", "noise", "rollout", "memory", "workers", "footprint", "pays",
         "search_cost", "search_cost_verl", "proxy", "pbt", "verl_cpu", "rehearse", "throughput", "verl_ray")


def _rows(doc: dict[str, Any]) -> list[Row]:
    return [Row(**r) for r in doc["rows"]]


def merge(dirs: list[Path], out_dir: Path) -> int:
    """One RESULTS.md/results.json from several runs' results.json (rows concatenated in the given order)."""
    docs = [json.loads((d / "results.json").read_text()) for d in dirs]
    meta = dict(docs[0]["meta"])
    meta["command"] = "\n".join(d["meta"]["command"] for d in docs) + "\npython -m benchmarks.run --merge " + \
        " ".join(str(d) for d in dirs)
    meta["load_start"] = " / ".join(str(d["meta"]["load_start"]) for d in docs)
    meta["load_end"] = " / ".join(str(d["meta"]["load_end"]) for d in docs)
    meta["elapsed_min"] = max(d["meta"]["elapsed_min"] for d in docs)
    meta["errors"] = {k: v for d in docs for k, v in d["meta"].get("errors", {}).items()}
    meta["parts"] = [p for d in docs for p in d["meta"]["parts"]]
    appendix = REPO / "benchmarks" / "PROFILE.md"
    if not meta["smoke"] and appendix.exists():
        meta["appendix"] = appendix.read_text()
    rows = [r for d in docs for r in _rows(d)]
    details = {k: v for d in docs for k, v in d.get("details", {}).items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(
        {"meta": meta, "rows": [r.to_json() for r in rows], "details": details}, indent=1, default=str) + "\n")
    (out_dir / "RESULTS.md").write_text(render(rows, meta))
    log(f"merged {len(dirs)} runs into {out_dir / 'RESULTS.md'}")
    return 1 if meta["errors"] else 0


def update(dirs: list[Path], out_dir: Path, notes: dict[str, str] | None = None) -> int:
    """``out_dir``'s results with the groups measured in ``dirs`` replaced (each new group's rows where the old
    ones stood, groups it did not have at the end), their details replaced, and a line per run saying what was
    measured again, when and under what load. ``notes``: a paragraph shown under a group's table."""
    base = json.loads((out_dir / "results.json").read_text())
    meta, rows, details = base["meta"], _rows(base), base.get("details", {})
    for d in dirs:
        doc = json.loads((d / "results.json").read_text())
        new = _rows(doc)
        groups = list(dict.fromkeys(r.group for r in new))
        merged: list[Row] = []
        placed: set[str] = set()
        for r in rows:
            if r.group not in groups:
                merged.append(r)
            elif r.group not in placed:  # the new group's rows where its old ones began
                merged += [n for n in new if n.group == r.group]
                placed.add(r.group)
        rows = merged + [n for n in new if n.group not in placed]
        for part, det in doc.get("details", {}).items():  # one level deep: a part run for some of its tasks
            if isinstance(det, dict) and isinstance(details.get(part), dict):  # (pbt --pbt-tasks default) keeps
                details[part] = {**details[part], **det}                      # the others' details
            else:
                details[part] = det
        m = doc["meta"]
        meta.setdefault("updates", []).append({"date": m["machine"]["date"], "load_start": m["load_start"],
                                               "load_end": m["load_end"], "elapsed_min": m["elapsed_min"],
                                               "command": m["command"], "groups": groups})
        meta["errors"] = {**meta.get("errors", {}), **m.get("errors", {})}
    meta.setdefault("group_notes", {}).update(notes or {})
    (out_dir / "results.json").write_text(json.dumps(
        {"meta": meta, "rows": [r.to_json() for r in rows], "details": details}, indent=1, default=str) + "\n")
    (out_dir / "RESULTS.md").write_text(render(rows, meta))
    log(f"updated {out_dir / 'RESULTS.md'} with {len(dirs)} runs")
    return 1 if meta["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="one repetition, tiny sizes, results under benchmarks/smoke/")
    p.add_argument("--only", nargs="+", choices=PARTS, default=None, help="run only these parts")
    p.add_argument("--before", type=Path, default=None,
                   help="footprint: a checkout of an earlier commit to compare the driver's footprint with")
    p.add_argument("--skip-trl", action="store_true", help="trainer rows without the TRL side")
    p.add_argument("--cases", nargs="+", default=None, help="trainer cases to run (ppo_1x1 ppo_4x4 grpo; default all)")
    p.add_argument("--skip-vllm", action="store_true", help="rollout rows without the vLLM engine")
    p.add_argument("--reps", type=int, default=None, help="trainer repetitions (default 5; smoke 1)")
    p.add_argument("--steps", type=int, default=None, help="trainer steps per run incl. warm-up (default 7; smoke 2)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default benchmarks/ or benchmarks/smoke/)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="pays, pbt: keep their studies here (e.g. to run verl-hpo best on them afterwards)")
    p.add_argument("--pbt-tasks", nargs="+", default=None, metavar="TASK",
                   help="pbt: the tasks to compare on (default all: default late noisy late_noise)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DIR",
                   help="combine the results.json of earlier runs (e.g. parts run separately) into --out")
    p.add_argument("--update", nargs="+", type=Path, default=None, metavar="DIR",
                   help="replace the groups measured in these runs' results.json in --out's (default benchmarks/)")
    p.add_argument("--group-note", nargs=2, action="append", default=[], metavar=("GROUP", "FILE"),
                   help="with --update: FILE's text under GROUP's table")
    p.add_argument("--reuse-studies", type=Path, default=None, metavar="RESULTS_JSON",
                   help="search/pruning: take the studies of RESULTS_JSON's details.driver.search instead of running "
                        "them, except those of --rerun (e.g. after a change to one sampler)")
    p.add_argument("--rerun", nargs="+", default=[], metavar="KIND",
                   help="with --reuse-studies: the study kinds run again (random, tpe, gp, tpe_off)")
    args = p.parse_args(argv)
    if args.reuse_studies is not None:
        from benchmarks import driver as _driver

        stored = json.loads(args.reuse_studies.read_text())["details"]["driver"]["search"]
        _driver.REUSE.update({k: v for k, v in stored.items() if k.rsplit("_", 1)[0] not in args.rerun})
    if args.update:
        return update(args.update, args.out or REPO / "benchmarks",
                      {g: Path(f).read_text().strip() for g, f in args.group_note})
    if args.merge:
        return merge(args.merge, args.out or REPO / "benchmarks")
    out_dir = args.out or (REPO / "benchmarks" / ("smoke" if args.smoke else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = tuple(args.only or PARTS)
    t0 = time.time()
    meta: dict[str, Any] = {"machine": machine(), "load_start": load_average(), "smoke": args.smoke,
                            "command": "python -m benchmarks.run " + shlex.join(argv if argv is not None
                                                                                 else sys.argv[1:]),
                            "parts": parts, "errors": {}}
    rows: list[Row] = []
    details: dict[str, Any] = {}

    def attempt(name: str, fn: Any) -> None:
        try:
            res = fn()
            if isinstance(res, tuple):
                rows.extend(res[0])
                details[name] = res[1]
            else:
                rows.extend(res)
        except Exception as err:  # one failing part must not lose the others' results
            log(f"{name} failed: {err}")
            meta["errors"][name] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err) else ''}"
            details[f"{name}_traceback"] = traceback.format_exc()

    if "trainer" in parts:
        from benchmarks import trainer_vs_trl

        reps = args.reps or (1 if args.smoke else 5)
        steps = args.steps or (2 if args.smoke else 7)
        def partial(done: list[Row], det: dict[str, Any]) -> None:  # survives an interrupted long run
            (out_dir / "results.partial.json").write_text(json.dumps(
                {"meta": meta, "rows": [r.to_json() for r in done], "details": {"trainer": det}}, default=str))

        attempt("trainer", lambda: trainer_vs_trl.bench(reps, steps, args.smoke, args.skip_trl,
                                                        cases=tuple(args.cases) if args.cases else None,
                                                        on_case=partial))
    driver_parts = tuple(x for x in ("overhead", "pruning", "search", "noise") if x in parts)
    if driver_parts:
        from benchmarks import driver

        attempt("driver", lambda: driver.bench(args.smoke, parts=driver_parts))
    if "rollout" in parts:
        from benchmarks import rollout

        attempt("rollout", lambda: rollout.bench(args.smoke, skip_vllm=args.skip_vllm))
    if "workers" in parts:
        from benchmarks import workers

        attempt("workers", lambda: workers.bench(args.smoke))
    if "footprint" in parts:
        from benchmarks import footprint

        attempt("footprint", lambda: footprint.bench(args.before, 1 if args.smoke else 3, args.smoke))
    if "pays" in parts:
        from benchmarks import pays

        attempt("pays", lambda: pays.bench(args.smoke, args.workdir))
    if "search_cost" in parts:
        from benchmarks import search_cost

        attempt("search_cost", lambda: search_cost.bench(args.smoke, args.workdir))
    if "search_cost_verl" in parts:
        from benchmarks import search_cost

        attempt("search_cost_verl", lambda: search_cost.bench_verl(args.smoke, args.workdir))
    if "proxy" in parts:
        from benchmarks import proxy

        attempt("proxy", lambda: proxy.bench(args.smoke, args.workdir))
    if "pbt" in parts:
        from benchmarks import pbt

        attempt("pbt", lambda: pbt.bench(args.smoke, args.workdir, tuple(args.pbt_tasks or pbt.TASKS)))
    if "verl_cpu" in parts:
        from benchmarks import verl_cpu

        attempt("verl_cpu", lambda: verl_cpu.bench(args.smoke))
    if "verl_ray" in parts:
        from benchmarks import verl_ray

        attempt("verl_ray", lambda: verl_ray.bench(args.smoke))
    if "rehearse" in parts:
        from benchmarks import rehearse

        attempt("rehearse", lambda: rehearse.bench(args.smoke))
    if "throughput" in parts:
        from benchmarks import throughput

        attempt("throughput", lambda: throughput.bench(args.smoke, args.workdir))
    if "memory" in parts:
        from benchmarks import memory_estimate

        attempt("memory", lambda: memory_estimate.bench(args.smoke))
    meta["versions"] = all_versions()
    meta["load_end"] = load_average()
    meta["elapsed_min"] = (time.time() - t0) / 60
    appendix = REPO / "benchmarks" / "PROFILE.md"
    if not args.smoke and appendix.exists():
        meta["appendix"] = appendix.read_text()
    (out_dir / "results.json").write_text(json.dumps(
        {"meta": meta, "rows": [r.to_json() for r in rows], "details": details}, indent=1, default=str) + "\n")
    (out_dir / "RESULTS.md").write_text(render(rows, meta))
    (out_dir / "results.partial.json").unlink(missing_ok=True)
    log(f"wrote {out_dir / 'RESULTS.md'} and {out_dir / 'results.json'} ({meta['elapsed_min']:.1f} min)")
    return 1 if meta["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
