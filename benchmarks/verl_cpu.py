"""Real verl on the CPU (issue 33 item 5): a ``verl_grpo_cpu`` study through the driver, verl 0.9.1's own
``main_ppo`` in ``.venv-verl``; a trial's start-up and step times, and the driver's own cost beside them.

``python -m benchmarks.run --only verl_cpu [--smoke]``: 2 trials of 8 steps (smoke: 1 trial of 4 steps), one at a
time, ``python -m hpo search --space verl_grpo_cpu`` from the repo root in its own session. How each figure is taken:

* trial start-up: from the trial's ``command.json`` mtime (written right before its spawn) to the moment this
  process first sees a complete line (verl's step-0 validation) in the trial's ``metrics.jsonl``, polled every
  0.2 s while the driver runs (so up to 0.2 s late);
* step times: verl's own ``timing_s/*`` in ``metrics.jsonl``; steps >= 2 (step 1 carries the warm-up);
  ``timing_s/testing`` (the validation) is outside verl's ``timing_s/step``, ``save_checkpoint`` inside it;
* trial wall: the Optuna trial's ``datetime_complete - datetime_start`` (ask to tell: its files, spawn, run, exit);
* the driver's CPU seconds: ``resource.getrusage(RUSAGE_SELF)`` (user + sys of the driver process and its threads,
  never its children: trials, the prepare step, verl's config checks) written by :data:`PROBE`, a wrapper that runs
  ``hpo`` with ``runpy`` and reports when it exits; its peak RSS: the ``driver peak RSS N MB`` of its summary;
* the wall it adds outside trials: study wall (spawn to exit) minus the sum of trial walls, split by the moments
  this process saw its stdout lines (its header comes after the config checks, the memory pre-flight and the
  study's creation) and the trials' Optuna times; verl's config checks are also timed apart, in this process,
  before the study (the three calls ``search`` makes, each composing the corners in verl's interpreter).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import optuna

from benchmarks._common import REPO, Row, load_average, log, main_python, make_row, tail

VERL_PY = REPO / ".venv-verl" / "bin" / "python"
SPACE = "verl_grpo_cpu"
GROUP = "verl on the CPU (real verl 0.9.1 main_ppo)"
POLL_S = 0.2
PROBE = ("import json, resource, runpy, sys\nout = sys.argv.pop()\n"
         "try:\n    runpy.run_module('hpo', run_name='__main__')\n"
         "finally:\n    ru = resource.getrusage(resource.RUSAGE_SELF)\n"
         "    open(out, 'w').write(json.dumps({'user_s': ru.ru_utime, 'sys_s': ru.ru_stime}))\n")


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def config_checks(overrides: list[str]) -> dict[str, float]:
    """Seconds of the verl checks ``search`` runs before a study: the space's corners composed by verl
    (``load_space(..., thorough=True)``), the launch check (``check_verl_launch``) and the memory pre-flight."""
    from hpo.backends import check_space_fits, load_space, resolve_devices
    from hpo.backends.verl import check_verl_launch

    t0 = time.perf_counter()
    space = load_space(SPACE, overrides, thorough=True)
    out = {"compose": time.perf_counter() - t0}
    out["launch"] = _timed(lambda: check_verl_launch(space))
    out["preflight"] = _timed(lambda: check_space_fits(space, resolve_devices(space.trial)))
    return out


def _first_line(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    if "\n" not in text:
        return None
    value = json.loads(text.split("\n", 1)[0])
    return value if isinstance(value, dict) else None


def _read_lines(stream: IO[str], into: list[tuple[float, str]]) -> None:
    for line in stream:
        into.append((time.time(), line.rstrip("\n")))


def run_study(studies: Path, n_trials: int, steps: int) -> dict[str, Any]:
    """One ``search`` to completion; what this process saw while it ran (times are ``time.time()``)."""
    trials = studies / SPACE / "trials"
    probe_out = studies / "driver-rusage.json"
    argv = [main_python(), "-c", PROBE, "search", "--space", SPACE, "--studies-dir", str(studies),
            "--n-trials", str(n_trials), "--override", "trial.n_jobs=1",
            "--override", f"trainer.total_training_steps={steps}", str(probe_out)]
    out: list[tuple[float, str]] = []
    err: list[tuple[float, str]] = []
    first_line: dict[str, float] = {}
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    readers = [threading.Thread(target=_read_lines, args=(s, into), daemon=True)
               for s, into in ((proc.stdout, out), (proc.stderr, err))]
    for r in readers:
        r.start()
    deadline = time.monotonic() + n_trials * 1100 + 900  # trial.timeout_s is 900
    while proc.poll() is None and time.monotonic() < deadline:
        for d in trials.iterdir() if trials.is_dir() else ():
            if d.name not in first_line and _first_line(d / "metrics.jsonl") is not None:
                first_line[d.name] = time.time()
        time.sleep(POLL_S)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()
    end = time.time()
    for r in readers:
        r.join(timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(f"verl-hpo search --space {SPACE} exited {proc.returncode}:\n"
                           + tail("\n".join(line for _, line in err)))
    return {"t0": t0, "end": end, "stdout": out, "first_line": first_line,
            "rusage": json.loads(probe_out.read_text())}


def _steps(path: Path) -> dict[int, dict[str, float]]:
    """Per step of verl's file logger (``{"step": N, "data": {...}}``): its timers and the objective (kept in
    the details; verl logs ~100 keys a step)."""
    rows: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            data = rec.get("data", rec)
            rows.setdefault(int(rec["step"]), {}).update(
                {k: v for k, v in data.items() if k.startswith(("timing_s/", "val-core/"))})
    return rows


def bench(smoke: bool) -> tuple[list[Row], dict[str, Any]]:
    if not VERL_PY.exists():
        log(f"verl_cpu: skipped: {VERL_PY} is missing (make install-verl)")
        return [], {"skipped": f"{VERL_PY} missing"}
    n_trials, steps = (1, 4) if smoke else (2, 8)
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-verl-cpu-") as tmp:
        studies = Path(tmp)
        log("verl_cpu: timing verl's config checks")
        checks = config_checks([f"study.n_trials={n_trials}", f"trainer.total_training_steps={steps}"])
        log(f"verl_cpu: {n_trials} real verl trial(s) of {steps} steps through the driver")
        seen = run_study(studies, n_trials, steps)
        study = optuna.load_study(study_name=SPACE, storage=f"sqlite:///{studies / SPACE}.db")
        done = sorted((t for t in study.trials if t.datetime_complete is not None), key=lambda t: t.number)
        per_trial: dict[str, dict[str, Any]] = {}
        for t in done:
            d = studies / SPACE / "trials" / str(t.number)
            assert t.datetime_start is not None and t.datetime_complete is not None
            metrics = d / "metrics.jsonl"
            per_trial[str(t.number)] = {
                "state": t.state.name, "start": t.datetime_start.timestamp(), "end": t.datetime_complete.timestamp(),
                "spawned": (d / "command.json").stat().st_mtime, "first_line": seen["first_line"].get(str(t.number)),
                "first_step": (_first_line(metrics) or {}).get("step"), "steps": _steps(metrics)}
    load_end = load_average()
    return _rows(seen, per_trial, checks, n_trials, steps, f"load {load_start} -> {load_end}"), {
        "trials": per_trial, "config_checks_s": checks, "driver_rusage": seen["rusage"],
        "stdout": [[round(t - seen["t0"], 2), line] for t, line in seen["stdout"]], "load_start": load_start,
        "load_end": load_end, "study_wall_s": seen["end"] - seen["t0"]}


def _line_time(seen: dict[str, Any], pattern: str) -> float | None:
    return next((t for t, line in seen["stdout"] if re.search(pattern, line)), None)


def _rows(seen: dict[str, Any], per_trial: dict[str, dict[str, Any]], checks: dict[str, float], n_trials: int,
          steps: int, load: str) -> list[Row]:
    trials = list(per_trial.values())
    if not trials:
        raise RuntimeError("the study finished no trial")
    startup = [t["first_line"] - t["spawned"] for t in trials if t["first_line"] is not None]
    later = [s for t in trials for n, s in t["steps"].items() if n >= 2 and "timing_s/step" in s]
    step_s = [s["timing_s/step"] for s in later]
    gen_share = [100 * s["timing_s/gen"] / s["timing_s/step"] for s in later if "timing_s/gen" in s]
    first = [t["steps"][1]["timing_s/step"] for t in trials if "timing_s/step" in t["steps"].get(1, {})]
    testing = [s["timing_s/testing"] for t in trials for s in t["steps"].values() if "timing_s/testing" in s]
    walls = [t["end"] - t["start"] for t in trials]
    study_wall = seen["end"] - seen["t0"]
    header = _line_time(seen, r"^study \S+: \d+/\d+ finished trials")
    peak = re.search(r"driver peak RSS (\d+) MB", "\n".join(line for _, line in seen["stdout"]))
    ru = seen["rusage"]
    ordered = sorted(trials, key=lambda t: t["start"])
    between = sum(b["start"] - a["end"] for a, b in zip(ordered, ordered[1:]))
    outside = study_wall - sum(walls)
    split = (f"start-up to its header line {header - seen['t0']:.1f} s, header to trial 0's start (prepare step) "
             f"{ordered[0]['start'] - header:.1f} s, " if header is not None else "") + \
        f"between trials {between:.1f} s, last trial's end to exit {seen['end'] - ordered[-1]['end']:.1f} s"
    what = f"{len(trials)} trial(s) of {steps} steps, n_jobs 1; {load}"
    g = GROUP
    return [
        make_row("verl CPU: trial start-up (spawn -> step-0 metrics line)", "s", startup, higher_is_better=False,
                 group=g, note=f"command.json mtime to the first metrics line, seen by polling the file every "
                               f"{POLL_S} s (Ray, workers, vLLM server, step-0 validation of 225 prompts); {what}"),
        make_row("verl CPU: time per step (timing_s/step, steps >= 2)", "s", step_s, higher_is_better=False,
                 group=g, note=f"verl's own timer, all steps >= 2 of all trials (step 4 and the last save a "
                               f"checkpoint inside it; validation is outside); {what}"),
        make_row("verl CPU: rollout share of a step (timing_s/gen / timing_s/step)", "%", gen_share,
                 group=g, note=f"per step, steps >= 2 (vLLM's CPU build; verl's replay buffer polls every 2 s); "
                               f"{what}"),
        make_row("verl CPU: first step (timing_s/step, step 1)", "s", first, higher_is_better=False, group=g,
                 note=f"step 1 alone (warm-up); {what}"),
        make_row("verl CPU: validation (timing_s/testing, 225 prompts)", "s", testing, higher_is_better=False,
                 group=g, note=f"every validation after step 0 (test_freq 2), outside timing_s/step; {what}"),
        make_row("verl CPU: trial wall (Optuna datetime_complete - datetime_start)", "s", walls,
                 higher_is_better=False, group=g, note=f"ask to tell: files, spawn, training, exit; {what}"),
        make_row("driver: CPU seconds of its own process (user+sys)", "s", [ru["user_s"] + ru["sys_s"]],
                 higher_is_better=False, group=g,
                 note=f"getrusage(RUSAGE_SELF) at its exit (a runpy wrapper): the driver and its threads, not its "
                      f"children; user {ru['user_s']:.1f} s, sys {ru['sys_s']:.1f} s over a study wall of "
                      f"{study_wall:.0f} s; {what}"),
        make_row("driver: peak RSS (its summary line)", "MB", [float(peak.group(1))] if peak else None,
                 higher_is_better=False, group=g, note=f"'driver peak RSS N MB' (VmHWM of the driver); {what}"),
        make_row("driver: wall outside trials (study wall - sum of trial walls)", "s", [outside],
                 higher_is_better=False, group=g, note=f"{split}; {what}"),
        make_row("driver: verl config checks before a study (timed apart)", "s", [sum(checks.values())],
                 higher_is_better=False, group=g,
                 note=f"in the benchmark process before the study, the calls search makes: corners composed by verl "
                      f"{checks['compose']:.1f} s, launch check {checks['launch']:.1f} s, memory pre-flight "
                      f"{checks['preflight']:.1f} s (each a subprocess in verl's interpreter); {load}"),
    ]
