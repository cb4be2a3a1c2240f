"""The objective-noise analysis that picks kl_lr's default aggregate and plateau rule (``benchmarks/noise.py``): its
statistics on synthetic values, its choice rule, and that the shipped default is what the recorded runs choose.

Each test body runs in a subprocess: inside pytest the name ``benchmarks`` is this test package (tests/benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRELUDE = """
import json, random
from pathlib import Path
import yaml
from benchmarks import noise
from benchmarks.noise import RULES, CLOSE, choose, reanalyse, split_consistency, summarise
LABELS = ["a", "b", "c", "d"]
SEEDS = list(range(1, 11))
"""


def run(body: str) -> Any:
    """``body`` (after the prelude) in a fresh interpreter with the repo on the path; what it prints, as JSON."""
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_split_consistency_takes_every_split_in_halves_once() -> None:
    out = run("""
        val = {(lab, s): float(i) for i, lab in enumerate(LABELS) for s in SEEDS}  # one ranking on every seed
        rng = random.Random(0)
        noisy = {k: v + rng.gauss(0, 3.0) for k, v in val.items()}  # seed noise larger than the gaps
        print(json.dumps([split_consistency(val, LABELS, SEEDS), split_consistency(noisy, LABELS, SEEDS)]))
    """)
    same, mixed = out
    assert len(same) == 126 and all(x == 1.0 for x in same)  # C(10, 5) / 2: each split once
    assert min(mixed) < 1.0 and -1.0 <= min(mixed) <= max(mixed) <= 1.0


def test_choose_prefers_consistency_among_rules_the_test_agrees_with() -> None:
    out = run("""
        def res(split, vs_test, evals):
            return {n: {"spearman_splits": [split.get(n, 0.5)] * 3, "spearman_vs_test": [vs_test.get(n, 0.5)] * 2,
                        "evals": evals.get(n, 7.0)} for n, _ in RULES}
        last2, best_np = "last, plateau 2 evals", "best, no plateau stop"
        m3p2, m3p3 = "mean of last 3, plateau 2 evals", "mean of last 3, plateau 3 evals"
        r = res(split={best_np: 0.99, m3p3: 0.93, m3p2: 0.90, last2: 0.84},
                vs_test={best_np: 0.55, m3p3: 0.78, m3p2: 0.78, last2: 0.72},
                evals={m3p3: 6.2, m3p2: 5.4, last2: 5.4, best_np: 7.0})
        first = choose(r)
        r[m3p2]["spearman_splits"] = [0.93 - CLOSE / 2] * 3
        print(json.dumps([first, choose(r)]))
    """)
    # the most consistent rule (best, no plateau stop) is out: the held-out test ranking disagrees with it
    assert out[0] == "mean of last 3, plateau 3 evals"
    assert out[1] == "mean of last 3, plateau 2 evals"  # within CLOSE of the top: the cheaper rule wins


def test_summarise_counts_seed_pairs_and_test_agreement() -> None:
    out = run("""
        val = {(lab, s): float(i) + 0.01 * s for i, lab in enumerate(LABELS) for s in SEEDS}
        r = summarise(val, 5.0, LABELS, SEEDS, test_mean=[0.0, 1.0, 2.0, 3.0])
        rev = summarise(val, 5.0, LABELS, SEEDS, test_mean=[3.0, 2.0, 1.0, 0.0])
        print(json.dumps([r["spearman_pairs"], r["spearman_vs_test"], r["spearman_sets"], rev["spearman_vs_test"]]))
    """)
    pairs, vs_test, sets, reversed_test = out
    assert len(pairs) == 45 and all(x == 1.0 for x in pairs)
    assert vs_test == [1.0] * 10 and sets == 1.0 and reversed_test == [-1.0] * 10


def test_the_shipped_default_is_what_the_recorded_runs_choose() -> None:
    """kl_lr.yaml's aggregate and plateau rule are the rule ``choose`` picks from the recorded values in
    benchmarks/results.json: changing either without re-measuring fails here."""
    chosen, rule = run("""
        stored = json.loads(Path("benchmarks/results.json").read_text())["details"]["noise"]
        chosen = reanalyse(stored)["chosen"]
        print(json.dumps([chosen, dict(RULES)[chosen]]))
    """)
    import yaml

    overrides = dict(o.split("=", 1) for o in rule)
    space = yaml.safe_load((REPO / "search_spaces" / "kl_lr.yaml").read_text())
    assert space["objective"]["aggregate"] == overrides["objective.aggregate"], chosen
    assert str(space["objective"].get("k")) == overrides.get("objective.k", "None"), chosen
    plateau = overrides["early_stopping.plateau_evals"]
    assert str(space["early_stopping"]["plateau_evals"]) == ("None" if plateau == "null" else plateau), chosen
