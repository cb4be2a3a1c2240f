"""``python -m benchmarks.run --update DIR``: a re-measured group replaces only its own rows and, for a part run on
some of its tasks, only those tasks' details (run as a subprocess: inside pytest ``benchmarks`` is this package)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "population-based training (default task)"


def test_update_replaces_one_task_and_keeps_the_others(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(REPO / "benchmarks" / "results.json", out / "results.json")
    (out / "RESULTS.md").write_text("")
    base = json.loads((out / "results.json").read_text())
    old_groups = [r["group"] for r in base["rows"]]
    assert DEFAULT in old_groups and set(base["details"]["pbt"]) >= {"default", "noisy"}
    template = next(r for r in base["rows"] if r["group"] == DEFAULT)
    run = tmp_path / "run"
    run.mkdir()
    new_row = {**template, "name": "a re-measured row", "ours": 0.5}
    (run / "results.json").write_text(json.dumps({"meta": base["meta"], "rows": [new_row],
                                                  "details": {"pbt": {"default": {"runs": "new"}}}}))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--update", str(run), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    rows = [r for r in doc["rows"] if r["group"] == DEFAULT]
    assert [r["name"] for r in rows] == ["a re-measured row"]
    assert [r["group"] for r in doc["rows"] if r["group"] != DEFAULT] == [g for g in old_groups if g != DEFAULT]
    assert doc["details"]["pbt"]["default"] == {"runs": "new"}
    assert doc["details"]["pbt"]["noisy"] == base["details"]["pbt"]["noisy"]  # not re-measured: kept
    assert "a re-measured row" in (out / "RESULTS.md").read_text()
