"""The driver's own footprint (issue 23): its peak RSS in the default ``kl_lr`` search, and a worker's time from
its start to its first trial launched. ``python -m benchmarks.footprint [--before DIR] [--reps N] [--smoke]``.

Both sides run the same shipped space (``kl_lr``: the real ``verl_core`` trainer on ``tiny_arith``; trials are
shortened to 6 steps, which does not change what the driver holds: its imports, the storage, the page written every
5 trials) from a checkout each: this one ("after") and ``--before`` (a ``git worktree`` of the commit to compare).
The driver runs under a probe that writes its ``VmHWM`` (peak RSS of its own address space; ``ru_maxrss`` would
inherit the forking parent's) when it exits. The worker's start-up is the time from
its ``Popen`` to the ``command.json`` of its first trial (written right before the trial's spawn), on a study whose
target was raised by one; the model is built before the first measurement, so no side pays for that. Sides are
interleaved.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from benchmarks._common import REPO, Row, log, main_python, make_row
from benchmarks._results import merge_into

PROBE = ("import runpy, sys\nout = sys.argv.pop()\n"
         "try:\n    runpy.run_module('hpo', run_name='__main__')\n"
         "finally:\n    hwm = [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')]\n"
             "    open(out, 'w').write(hwm[0])\n")
SHORT = ["trainer.total_training_steps=6", "trainer.test_freq=3"]


def _env(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo)
    return env


def search_rss(repo: Path, work: Path, name: str, n_trials: int) -> float:
    """MB: the driver's peak RSS over a ``kl_lr`` search of ``n_trials`` short trials."""
    out = work / f"{name}.rss"
    argv = [main_python(), "-c", PROBE, "search", "--space", "kl_lr", "--study", name, "--n-trials", str(n_trials),
            "--studies-dir", str(work / "studies"), *[a for o in SHORT for a in ("--override", o)], str(out)]
    res = subprocess.run(argv, cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"search in {repo} exited {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
    return int(out.read_text()) / 1024


def worker_start(repo: Path, work: Path, name: str) -> float:
    """Seconds from a worker's start to its first trial's spawn (the study's target raised by one)."""
    storage = f"sqlite:///{work / 'studies' / (name + '.db')}"
    study = optuna.load_study(study_name=name, storage=storage)
    target = len(study.trials) + 1  # every trial of the finished search counts (COMPLETE or PRUNED)
    study.set_user_attr("hpo:n_trials", target)
    before = {p.name for p in (work / "studies" / name / "trials").iterdir()}
    t0 = time.time()
    proc = subprocess.Popen([main_python(), "-m", "hpo", "worker", "--study", name, "--studies-dir",
                             str(work / "studies")], cwd=repo, env=_env(repo), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    launched = None
    deadline = time.monotonic() + 600
    while launched is None and time.monotonic() < deadline and proc.poll() is None:
        for d in (work / "studies" / name / "trials").iterdir():
            if d.name not in before and (d / "command.json").is_file():
                launched = (d / "command.json").stat().st_mtime
        time.sleep(0.01)
    _, err = proc.communicate(timeout=900)
    if launched is None:
        raise RuntimeError(f"worker in {repo} launched no trial: {err.strip().splitlines()[-1:]}")
    return launched - t0


def bench(before: Path | None, reps: int, smoke: bool) -> list[Row]:
    sides = {"after": REPO, **({"before": before} if before is not None else {})}
    rss: dict[str, list[float]] = {k: [] for k in sides}
    start: dict[str, list[float]] = {k: [] for k in sides}
    n_trials = 2 if smoke else 6
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        work = Path(tmp)
        subprocess.run([main_python(), "-m", "verl_core", "prepare", "--config", "tiny_arith"], cwd=REPO, check=True,
                       capture_output=True)  # the model is built once, outside every measurement
        for rep in range(reps):
            for side, repo in sides.items():
                name = f"fp-{side}-{rep}"
                log(f"footprint: rep {rep + 1}/{reps} {side}: search")
                rss[side].append(search_rss(repo, work, name, n_trials))
                log(f"footprint: rep {rep + 1}/{reps} {side}: worker start-up")
                start[side].append(worker_start(repo, work, name))
    g = "driver footprint"
    note = f"kl_lr, {n_trials} trials of 6 steps; before = {before}" if before else f"kl_lr, {n_trials} trials"
    return [
        make_row("footprint: driver peak RSS in a kl_lr search (goal <= 150 MB)", "MB", rss["after"], rss.get("before"),
                 higher_is_better=False, group=g, note=note),
        make_row("footprint: worker start -> first trial launched (goal <= 3 s)", "s", start["after"],
                 start.get("before"), higher_is_better=False, group=g, note="kl_lr study with its model built"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None, help="a checkout of the commit to compare with")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    rows = bench(args.before, 1 if args.smoke else args.reps, args.smoke)
    for row in rows:
        print(f"{row.name}: ours {row.ours:.2f} (min {row.ours_min:.2f}, max {row.ours_max:.2f})"
              + (f", before {row.baseline:.2f}" if row.baseline is not None else "") + f" {row.unit}")
    merge_into(REPO / "benchmarks" / ("smoke" if args.smoke else ""), rows, {}, "python -m benchmarks.footprint "
               + " ".join(argv if argv is not None else sys.argv[1:]), args.smoke, prefix="footprint:",
               part="footprint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
