"""benchmarks/memory_estimate.py: its cases, and its rows replacing an earlier calibration's in results.json.

Run in a subprocess: inside pytest the name ``benchmarks`` is this test package (tests/benchmarks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = r'''
import json, sys
from pathlib import Path
from benchmarks._common import make_row
from benchmarks.memory_estimate import CASES, GROUP, estimate_gib, merge_into

assert len(CASES) >= 6 and {c.model for c in CASES} == {"tiny", "smollm2"}
for key in ("train_batch_size", "max_response_length", "ppo_micro_batch_size_per_gpu"):
    assert any(key in o for c in CASES for o in c.overrides), key
for case in CASES:  # every case's config loads and has a positive estimate (torch-free arithmetic)
    gib, parts = estimate_gib(case)
    assert gib > 0.4 and parts["total"] > 0, case
assert "torch" not in sys.modules

tmp = Path(sys.argv[1])
other = make_row("ppo_1x1: response tokens/s", "tok/s", [10.0], [5.0], group="trainer")
old = make_row("memory estimate: old case", "GiB", [1.0], [2.0], group=GROUP)
meta = {"machine": {"date": "d", "host": "h", "cpu": "c", "logical_cpus": 2, "memory_gb": 1, "os": "o",
                    "python": "3"}, "load_start": [0], "load_end": [0], "smoke": False, "command": "bench",
        "parts": ["trainer"], "errors": {}, "elapsed_min": 1.0, "versions": {}}
(tmp / "results.json").write_text(json.dumps({"meta": meta, "rows": [other.to_json(), old.to_json()],
                                              "details": {"trainer": {}}}))
new = make_row("memory estimate: tiny_arith", "GiB", [0.5], [0.5], group=GROUP)
merge_into(tmp, [new], {"tiny_arith": {}}, "python -m benchmarks.memory_estimate", smoke=False)
doc = json.loads((tmp / "results.json").read_text())
assert [r["name"] for r in doc["rows"]] == ["ppo_1x1: response tokens/s", "memory estimate: tiny_arith"], doc["rows"]
assert doc["rows"][1]["ratio"] == 1.0 and doc["meta"]["parts"] == ["trainer", "memory"]
assert "trainer" in doc["details"] and "memory" in doc["details"]
md = (tmp / "RESULTS.md").read_text()
assert "memory estimate: tiny_arith" in md and "old case" not in md and "python -m benchmarks.memory_estimate" in md
print("OK")
'''


def test_cases_and_merge(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-3000:]
