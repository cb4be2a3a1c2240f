"""The results files: ``RESULTS.md`` rendered from the rows (:func:`render`) and a part run alone merged into an
existing ``results.json`` (:func:`merge_into`). Below ``run`` and the parts, so that neither imports the other for
them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks._common import Row, all_versions, load_average, machine


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None or v != v:
        return "–"
    if unit == "%":
        return f"{v:.1f}"
    a = abs(v)
    return f"{v:.3g}" if a < 1000 else f"{v:,.0f}"


def _spread(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return ""
    return f" ({_fmt(lo)}–{_fmt(hi)})"


def render(rows: list[Row], meta: dict[str, Any]) -> str:
    m = meta["machine"]
    out = ["# verl-hpo benchmarks", "",
           f"Measured {m['date']} on `{m['host']}`: {m['cpu']}, {m['logical_cpus']} logical CPUs, "
           f"{m['memory_gb']} GB RAM, {m['os']}, Python {m['python']}. No GPU unless stated.", "",
           f"Load average (1/5/15 min) at start {meta['load_start']}, at end {meta['load_end']} (the benchmark's "
           "own processes count: about 1 means nothing else ran). Absolute times drift on a shared VM; ratios of "
           "interleaved repetitions are the figures to quote.", "",
           f"Mode: {'SMOKE (1 repetition, tiny sizes: not results)' if meta['smoke'] else 'full'}; "
           f"total time {meta['elapsed_min']:.1f} min.", "",
           "Each cell: median over interleaved repetitions (min–max). Ratio = ours / baseline, oriented so that "
           "**> 1 means ours is better** (for seconds and GB it is baseline / ours); its min–max are over the "
           "per-repetition ratios.", ""]
    for u in meta.get("updates", []):
        out += [f"Groups measured again {u['date']} (load {u['load_start']} -> {u['load_end']}, "
                f"{u['elapsed_min']:.1f} min; `{u['command']}`): " + ", ".join(f"\"{g}\"" for g in u["groups"]) + ".",
                ""]
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.group or "other", []).append(r)
    for g, rs in groups.items():
        out += [f"## {g}", "", "| metric | unit | ours | baseline | ratio | reps | note |",
                "|---|---|---|---|---|---|---|"]
        for r in rs:
            out.append(f"| {r.name} | {r.unit} | {_fmt(r.ours, r.unit)}{_spread(r.ours_min, r.ours_max)} | "
                       f"{_fmt(r.baseline, r.unit)}{_spread(r.baseline_min, r.baseline_max)} | "
                       f"{_fmt(r.ratio)}{_spread(r.ratio_min, r.ratio_max)} | {r.repetitions} | {r.note} |")
        out.append("")
        if meta.get("group_notes", {}).get(g):
            out += [meta["group_notes"][g], ""]
    if meta.get("errors"):
        out += ["## errors", ""] + [f"- `{k}`: {v}" for k, v in meta["errors"].items()] + [""]
    out += ["## versions", ""]
    for env, vs in meta["versions"].items():
        out.append(f"- {env}: " + ", ".join(f"{k} {v}" for k, v in vs.items()))
    out += ["", "## commands", "", "```", meta["command"], "```", "",
            "Ours: `.venv/bin/python -m verl_core train --config tiny_arith <overrides>` (the overrides of each "
            "row are in `benchmarks/trainer_vs_trl.py::our_overrides`); TRL PPO: `.venv-bench-trl112/bin/python "
            "benchmarks/trl_ppo_script.py`; TRL GRPO: `.venv-bench-trl116/bin/python benchmarks/trl_grpo_script.py`; "
            "driver: `.venv/bin/python -m hpo search --space kl_lr --override ...` (see `benchmarks/driver.py`). "
            "Raw per-repetition numbers: `results.json`.", ""]
    if meta.get("appendix"):
        out += [meta["appendix"], ""]
    return "\n".join(out)


def merge_into(out_dir: Path, rows: list[Row], details: dict[str, Any], command: str, smoke: bool,
               prefix: str = "memory estimate:", part: str = "memory") -> None:
    """Replace the rows named ``prefix...`` of ``out_dir/results.json`` (kept otherwise) with ``rows``, file
    ``details`` under ``part``, and re-render RESULTS.md (the parts run alone: ``memory_estimate``, ``workers``,
    ``footprint``)."""
    path = out_dir / "results.json"
    if path.exists():
        doc = json.loads(path.read_text())
    else:
        doc = {"meta": {"machine": machine(), "load_start": load_average(), "smoke": smoke, "command": "",
                        "parts": [], "errors": {}, "elapsed_min": 0.0, "versions": all_versions()},
               "rows": [], "details": {}}
    meta = doc["meta"]
    kept = [Row(**r) for r in doc["rows"] if not r["name"].startswith(prefix)]
    meta["command"] = "\n".join(x for x in (meta.get("command", ""), command) if x)
    meta["parts"] = [p for p in meta.get("parts", []) if p != part] + [part]
    doc["details"] = {**doc.get("details", {}), part: {**details, "load_average_end": load_average()}}
    all_rows = kept + rows
    doc["rows"] = [r.to_json() for r in all_rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out_dir / "RESULTS.md").write_text(render(all_rows, meta))
