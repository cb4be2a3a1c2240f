"""``benchmarks/verl_cpu.py`` (``python -m benchmarks.run --only verl_cpu``): real verl 0.9.1 trials on the CPU
through the driver give rows with positive numbers; without ``.venv-verl`` the part is skipped with a logged reason
and no rows.

Run in subprocesses: inside pytest the name ``benchmarks`` is this test package (tests/benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERL_PY = REPO / ".venv-verl" / "bin" / "python"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
EXPECTED = ("verl CPU: trial start-up", "verl CPU: time per step", "verl CPU: rollout share of a step",
            "verl CPU: trial wall", "driver: CPU seconds of its own process", "driver: peak RSS",
            "driver: wall outside trials", "driver: verl config checks")


@pytest.mark.timeout(1800)
@pytest.mark.slow  # one real verl trial: ~90 s of start-up, 4 steps, 3 validations, and the config checks
@pytest.mark.skipif(not VERL_PY.exists(), reason="needs .venv-verl (make install-verl)")
def test_smoke_run_records_a_real_verl_trial_and_the_driver_beside_it(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "benchmarks.run", "--smoke", "--only", "verl_cpu", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=1750)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert not doc["meta"]["errors"]
    rows = {r["name"]: r for r in doc["rows"]}
    for prefix in EXPECTED:
        row = next((r for n, r in rows.items() if n.startswith(prefix)), None)
        assert row is not None, (prefix, list(rows))
        assert row["ours"] is not None and row["ours"] > 0, row
        assert row["group"] == "verl on the CPU (real verl 0.9.1 main_ppo)" and "load" in row["note"], row
    per_step = next(r for n, r in rows.items() if n.startswith("verl CPU: time per step"))
    assert per_step["repetitions"] == 3  # steps 2, 3 and 4 of the one trial
    trial = doc["details"]["verl_cpu"]["trials"]["0"]
    assert trial["state"] == "COMPLETE" and trial["first_step"] == 0
    assert rows["driver: peak RSS (its summary line)"]["ours"] < 1000  # the driver, not verl's processes


def test_without_the_verl_venv_the_part_is_skipped_with_no_rows(tmp_path: Path) -> None:
    code = ("import sys\nfrom pathlib import Path\nimport benchmarks.verl_cpu as v\n"
            "v.VERL_PY = Path(sys.argv[1]) / 'no-venv' / 'bin' / 'python'\n"
            "rows, details = v.bench(smoke=True)\nassert rows == [] and 'missing' in details['skipped'], details\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verl_cpu: skipped:" in proc.stderr and "make install-verl" in proc.stderr
