"""The real-verl stages of ``benchmarks/gpu_check.py`` (its module docstring, item 7): REAL verl 0.9.1 through the
driver, as a user runs it: the study that is SIGTERMed and resumed, two trials at once, the memory estimate against
the GPU's peak; in a dry run, the plan and ``python -m hpo validate`` with verl on the CPU. The rows are judged in
``benchmarks/gpu_check_rows.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_rows import (
    Check,
    Interrupted,
    MemoryFacts,
    Pair,
    Plan,
    TrialFacts,
    failed_check,
    guarded_check,
    last_line_of,
    memory_row,
    pair_row,
    resume_row,
    study_row,
)

REPO = Path(__file__).resolve().parents[1]
VERL_SPACE = "verl_grpo_gsm8k"
VERL_STUDY = "gpu-check-verl"  # SIGTERMed and resumed: rows verl study, verl SIGTERM + resume, verl memory estimate
PAIR_STUDY = "gpu-check-verl-pair"  # row verl two trials at once
VERL_STEPS = 4  # a trial of the resumed study: a checkpoint after every step, validation (the objective) at the last
PAIR_STEPS = 2
GPU_VERL_VENV = REPO / ".venv-gpu-verl"  # make gpu-check: verl[vllm]==0.9.1 (CUDA torch, vLLM) in a venv of its own
DRY_VERL_VENV = REPO / ".venv-verl"  # make install-verl: CPU verl 0.9.1, enough to compose and validate


def verl_space_overrides(work: Path, model_dir: Path, verl_python: str, n_trials: int, steps: int = VERL_STEPS,
                         save_freq: int = 1, n_jobs: int = 1) -> list[str]:
    """``--override`` texts shrinking the shipped verl space to minutes on one GPU: ``steps`` steps per trial with
    validation (the objective) at the last, a checkpoint every ``save_freq`` steps (-1: none), ``n_jobs`` trials at
    once on one GPU each, short responses, vLLM eager (no CUDA-graph capture), one mini-batch choice, the local
    model and the data in the work directory (:func:`write_verl_data`)."""
    return [f"trial.python={verl_python}", "trial.timeout_s=480", f"study.n_trials={n_trials}",
            f"trial.n_jobs={n_jobs}", "trial.gpus_per_trial=1", "params.mini_batch.choices=[16]",
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={work / 'gsm8k' / 'train.parquet'}", f"data.val_files={work / 'gsm8k' / 'test.parquet'}",
            "data.max_response_length=128", f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
            "trainer.val_before_train=false", f"trainer.save_freq={save_freq}",
            "actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]


def verl_pair_overrides(work: Path, model_dir: Path, verl_python: str) -> list[str]:
    """Two trials of :data:`PAIR_STEPS` steps at once (``trial.n_jobs=2``), one GPU each, no checkpoint."""
    return verl_space_overrides(work, model_dir, verl_python, 2, PAIR_STEPS, -1, n_jobs=2)


def verl_search_argv(work: Path, overrides: list[str], study: str = VERL_STUDY) -> list[str]:
    return [sys.executable, "-m", "hpo", "search", "--space", VERL_SPACE, "--study", study,
            "--studies-dir", str(work / "studies"), *(a for o in overrides for a in ("--override", o))]


def write_verl_data(work: Path) -> None:
    """The GSM8K-format parquet files the overrides name (the driver's prepare step writes only the shipped set)."""
    from hpo.backends.verl._data import write_parquet

    for name, split in (("train.parquet", "train"), ("test.parquet", "test")):
        if not (work / "gsm8k" / name).is_file():
            write_parquet(work / "gsm8k" / name, split)


@dataclass(frozen=True)
class StudyRun:
    """One study of the verl stages: how its driver starts (``search``: ``python -m hpo search ...``, any space)
    and where the study lives (``<studies>/<study>.db``, trial directories under ``<studies>/<study>/trials``)."""

    search: list[str]
    studies: Path
    study: str
    env: dict[str, str]
    log: Path  # the drivers' stdout and stderr (a pipe would fill up and block them)

    @classmethod
    def of(cls, work: Path, overrides: list[str], study: str = VERL_STUDY,
           env: dict[str, str] | None = None) -> StudyRun:
        return cls(verl_search_argv(work, overrides, study), work / "studies", study,
                   env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}, work / f"{study}.log")

    @property
    def resume(self) -> list[str]:
        """``resume`` of the stored experiment: its overrides make it differ from the space file, and this check
        made it (``--trust-stored-experiment``)."""
        return [sys.executable, "-m", "hpo", "resume", "--study", self.study, "--studies-dir", str(self.studies),
                "--trust-stored-experiment"]

    def trial_dir(self, number: int) -> Path:
        return self.studies / self.study / "trials" / str(number)

    def trials(self) -> list[Any]:
        """The study's FrozenTrials ([] before the driver created it)."""
        db = self.studies / f"{self.study}.db"
        if not db.exists():
            return []
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return list(optuna.load_study(study_name=self.study, storage=f"sqlite:///{db}").trials)

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            return subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def last_line(self) -> str:
        return last_line_of(self.log.read_text(errors="replace")) if self.log.is_file() else ""


def read_steps(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The ``{"step": N, "data": {...}}`` lines of a metrics file (an unreadable line is skipped)."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
            out.append((int(rec["step"]), dict(rec["data"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def trial_facts(run: StudyRun, metric: str) -> list[TrialFacts]:
    from hpo.backends.verl import verl_metrics_path

    out = []
    for t in run.trials():
        tdir = run.trial_dir(t.number)
        metrics = verl_metrics_path(tdir, len(t.system_attrs.get("retry_history", [])))
        recs = read_steps(metrics)
        command = tdir / "command.json"
        try:
            devices = str(json.loads(command.read_text()).get("env", {}).get("CUDA_VISIBLE_DEVICES", ""))
            start = command.stat().st_mtime
        except (OSError, ValueError):
            devices, start = "", float("nan")
        wall = t.user_attrs.get("wall_time_s")
        end = start + float(wall) if isinstance(wall, (int, float)) else float("nan")
        allocated = [float(d["perf/max_memory_allocated_gb"]) for _, d in recs
                     if isinstance(d.get("perf/max_memory_allocated_gb"), (int, float))]
        out.append(TrialFacts(
            t.number, t.state.name, t.value if t.values is not None and len(t.values) == 1 else None,
            str(t.user_attrs.get("fail_reason") or ""), len(recs),
            tuple(float(d[metric]) for _, d in recs if isinstance(d.get(metric), (int, float))), start, end, devices,
            dict(t.params), t.system_attrs.get("failed_trial"), recs[0][0] if recs else None,
            max(allocated, default=float("nan")), str(metrics)))
    return out


def checkpoint_in(run: StudyRun) -> tuple[int, int] | None:
    """(trial, step) of the newest complete checkpoint of any trial of the study so far, else None."""
    from hpo.backends.verl import checkpoint_step

    trials = run.studies / run.study / "trials"
    found = []
    for tdir in trials.iterdir() if trials.is_dir() else []:
        step = checkpoint_step(tdir / "checkpoints") if tdir.name.isdigit() else None
        if step is not None:
            found.append((step, int(tdir.name)))
    return None if not found else (max(found)[1], max(found)[0])


def _resumed_from(trial_dir: Path) -> int | None:
    """The step of the checkpoint the trial's command resumed from (``hpo.backends.verl.resumed_from``), else None."""
    from hpo.backends.verl import resumed_from

    source = resumed_from(trial_dir)
    m = re.fullmatch(r"global_step_(\d+)", source.name) if source is not None else None
    return int(m.group(1)) if m else None


def sigterm_and_resume(run: StudyRun, metric: str, timeout_s: float = 900.0, poll_s: float = 0.2) -> Interrupted:
    """What a user does: start the search, SIGTERM the driver once a trial has written a complete checkpoint
    (``hpo.backends.verl.checkpoint_step``; waited on, not timed), then ``resume`` the study."""
    out = Interrupted()
    started, t0 = time.time(), time.monotonic()
    driver = run.start(run.search)
    found = None
    while driver.poll() is None and time.monotonic() - t0 < timeout_s:
        found = checkpoint_in(run)
        if found is not None:
            break
        time.sleep(poll_s)
    if driver.poll() is not None:  # before any checkpoint, or the trial finished before the SIGTERM
        out.exit_code, out.error = driver.returncode, (
            f"the search exited {driver.returncode} before the SIGTERM "
            f"({'after' if found else 'without'} a checkpoint): {run.last_line()}")
        out.trials = trial_facts(run, metric)
        return out
    if found is None:
        out.error = f"no complete checkpoint after {timeout_s:.0f} s"
    else:
        out.trial, out.checkpoint_step = found
        out.checkpoint_s = time.monotonic() - t0
    t1 = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    try:
        out.exit_code = driver.wait(timeout=300)
    except subprocess.TimeoutExpired:
        driver.kill()
        out.exit_code, out.error = driver.wait(), "the driver did not exit within 300 s of the SIGTERM"
    out.stop_s = time.monotonic() - t1
    out.ray_after_stop = ray_processes(started, run.study)
    if out.error:
        return out
    out.queued = any(t.state.name == "WAITING" and t.system_attrs.get("failed_trial") == out.trial
                     for t in run.trials())
    t2 = time.monotonic()
    out.resume_exit, late = _wait_or_stop(run.start(run.resume), timeout_s, "resume")
    out.error = out.error or late
    out.resume_s = time.monotonic() - t2
    out.ray_left = ray_processes(started, run.study)
    out.trials = trial_facts(run, metric)
    retries = [f for f in out.trials if f.retry_of == out.trial]
    if retries:
        retry = retries[-1]
        tdir = run.trial_dir(retry.number)
        out.retry, out.first_step, out.value = retry.number, retry.first_step, retry.value
        out.resumed_from = _resumed_from(tdir)
        logs = "".join((tdir / n).read_text(errors="replace") for n in ("stdout.log", "stderr.log")
                       if (tdir / n).is_file())
        out.loaded_log = "Resuming from" in logs  # verl's _load_checkpoint: "Resuming from <dir>, setting global step"
    if out.resume_exit != 0 and not out.error:
        out.error = f"resume exit {out.resume_exit}: {run.last_line()}"
    return out


def _wait_or_stop(proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> tuple[int, str]:
    """``proc``'s exit code and "" (SIGTERMed, with an error text, when it runs over ``timeout_s``)."""
    try:
        return proc.wait(timeout=timeout_s), ""
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=300), f"{what} ran over {timeout_s:.0f} s"


def run_pair(run: StudyRun, metric: str, timeout_s: float = 900.0) -> Pair:
    out = Pair()
    started, t0 = time.time(), time.monotonic()
    out.exit_code, late = _wait_or_stop(run.start(run.search), timeout_s, "the search")
    out.error = out.error or late
    out.seconds = time.monotonic() - t0
    out.ray_left = ray_processes(started, run.study)
    out.trials = trial_facts(run, metric)
    if out.exit_code != 0 and not out.error:
        out.error = f"search exit {out.exit_code}: {run.last_line()}"
    return out


def _model_dir(plan: Plan, work: Path) -> Path:
    """SmolLM2-135M-Instruct as a directory verl can load (CUDA); dry: a directory with only its config.json, which
    is all that composing and estimating read."""
    if plan.device == "cuda":
        from verl_core.pretrained import ensure_smollm2

        return Path(ensure_smollm2(log=False))
    from verl_core.pretrained import smollm2_config

    d = work / "smollm2-config"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(smollm2_config()))
    return d


class _PeakGpuMemory:
    """Peak used memory of every GPU (NVML, all processes) every ``period`` s, above what each used at start."""

    def __init__(self, period: float = 0.2) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.start = [self._used(h) for h in self._handles]
        self.peak = list(self.start)
        self.total = [int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in self._handles]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _used(self, handle: Any) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self.peak = [max(p, self._used(h)) for p, h in zip(self.peak, self._handles, strict=True)]

    def stop(self) -> tuple[int, int]:
        """(the largest rise over the GPUs, the total memory of that GPU): one trial at a time, so its GPU's."""
        self._stop.set()
        self._thread.join()
        rise, i = max((p - s, i) for i, (p, s) in enumerate(zip(self.peak, self.start, strict=True)))
        return rise, self.total[i]


def ray_processes(since: float, study: str | None = None) -> list[str]:
    """Ray's processes (raylet, gcs_server, ``ray::`` workers) started after ``since`` and still alive; with
    ``study``, only those a trial of that study started (they inherit its ``VERL_HPO_STUDY``): another Ray cluster on
    the same host (a user's, another test's) is not this check's to count."""
    import psutil

    from hpo.execution import ENV_STUDY

    left = []
    for proc in psutil.process_iter(["name", "cmdline", "create_time"]):
        try:
            name, cmd = proc.info["name"] or "", " ".join(proc.info["cmdline"] or [])
            if proc.info["create_time"] >= since and (name in ("raylet", "gcs_server") or cmd.startswith("ray::")
                                                      or "ray/_private/workers" in cmd):
                if study is not None and proc.environ().get(ENV_STUDY) != study:
                    continue
                left.append(f"{proc.pid} {name or cmd[:40]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


def verl_estimate(overrides: list[str], values: dict[str, Any], verl_python: str, gpu_total: int,
                  lengths: Any = None) -> Any:
    """``judge_verl`` (the estimate at the expected ``lengths`` and in the worst case) of the config a trial with
    ``values`` ran (composed by verl in ``verl_python``)."""
    from hpo.backends import load_space
    from hpo.backends.verl._memory import verl_memory_inputs
    from hpo.backends.verl._memory_model import judge_verl

    space = load_space(VERL_SPACE, overrides, check=False)
    [(info, keys)] = verl_memory_inputs(space, [space.trainer_overrides(values)], 1, verl_python)
    return judge_verl(keys, use_critic=bool(info["use_critic"]), use_ref=bool(info["use_reference_policy"]),
                      lengths=lengths, gpu_total_bytes=gpu_total)


def study_lengths(trials: list[TrialFacts]) -> Any:
    """The largest mean prompt and response lengths the trials logged (``SequenceLengths``), else None."""
    from hpo.backends._shapes import EstimateError, SequenceLengths, read_sequence_lengths
    from hpo.backends.verl._memory_model import LENGTH_METRICS

    found = []
    for f in trials:
        try:
            found.append(read_sequence_lengths(f.metrics, *LENGTH_METRICS))
        except EstimateError:
            continue
    if not found:
        return None
    prompts = [x.prompt for x in found if x.prompt is not None]
    responses = [x.response for x in found if x.response is not None]
    return SequenceLengths(max(prompts, default=None), max(responses, default=None), "largest means of the study")


def check_verl_dry(run: StudyRun, pair: StudyRun, overrides: list[str], pair_overrides: list[str],
                   verl_python: str) -> list[Check]:
    """The plumbing of the verl stages without a GPU: the plan (every command) printed, ``validate`` of the resumed
    study's space and overrides (every corner composed by real verl on the CPU, with its worst-case estimate), the
    pair's space loaded (its fields)."""
    from hpo.backends import load_space
    from hpo.backends.verl import SKIP_INTERPRETER_CHECK

    shown, resume, pair_shown = (" ".join(a[1:]) for a in (run.search, run.resume, pair.search))
    plan = (f"would run: {shown}; SIGTERM once a trial has a complete checkpoint "
            f"(hpo.backends.verl.checkpoint_step); then: {resume}")
    for name, text in (("verl study", f"would run: {shown}"), ("verl SIGTERM + resume", plan),
                       ("verl two trials at once", f"with 2+ GPUs would run: {pair_shown}")):
        print(f"[gpu-check] {name} {text}", file=sys.stderr, flush=True)
    c = Check("verl study")
    r = Check("verl SIGTERM + resume", "skipped", f"dry run: {plan}", data={"argv": [run.search, run.resume]})
    space = load_space(VERL_SPACE, pair_overrides, check=False)
    p = Check("verl two trials at once", "skipped",
              f"dry run: trial.n_jobs={space.trial.n_jobs}, trial.gpus_per_trial={space.trial.gpus_per_trial}; "
              f"with 2+ GPUs would run: {pair_shown}", data={"argv": pair.search})
    m = Check("verl memory estimate", "skipped",
              "needs the GPU run (dry run: validate prints the worst-case estimate of every corner)")
    if not Path(verl_python).exists():
        c.status, c.detail = "skipped", f"no {verl_python} (make install-verl); would run: {shown}"
        return [c, r, p, m]
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", VERL_SPACE,
                           *(a for o in overrides for a in ("--override", o))], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO),
                                                       # a GPU study validated with the CPU verl venv: the plumbing,
                                                       # not the interpreter validate would refuse for its GPU trials
                                                       SKIP_INTERPRETER_CHECK: "1"})
    c.seconds = time.time() - t0
    out = proc.stdout
    print(out, file=sys.stderr, flush=True)
    corners = out.count("\ncorner ") + out.startswith("corner ")
    total = re.search(r"^TOTAL \(peak\)\s+cuda\s+([\d.]+)\s+persistent \+ phase (\w+)", out, re.M)
    if proc.returncode != 0 or "All checks passed" not in out or total is None:
        c.status, c.detail = "FAIL", f"validate exit {proc.returncode}: {last_line_of(proc.stderr or out)}"
        return [c, r, p, m]
    c.detail = (f"validate: {corners} corner(s) composed by verl 0.9.1, largest estimate {total[1]} GiB (peak phase "
                f"{total[2]}) on the assumed GPU; would run: {shown}")
    c.data = {"argv": run.search, "validate": out}
    return [c, r, p, m]


def check_verl(plan: Plan, work: Path, verl_python: str, n_trials: int) -> list[Check]:
    """Real verl on the GPU through the driver (module docstring, item 7): the study (SIGTERMed and resumed), the
    resume, two trials at once, the memory estimate; four rows."""
    from hpo.backends import load_space
    from hpo.execution._devices import detect_devices

    model = _model_dir(plan, work)
    write_verl_data(work)
    overrides = verl_space_overrides(work, model, verl_python, n_trials)
    pair_overrides = verl_pair_overrides(work, model, verl_python)
    run, pair = StudyRun.of(work, overrides), StudyRun.of(work, pair_overrides, PAIR_STUDY)
    if plan.device != "cuda":
        return check_verl_dry(run, pair, overrides, pair_overrides, verl_python)
    names = ("verl study", "verl SIGTERM + resume", "verl two trials at once", "verl memory estimate")
    if not Path(verl_python).exists():
        return [Check(n, "skipped", f"no {verl_python}: make gpu-check builds it (verl[vllm]==0.9.1)") for n in names]
    metric = load_space(VERL_SPACE, overrides, check=False).objective.primary_metric
    peak = _PeakGpuMemory()
    try:
        o = sigterm_and_resume(run, metric)
    except Exception as err:  # the rows below still run
        o = Interrupted(error=failed_check("", err).detail)
    device_peak, gpu_total = peak.stop()
    study = study_row(o.trials, n_trials, metric, o.ray_left, o.trial)
    resume = resume_row(o)
    m = guarded_check("verl memory estimate",
                 lambda: verl_memory_row(o.trials, overrides, verl_python, device_peak, gpu_total))
    gpus = detect_devices()
    if len(gpus) < 2:
        p = Check("verl two trials at once", "skipped",
                  f"one GPU ({len(gpus)} visible): trial.n_jobs=2 with trial.gpus_per_trial=1 needs two")
    else:
        p = guarded_check("verl two trials at once", lambda: pair_row(run_pair(pair, metric)))
    return [study, resume, p, m]


def verl_memory_row(trials: list[TrialFacts], overrides: list[str], verl_python: str, device_peak: int,
                    gpu_total: int) -> Check:
    """:func:`memory_row` of the first completed trial's config, at the study's logged lengths."""
    done = [f for f in trials if f.ok]
    if not done:
        return Check("verl memory estimate", "FAIL", "no trial completed")
    lengths = study_lengths(trials)
    v = verl_estimate(overrides, done[0].params, verl_python, gpu_total, lengths)
    print(v.expected.render(gpu_total, "the trial's GPU total"), file=sys.stderr, flush=True)
    return memory_row(MemoryFacts(
        v.expected.total / 2**30, v.worst.total / 2**30, device_peak / 2**30,
        lengths.describe() if lengths is not None else "no lengths logged: worst case", v.expected.peak_phase,
        v.expected.allocated_peak("actor") / 2**30, max((f.allocated_gb for f in done), default=float("nan"))))
