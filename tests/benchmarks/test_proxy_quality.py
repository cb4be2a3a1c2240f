"""``benchmarks.proxy``'s quality part: each study seed's picks re-run on the same fresh trainer seeds, a pick two
methods share run once, the difference paired seed by seed, the result kept. The target's runs are stood in for (a
full run of the large model is ~1.5 min): what is tested is which runs are made and how they are compared. Runs in a
fresh interpreter with the repo on the path (``tests/benchmarks`` shadows the ``benchmarks`` package here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from benchmarks import noise, proxy

work = Path(sys.argv[1])
calls = []

def fake_run(label, kl, lr, seed, extra, runs_dir):
    calls.append([kl, lr, seed, extra])
    # a seed effect both settings share (what the pairing removes) and the setting's own effect
    return SimpleNamespace(test=0.8 + 0.01 * (seed % 7) + (0.02 if lr < 1e-5 else 0.0))

noise.run_one = fake_run
(work / "results").mkdir()
for key, (kl, lr) in {"proxy_0": (0.041, 3.6e-5), "today_0": (0.064, 4.8e-6), "racing_0": (0.064, 4.8e-6)}.items():
    pick = {"params": {"kl_coef": kl, "actor_lr": lr}, "values": [], "test_values": []}
    (work / "results" / f"{key}.json").write_text(json.dumps({"pick": pick}))
rows, details = proxy.bench(False, work, ("quality",))
first = list(calls)
calls.clear()
proxy.bench(False, work, ("quality",))
print(json.dumps({"calls": first, "again": calls, "seeds": proxy.QUALITY_SEEDS, "target": proxy.TARGET,
                  "key": proxy.MODEL_KEY, "quality": details["quality"],
                  "rows": [[r.name, r.ours, r.note] for r in rows]}))
"""


def test_quality_reruns_each_pick_on_the_fresh_seeds_and_pairs_them(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    seeds = out["seeds"]
    assert not set(seeds) & {1, 1000, 1001, 1002}  # neither the search's trainer seed nor a confirmation's
    # two distinct settings (racing and the 21-run method picked the same), each once per fresh seed, on the target
    assert sorted((kl, lr, s) for kl, lr, s, _ in out["calls"]) == sorted(
        [(0.041, 3.6e-5, s) for s in seeds] + [(0.064, 4.8e-6, s) for s in seeds])
    assert all(f"{out['key']}={out['target']}" in extra for *_, extra in out["calls"])
    q = out["quality"]["0"]
    assert all(abs(t - (0.82 + 0.01 * (s % 7))) < 1e-9 for t, s in zip(q["today"]["tests"], seeds, strict=True))
    d = q["proxy_minus_today"]  # every seed's difference is -0.02: a zero-width interval
    assert abs(d["diff"] + 0.02) < 1e-9 and abs(d["low"] - d["diff"]) < 1e-9 and abs(d["high"] - d["diff"]) < 1e-9
    ((name, ours, note),) = out["rows"]
    assert f"re-run on {len(seeds)} fresh seeds" in name and abs(ours + 0.02) < 1e-9 and "paired -0.0200" in note
    assert out["again"] == []  # kept: a second call reads the result instead of running again
