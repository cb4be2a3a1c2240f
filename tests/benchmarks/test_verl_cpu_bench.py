"""``benchmarks/verl_cpu.py`` (``python -m benchmarks.run --only verl_cpu``): the rows of a recorded study have the
numbers it implies; without ``.venv-verl`` the part is skipped with a logged reason and no rows.

Run in subprocesses: inside pytest the name ``benchmarks`` is this test package (tests/benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def test_rows_from_a_recorded_study_have_the_known_numbers(tmp_path: Path) -> None:
    """The part's arithmetic on a recorded study with known answers (the real run is ``make bench``'s: real verl
    trials already run in ``tests/hpo/backends/verl/test_real.py``, and CI's budget has no room for a third copy)."""
    code = """
import json, sys
import benchmarks.verl_cpu as v
step = lambda total, gen: {"timing_s/step": total, "timing_s/gen": gen}
trial = {"state": "COMPLETE", "start": 100.0, "end": 400.0, "spawned": 101.0, "first_line": 191.0, "first_step": 0,
         "steps": {0: {}, 1: step(12.0, 6.0), 2: step(6.0, 4.0), 3: step(4.0, 2.0), 4: {**step(5.0, 4.0),
                   "timing_s/testing": 9.0}}}
seen = {"t0": 40.0, "end": 410.0, "rusage": {"user_s": 7.0, "sys_s": 5.0},
        "stdout": [[60.0, "study verl_grpo_cpu: 0/1 finished trials; storage x"], [405.0, "driver peak RSS 95 MB"]]}
rows = v._rows(seen, {"0": trial}, {"compose": 18.0, "launch": 17.0, "preflight": 19.0}, 1, 4, "load x")
print(json.dumps({r.name: [r.ours, r.repetitions] for r in rows}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {name.split(" (")[0]: value for name, value in json.loads(proc.stdout).items()}
    assert rows["verl CPU: trial start-up"] == [90.0, 1]  # spawned at 101, step 0 seen at 191
    assert rows["verl CPU: time per step"] == [5.0, 3]  # median of steps 2-4 (6, 4, 5); step 1 is warm-up
    assert rows["verl CPU: rollout share of a step"][0] == pytest.approx(66.67, abs=0.01)  # median of 67, 50, 80
    assert rows["verl CPU: first step"] == [12.0, 1] and rows["verl CPU: trial wall"] == [300.0, 1]
    assert rows["driver: CPU seconds of its own process"] == [12.0, 1] and rows["driver: peak RSS"] == [95.0, 1]
    assert rows["driver: wall outside trials"] == [70.0, 1]  # a 370 s study around a 300 s trial
    assert rows["driver: verl config checks before a study"] == [54.0, 1]


def test_without_the_verl_venv_the_part_is_skipped_with_no_rows(tmp_path: Path) -> None:
    code = ("import sys\nfrom pathlib import Path\nimport benchmarks.verl_cpu as v\n"
            "v.VERL_PY = Path(sys.argv[1]) / 'no-venv' / 'bin' / 'python'\n"
            "rows, details = v.bench(smoke=True)\nassert rows == [] and 'missing' in details['skipped'], details\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verl_cpu: skipped:" in proc.stderr and "make install-verl" in proc.stderr
