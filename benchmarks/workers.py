"""Several workers on one study: wall time of 1 vs 3 ``verl-hpo worker`` processes on one PostgreSQL study.

The trials are the fake trainer's (``tests/hpo/fake_trainer.py``: sleeps per step, no torch), so the row
measures the driver's distributed machinery (slots, heartbeats, storage round trips), not the trainer.
Each side makes a fresh study with ``search --n-trials 1`` and raises its target, then times the workers
until all have exited; sides are interleaved. ``python -m benchmarks.workers [--smoke]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import optuna
import yaml

from benchmarks._common import REPO, Row, interleave, log, main_python, make_row
from benchmarks._results import merge_into

PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
FAKE = REPO / "tests" / "hpo" / "fake_trainer.py"


def _space(work: Path, steps: int) -> Path:
    space = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": steps, "trainer.test_freq": 5, "fake.step_s": 0.1},
        "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 1, "pruner": {"type": "none"}, "heartbeat_interval": 2, "grace_period": 10},
        "trial": {"command": [main_python(), str(FAKE), "train"]},
    }
    path = work / "workers_bench.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def _run(n_workers: int, n_trials: int, space: Path, work: Path) -> float:
    name = f"bench-workers-{uuid.uuid4().hex[:8]}"
    cli = [main_python(), "-m", "hpo"]
    common = ["--storage", PG_URL, "--studies-dir", str(work / "studies")]
    subprocess.run([*cli, "search", "--space", str(space), "--study", name, *common], cwd=REPO, check=True,
                   capture_output=True)
    storage = optuna.storages.RDBStorage(PG_URL)
    try:
        optuna.load_study(study_name=name, storage=storage).set_user_attr("hpo:n_trials", n_trials + 1)
        t0 = time.monotonic()
        procs = [subprocess.Popen([*cli, "worker", "--study", name, *common], cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for _ in range(n_workers)]
        for p in procs:
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"worker exited {p.returncode}: {err.strip().splitlines()[-1:]}")
        wall = time.monotonic() - t0
        done = [t for t in optuna.load_study(study_name=name, storage=storage).trials if t.state.name == "COMPLETE"]
        if len(done) != n_trials + 1:
            raise RuntimeError(f"{len(done)} completed trials, expected {n_trials + 1}")
        return wall
    finally:
        optuna.delete_study(study_name=name, storage=storage)


def bench(smoke: bool = False) -> list[Row]:
    n_trials, steps, reps = (4, 5, 1) if smoke else (12, 20, 3)
    times: dict[str, list[float]] = {"3": [], "1": []}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        work = Path(tmp)
        space = _space(work, steps)
        for rep, label in interleave(reps, ["3", "1"]):
            times[label].append(_run(int(label), n_trials, space, work))
            log(f"workers: rep {rep} {label} worker(s) {times[label][-1]:.1f} s")
    return [make_row(f"3 workers vs 1 on one PostgreSQL study ({n_trials} fake trials of {steps} x 0.1 s)", "s",
                     times["3"], times["1"], higher_is_better=False, group="driver",
                     note="wall time until every worker exited; ratio = speed-up")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workers", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, results under benchmarks/smoke/")
    args = p.parse_args(argv)
    rows = bench(args.smoke)
    for row in rows:
        print(f"{row.name}: 3 workers {row.ours:.1f} s, 1 worker {row.baseline:.1f} s, speed-up {row.ratio:.2f}x "
              f"({row.ratio_min:.2f}-{row.ratio_max:.2f})")
    merge_into(REPO / "benchmarks" / ("smoke" if args.smoke else ""), rows, {}, "python -m benchmarks.workers",
               args.smoke, prefix="3 workers vs 1", part="workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
