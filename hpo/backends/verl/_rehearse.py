"""``verl-hpo rehearse``: a verl experiment's own pipeline, shrunk, run by verl's real ``main_ppo`` on the CPU in
minutes, to find what would fail a study hours into its GPU time.

What runs: the user's config and overrides, their data files (the first rows, prompts as they are), their reward
function, their objective and parameters, with a small model of the same architecture built from the model's
``config.json`` and the model's own tokenizer (``hpo/backends/verl/_shrink.py``, in verl's interpreter), on the CPU
platform of :mod:`hpo.backends.verl._cpu`. What is swapped (the model, world size, tensor parallelism, response
length, loggers) is printed, so the user knows what was not rehearsed.

Corners (:func:`rehearsal_corners`): the default point (``study.baseline`` where it sets a tuned key, else the middle
of each range), every parameter at its low end, every parameter at its high end; each :data:`STEPS`
steps with validation every step. The default point runs one step more, is killed once its first checkpoint is
complete, and resumes from it as a retried trial does (``trainer.resume_mode=resume_path``).

Checks (:class:`~hpo.backends.verl._rehearse_checks.Finding`, one line each, naming the key, file or row): the
data's columns; the reward function on every kept validation row; keys the space sets that nothing in verl reads;
what the corners logged (:mod:`hpo.backends.verl._rehearse_checks`: each corner runs; the objective metric is logged
under exactly its name; each tuned parameter reaches the trainer where verl logs it back; non-finite metrics, a
property of the corner, reported, not a failure; the checkpoint resumes at its step); the memory estimate of each
corner on the user's GPUs, at the prompt lengths measured from the data and in the worst case. Exit 0 when a real
study would run, 1 when it would fail, 2 for a bad file (raised before anything runs), 3 when this machine could not
finish a corner (out of its time, killed by the host) or a step before them ran out of its time (composing verl's
configs on a busy host: :func:`~hpo.backends.verl._check.compose_timeout`): not rehearsed, not failed; 128 + N when
signal N stopped it (:mod:`hpo.backends.verl._rehearse_stop`: no run and no scratch outlives it). The rehearsal's
files live under ``<studies-dir>/rehearsals/<space>/`` (trials, shrunk model and data, the report; ``--recheck``'s
state, :mod:`hpo.backends.verl._rehearse_state`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hpo.analysis import REHEARSALS_DIR
from hpo.backends._preflight import GiB
from hpo.backends.verl._check import (
    ComposeTimeout,
    VerlConfigError,
    compose_corners,
    compose_timed_out,
    compose_timeout,
    interpreter_problem,
    trial_base_env,
)
from hpo.backends.verl._cpu import CPU_OVERRIDES, cpu_overrides, transfer_queue_overrides
from hpo.backends.verl._launch import (
    format_override,
    override_key,
    verl_argv,
    verl_cleanup,
    verl_env,
    verl_metrics_path,
    verl_overrides,
)
from hpo.backends.verl._rehearse_checks import (
    CornerOutcome,
    Finding,
    RehearsalCorner,
    check_runs,
    exit_code,
    failure_line,
    read_records,
    render,
    values_text,
)
from hpo.backends.verl._rehearse_state import MARKER, load_state, save_state
from hpo.backends.verl._rehearse_stop import Stopped, stop_on_signals, sweep_scratch
from hpo.backends.verl._resume import checkpoint_step
from hpo.execution._runner import RunResult, TrialProcess
from hpo.experiment._secrets import baseline_secrets, secret_overrides
from hpo.experiment._space import SpaceError

if TYPE_CHECKING:
    from hpo.experiment._space import Space

SHRINK_SCRIPT = Path(__file__).parent / "_shrink.py"
STEPS = 2  # training steps of each corner (validation before the first and after every step)
RESPONSE_TOKENS = 16  # data.max_response_length of the rehearsal
VAL_ROWS = 8  # validation rows kept (every one is scored by the reward function)
CORNER_TIMEOUT_S = 1800.0  # a corner's limit when neither --corner-timeout nor trial.timeout_s sets one
SHRINK_FACTOR = 1.5  # the shrink script's limit: this times the compose limit (900 s by default), plus --reward-timeout
CORNER_CORES = 0.75  # free cores a corner needs beside another (verl's CPU workers mostly take turns)
# GPU-only sizes the CPU rehearsal sets to one (each swap is printed when the experiment sets another value).
ONE_DEVICE_KEYS = ("actor_rollout_ref.rollout.tensor_model_parallel_size",
                   "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                   "actor_rollout_ref.ref.ulysses_sequence_parallel_size")


# ----------------------------------------------------------------------------- the plan
def middle(param: Any) -> Any:
    """The middle of a parameter's range: the geometric mean on a log scale, on its step grid; the middle choice."""
    if param.type == "categorical":
        return param.choices[(len(param.choices) - 1) // 2]
    lo, hi = float(param.low), float(param.high)
    mid = math.sqrt(lo * hi) if param.log and lo > 0 else (lo + hi) / 2
    if param.step:
        mid = lo + round((mid - lo) / float(param.step)) * float(param.step)
    return int(round(mid)) if param.type == "int" else float(f"{mid:.6g}")


def rehearsal_corners(space: Space) -> list[RehearsalCorner]:
    """The default point (``study.baseline`` where it sets a tuned key, else the middle of the parameter's range: verl's
    own defaults are often invalid beside a space, e.g. ``ppo_mini_batch_size=256`` with a batch of 32), every
    parameter at its low end, every parameter at its high end (a corner equal to one before it is dropped)."""
    baseline = {override_key(k): v for k, v in space.study.baseline.items()}
    default = {p.name: baseline.get(override_key(p.key), middle(p)) for p in space.params}
    out: list[RehearsalCorner] = []
    for name, values in (("default", default), ("low", {p.name: p.corner_values()[0] for p in space.params}),
                         ("high", {p.name: p.corner_values()[-1] for p in space.params})):
        # secrets as references (their values go in the corner's environment: _secret_env), as in a trial's argv
        fixed = {**space.fixed_overrides(), **(space.study.baseline if name == "default" else {})}
        overrides = verl_overrides(fixed, {p.key: values[p.name] for p in space.params})
        if all(c.overrides != overrides for c in out):
            out.append(RehearsalCorner(name, values, overrides))
    return out


def _secret_env(space: Space) -> dict[str, str]:
    """The values of the experiment's secret overrides and ``study.baseline`` secrets, which a corner's argv holds
    as references (``hpo.experiment._secrets``)."""
    return {**secret_overrides(space.overrides), **baseline_secrets(space.raw)}


def home_name(space: Space) -> str:
    """The directory name of ``space``'s rehearsals under ``<studies-dir>/rehearsals``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", space.name).lstrip(".") or "space"


def rehearsal_home(studies_dir: Path, space: Space) -> Path:
    """``<studies-dir>/rehearsals/<space>``, emptied of an earlier rehearsal's files (only a directory that holds
    :data:`MARKER`, i.e. one the driver made, is ever emptied; anything else there is an error)."""
    home = studies_dir / REHEARSALS_DIR / home_name(space)
    if home.is_symlink() or (home.exists() and not (home / MARKER).is_file()):
        raise SpaceError(f"{home}: exists and was not made by verl-hpo rehearse; remove it or use --studies-dir")
    if home.exists():
        sweep_scratch(home)  # what a killed rehearsal of this experiment left outside its home
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / MARKER).write_text("made by verl-hpo rehearse; replaced by the next rehearsal of this experiment\n")
    return home


# ----------------------------------------------------------------------------- verl's interpreter
SCRIPT_TAIL_BYTES = 4 << 20  # of a helper script's stdout and stderr, only the end is kept (its reply is the last line)


def _tail_of(stream: Any, keep: list[bytes]) -> None:
    """Read ``stream`` to its end, keeping only its last :data:`SCRIPT_TAIL_BYTES` in ``keep[0]``."""
    tail = b""
    for chunk in iter(lambda: stream.read(1 << 16), b""):
        tail = (tail + chunk)[-SCRIPT_TAIL_BYTES:]
    keep[0] = tail


def _script(python: str, script: Path, request: dict[str, Any], timeout_s: float,
            env: Mapping[str, str]) -> dict[str, Any]:
    """Run a helper script in verl's interpreter and return its one-line JSON reply; what it (or the user's code it
    calls) prints is read to the end but only its last :data:`SCRIPT_TAIL_BYTES` are kept."""
    import threading

    try:
        proc = subprocess.Popen([python, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**env, "HYDRA_FULL_ERROR": "1"})
    except OSError as err:
        return {"status": "error", "message": f"{script.name} in {python} failed ({type(err).__name__})"}
    out, err_tail = [b""], [b""]
    readers = [threading.Thread(target=_tail_of, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_tail_of, args=(proc.stderr, err_tail), daemon=True)]
    for t in readers:
        t.start()
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"status": "error", "timed_out": True, "message": f"{script.name} took over {timeout_s:.0f} s"}
    except OSError:
        pass  # it exited before reading the request: its reply (or none) says why
    except BaseException:  # a stop (the rehearsal's SIGTERM, Ctrl-C): the script does not outlive it
        proc.kill()
        proc.wait()
        raise
    finally:
        for t in readers:
            t.join(timeout=10)
    try:
        reply = json.loads(out[0].decode("utf-8", "replace").strip().splitlines()[-1])
        return reply if isinstance(reply, dict) else {"status": "error", "message": f"{script.name}: no reply"}
    except (IndexError, ValueError) as err:
        return {"status": "error", "message": f"{script.name} in {python} failed ({type(err).__name__})"}


def _config_request(config: str) -> dict[str, Any]:
    from hpo.backends.verl._launch import is_config_path

    if is_config_path(config):
        path = Path(config).expanduser().resolve()
        return {"config_dir": str(path.parent), "config_name": path.stem}
    return {"config_dir": None, "config_name": config}


# ----------------------------------------------------------------------------- running the corners
@dataclass
class _Runner:
    space: Space
    python: str
    home: Path
    shrunk: list[str]  # overrides every corner gets (tiny model, data, lengths, steps)
    timeout_s: float
    say: Callable[[str], None]
    resume: bool = True  # the default point is killed after its first checkpoint and resumed
    halt: threading.Event = field(default_factory=threading.Event)  # a stop signal: no run goes on or starts

    def corner_overrides(self, corner: RehearsalCorner, steps: int, save_freq: int) -> list[str]:
        own = [o for o in corner.overrides if override_key(o) != "trainer.logger"]  # no tracker from a rehearsal
        return [*own, *self.shrunk, format_override("trainer.total_training_steps", steps),
                format_override("trainer.save_freq", save_freq)]

    def attempt(self, outcome: CornerOutcome, overrides: list[str], attempt: int, resume_from: Path | None,
                stop_at_checkpoint: bool) -> RunResult:
        trial_dir = outcome.trial_dir
        argv = verl_argv(self.python, self.space.config, overrides, f"rehearse-{self.space.name}", outcome.index,
                         trial_dir, 0, resume_from)
        env = verl_env({**os.environ, **trial_base_env(self.space), **_secret_env(self.space)}, trial_dir, attempt,
                       cpu=True)
        stop = threading.Event()

        def tick(_step: int | None, _gb: float) -> None:
            if self.halt.is_set():
                stop.set()  # the rehearsal was stopped by a signal
            elif stop_at_checkpoint and (checkpoint_step(trial_dir / "checkpoints") or 0) >= 1:
                stop.set()  # killed as a crashed trial would be, after its first complete checkpoint

        log_dir = trial_dir if attempt == 0 else trial_dir / f"attempt{attempt}"
        try:
            metrics = verl_metrics_path(trial_dir, attempt)
            result = TrialProcess(argv=argv, env=env, log_dir=log_dir, metrics_path=metrics,
                                  timeout_s=self.timeout_s, on_tick=tick, stop_event=stop,
                                  private_tmp=trial_dir / f"slash-tmp{attempt}").run()
        finally:
            verl_cleanup(trial_dir, attempt, keep_logs=False)
        outcome.results.append(result)
        outcome.records.append(read_records(verl_metrics_path(trial_dir, attempt)))
        return result

    def run(self, corner: RehearsalCorner, index: int) -> CornerOutcome:
        outcome = CornerOutcome(corner, self.home / "trials" / f"{index}-{corner.name}", index,
                                timeout_s=self.timeout_s)
        outcome.trial_dir.mkdir(parents=True)
        if self.halt.is_set():
            return outcome
        started = time.monotonic()
        self.say(f"  corner {corner.name} ({values_text(corner.values)}) started")
        if corner.name != "default" or not self.resume:
            result = self.attempt(outcome, self.corner_overrides(corner, STEPS, -1), 0, None, False)
        else:  # one step more than the others, killed after its first checkpoint, then resumed from it
            overrides = self.corner_overrides(corner, STEPS + 1, 1)
            result = self.attempt(outcome, overrides, 0, None, True)
            step = checkpoint_step(outcome.trial_dir / "checkpoints")
            if result.stop == "interrupted" and step is not None and not self.halt.is_set():
                outcome.resumed_from = step
                self.say(f"  corner default killed after its checkpoint of step {step}; resuming from it")
                result = self.attempt(outcome, overrides, 1,
                                      outcome.trial_dir / "checkpoints" / f"global_step_{step}", False)
        how = "ok" if result.exit_code == 0 else result.failure or result.stop or f"exit {result.exit_code}"
        self.say(f"  corner {corner.name} ended: {how} in {time.monotonic() - started:.0f} s")
        return outcome


# ----------------------------------------------------------------------------- the memory estimate
def memory_lines(space: Space, corners: Sequence[RehearsalCorner], inputs: Any, gpus: int | None = None,
                 gpu_bytes: int | None = None) -> list[Finding]:
    """Each corner's estimate on the real study's GPUs (``gpus`` per trial, else ``trial.gpus_per_trial``; GPUs of
    ``gpu_bytes``): at the prompts measured from the data and a short response (what ``search`` refuses on) and in
    the worst case. ``inputs`` were composed for that many GPUs."""
    from hpo.backends.verl._memory import predictions_from_inputs

    if not gpus and space.trial.gpus_per_trial == 0:
        return [Finding("memory", "note", "trial.gpus_per_trial is 0: the study's trials run on the CPU, as here; "
                                          "no GPU estimate (--gpus N --gpu-memory 80GiB gives one for N GPUs)")]
    try:
        preds = predictions_from_inputs(space, inputs, [], None, gpu_bytes)
    except Exception as err:  # noqa: BLE001 - ModelConfigUnavailable and SpaceError: reported, not fatal
        return [Finding("memory", "note", f"no memory estimate: {err}")]
    out = []
    for corner, pred in zip(corners, preds, strict=True):
        level = "ok" if pred.fits else "problem"
        worst = pred.worst_total if pred.worst_total is not None else pred.total
        lengths = pred.table.splitlines()[0].removeprefix("at the expected lengths: ")
        verdict = "fits" if pred.fits and not pred.warning else "fits, but the worst case does not" if pred.fits \
            else "DOES NOT FIT"
        out.append(Finding("memory", level, f"corner {corner.name} on {gpus or space.trial.gpus_per_trial} GPU(s): "
                           f"{pred.total / GiB:.1f} GiB per GPU at {lengths}; "
                           f"{worst / GiB:.1f} GiB in the worst case; budget {pred.budget / GiB:.0f} GiB "
                           f"({pred.budget_source}): {verdict}"))
    if out and all(f.level == "problem" for f in out):
        return out
    return [f if f.level == "ok" else Finding("memory", "note", f.message) for f in out]


# ----------------------------------------------------------------------------- --recheck: the checks again
def recheck(space: Space, studies_dir: Path, *, fmt: str = "text", out: TextIO = sys.stdout) -> int:
    """The checks on the runs of this experiment's last rehearsal again (nothing is run): after fixing what does
    not change the runs, such as the objective's name. SpaceError when there is none, the experiment changed, or its
    state file is not what a rehearsal writes (:func:`~hpo.backends.verl._rehearse_state.load_state`)."""
    started = time.monotonic()
    home = studies_dir / REHEARSALS_DIR / home_name(space)
    state = load_state(home, space)
    findings = state.before + check_runs(space, state.outcomes, resumed=not state.quick)
    text = render(space, state.swaps, findings, fmt, time.monotonic() - started, home)
    out.write(text)
    out.flush()
    return exit_code(findings)


# ----------------------------------------------------------------------------- the command
def _prepare(space: Space, home: Path) -> str | None:
    """The experiment's prepare step (its data, its model), as ``search`` runs it; one line when it fails."""
    cmd = space.trial.prepare_command
    if not cmd:
        return None
    argv = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(cmd)]
    argv += ["--config", space.config, *space.trainer_overrides({})]
    result = TrialProcess(argv=argv, env=dict(os.environ), log_dir=home / "prepare",
                          metrics_path=home / "prepare" / "metrics.jsonl").run()
    if result.exit_code != 0:
        return f"trial.prepare_command failed (exit {result.exit_code}): {failure_line(result)}"
    return None


def _model_configs(selected: Mapping[str, Any], use_critic: bool) -> dict[str, dict[str, Any]]:
    from verl_core.memory_verl import read_hub_or_local_config

    keys = ["actor_rollout_ref.model.path"]
    if use_critic and selected.get("critic.model.path") not in (None, selected.get(keys[0])):
        keys.append("critic.model.path")
    return {k: read_hub_or_local_config(str(selected.get(k)), k) for k in keys}


def _shrunk_overrides(space: Space, reply: Mapping[str, Any], selected: Mapping[str, Any], response_tokens: int,
                      swaps: list[str], quick: bool = False) -> list[str]:
    """What every corner gets on top of its own overrides, each swap described in ``swaps``."""
    models = reply["models"]
    actor = models["actor_rollout_ref.model.path"]
    out = [format_override("actor_rollout_ref.model.path", actor["dir"])]
    swaps.append(f"model: {actor['architecture']} {actor['from']} -> {actor['to']} (random weights, float32; "
                 f"the model's own tokenizer from {actor['tokenizer']}): rewards and learning are not rehearsed")
    critic = models.get("critic.model.path")
    if selected.get("critic.model.path") is not None:
        out.append(format_override("critic.model.path", (critic or actor)["dir"]))
    data = reply["data"]
    max_prompt = int(selected.get("data.max_prompt_length") or 512)
    # the longest kept prompt, so nothing is cut or filtered that the real run keeps, and no padding beyond it
    prompt = min(max_prompt, max(int(data[s]["prompt_tokens"]["max"]) for s in ("train", "val")))
    out += [format_override("data.train_files", data["train"]["file"]),
            format_override("data.val_files", data["val"]["file"]),
            format_override("data.max_prompt_length", prompt),
            format_override("data.max_response_length", response_tokens),
            format_override("trainer.total_epochs", 100), format_override("trainer.test_freq", 1),
            format_override("trainer.val_before_train", True), format_override("trainer.logger", ["console"])]
    picked = (f"the {data['train']['rows']} training rows with the longest prompts (of {data['train'].get('total')})"
              if data["train"].get("picked") == "longest" else f"the first {data['train']['rows']} training rows")
    swaps.append(f"data: {picked} and the first {data['val']['rows']} validation rows (prompts "
                 f"as they are: mean {data['train']['prompt_tokens']['mean']:.0f}, longest "
                 f"{data['train']['prompt_tokens']['max']} tokens); data.max_prompt_length "
                 f"{max_prompt} -> {prompt}, data.max_response_length "
                 f"{selected.get('data.max_response_length')} -> {response_tokens}")
    swaps.append(f"steps: {STEPS} per corner (" + ("--quick: the default point only, no resume" if quick else
                 f"the default point {STEPS + 1}, killed after its first checkpoint and resumed") + "), validation "
                 "before the first step and after every step; loggers: console (+ the file logger the driver reads)")
    gpus = int(selected.get("trainer.n_gpus_per_node") or 1) * int(selected.get("trainer.nnodes") or 1)
    swaps.append(f"devices: the CPU (verl's CPU platform, gloo, vLLM's CPU build) for trial.gpus_per_trial="
                 f"{space.trial.gpus_per_trial} ({gpus} GPU(s) in the config): world size, GPU memory and speed are "
                 "not rehearsed (the memory estimate below is)")
    for key in ONE_DEVICE_KEYS:
        if selected.get(key) not in (None, 1):
            out.append(format_override(key, 1))
            swaps.append(f"{key}: {selected.get(key)} -> 1")
    swaps.append("CPU platform overrides: " + ", ".join(sorted({k.lstrip("+") for k in CPU_OVERRIDES})))
    return out


REHEARSAL_SELECT = ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size",
                    *ONE_DEVICE_KEYS)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g|mib|mb|m|tib|tb|t)?\s*$", re.IGNORECASE)


MIN_GPU_BYTES, MAX_GPU_BYTES = 2**30, 4 * 2**40  # a GPU size --gpu-memory accepts: 1 GiB to 4 TiB
SIZE_RANGE = "from 1 GiB to 4 TiB"


def parse_size(text: str) -> int | None:
    """Bytes of a GPU size as typed: ``80GiB``, ``141G``, ``24576MiB``, a bare number is GiB (G, GB and GiB are
    all 2**30: GPU makers' "80 GB" is 80 GiB of memory). None when it is not a size of :data:`SIZE_RANGE`."""
    m = _SIZE.match(text) if len(text) <= 64 else None
    if not m:
        return None
    unit = (m.group(2) or "g").lower()[0]
    size = float(m.group(1)) * {"m": 2**20, "g": 2**30, "t": 2**40}[unit]
    return int(size) if MIN_GPU_BYTES <= size <= MAX_GPU_BYTES else None  # never inf: 400 digits are refused


def corner_timeout(space: Space, given: float | None) -> tuple[float, str]:
    """(each corner attempt's time limit, where it comes from): ``--corner-timeout``, else the experiment's own
    ``trial.timeout_s``, else :data:`CORNER_TIMEOUT_S`."""
    if given is not None:
        return given, "--corner-timeout"
    if space.trial.timeout_s:
        return float(space.trial.timeout_s), "trial.timeout_s"
    return CORNER_TIMEOUT_S, "the default"


def busy_cores(seconds: float = 2.0) -> float:
    """Cores the host's other processes keep busy now: the CPU time used over ``seconds`` (``/proc/stat`` through
    psutil), in cores. Measured when the rehearsal's own preparation has ended, so it is what the corners would
    share the host with; the load average would also count the rehearsal's own last minute."""
    import psutil

    from hpo.backends.verl._cpu import host_cpus

    return psutil.cpu_percent(interval=seconds) / 100.0 * (psutil.cpu_count() or host_cpus())


def corner_parallelism(cpus: int | None = None, busy: float | None = None) -> tuple[int, str]:
    """(corners run at once, why): two when the host has the free cores two corners need (its CPUs less what other
    processes keep busy, :func:`busy_cores`), else one at a time, so that a busy host slows the rehearsal, not fails
    it."""
    from hpo.backends.verl._cpu import host_cpus

    cpus = host_cpus() if cpus is None else cpus
    busy = busy_cores() if busy is None else busy
    free = cpus - busy
    if free >= 2 * CORNER_CORES:
        return 2, f"{free:.1f} of {cpus} cores free"
    return 1, f"one at a time: {max(free, 0.0):.1f} of {cpus} cores free, two corners need {2 * CORNER_CORES:g}"


@dataclass
class _Rehearsal:
    """One rehearsal under way: what it found so far, what it swapped for the CPU, and where its report goes."""

    space: Space
    home: Path
    python: str
    say: Callable[[str], None]
    fmt: str
    out: TextIO
    started: float
    findings: list[Finding] = field(default_factory=list)
    swaps: list[str] = field(default_factory=list)

    def failed(self) -> bool:
        return any(f.level == "problem" for f in self.findings)

    def finish(self) -> int:
        """Write the report (``report.txt`` or ``report.md``, ``report.json``) and print it; the exit code."""
        text = render(self.space, self.swaps, self.findings, self.fmt, time.monotonic() - self.started, self.home)
        (self.home / ("report.md" if self.fmt == "md" else "report.txt")).write_text(text)
        (self.home / "report.json").write_text(json.dumps([f.__dict__ for f in self.findings], indent=1))
        self.out.write(text)
        self.out.flush()
        return exit_code(self.findings)

    def compose(self, corners: Sequence[RehearsalCorner], gpus: int | None) -> list[tuple[dict[str, Any],
                                                                                          dict[str, Any]]] | None:
        """The corners composed by verl for the real study's GPUs (the memory estimate's inputs, the keys the
        rehearsal swaps) and every training prompt against ``data.max_prompt_length``; None when verl rejects one."""
        from hpo.backends.verl._data import overlong_verdict
        from hpo.backends.verl._memory import MEASURED_PROMPTS, verl_memory_inputs

        space = self.space
        self.say(f"composing {len(corners)} corners and measuring the prompts in {self.python}")
        try:
            inputs = verl_memory_inputs(space, [c.overrides for c in corners],
                                        gpus or max(1, space.trial.gpus_per_trial), self.python,
                                        MEASURED_PROMPTS, extra_select=REHEARSAL_SELECT)
        except ComposeTimeout as slow:  # this host was too slow: not rehearsed, not failed
            self.findings.append(Finding("config", "unfinished", f"not rehearsed: {slow}"))
            return None
        except SpaceError as bad:
            self.findings.append(Finding("config", "problem", str(bad)))
            return None
        long = overlong_verdict((inputs[0][0].get("prompt_lengths") or {}).get("overlong"))
        if long is not None:
            self.findings.append(Finding("data", "problem" if long[0] == "problem" else "note", long[1]))
        return inputs

    def shrink(self, corner: RehearsalCorner, info: Mapping[str, Any], selected: Mapping[str, Any],
               tokenizer: Path | None, reward_timeout_s: float) -> dict[str, Any] | None:
        """The small model of the same architecture, the data's first rows and the reward function's calls, in
        verl's interpreter (:data:`SHRINK_SCRIPT`): its reply, or None when the rehearsal cannot go on."""
        space = self.space
        try:
            models = _model_configs(selected, bool(info.get("use_critic")))
        except Exception as bad:  # noqa: BLE001 - verl_core's ConfigError / ModelConfigUnavailable: one line
            path = selected.get("actor_rollout_ref.model.path")
            self.findings.append(Finding("model", "problem", f"{bad}; to rehearse, fetch config.json, tokenizer.json "
                                         f"and tokenizer_config.json of {path} (https://huggingface.co/{path}) into a "
                                         "directory and set --override actor_rollout_ref.model.path=DIR"))
            return None
        set_keys = [*space.overrides, *(p.key for p in space.params)]
        request = {**_config_request(space.config), "overrides": corner.overrides, "out": str(self.home / "shrunk"),
                   "train_rows": max(1, int(selected.get("data.train_batch_size") or 8)) * (STEPS + 1),
                   "val_rows": VAL_ROWS, "tokenizer": str(tokenizer) if tokenizer else None, "models": models,
                   "set_keys": set_keys, "reward_timeout_s": reward_timeout_s}
        self.say("building the small model, taking the data's first rows, calling the reward function")
        limit = SHRINK_FACTOR * compose_timeout() + reward_timeout_s
        reply = _script(self.python, SHRINK_SCRIPT, request, limit, {**os.environ, **trial_base_env(space)})
        if reply.get("timed_out"):  # this host was too slow: not rehearsed, not failed
            self.findings.append(Finding("shrink", "unfinished", "not rehearsed: " + compose_timed_out(
                f"building the small model, taking the data's rows and calling the reward function ({SHRINK_FACTOR:g} "
                "times the compose limit plus --reward-timeout)", self.python, limit)))
            return None
        if reply.get("status") != "ok":
            self.findings.append(Finding("shrink", "problem", "the rehearsal could not be prepared: "
                                         f"{reply.get('message')}"))
            return None
        self.findings += _shrink_findings(space, reply)
        if reply["problems"] or self.failed():
            return None
        self.findings += _prepared_findings(reply)
        return reply

    def check_cpu_corners(self, runner: _Runner, corners: Sequence[RehearsalCorner]) -> None:
        """Each corner as it runs here (shrunk, on the CPU platform) composed by verl, and the interpreter's check
        for the CPU."""
        cpu = [[*cpu_overrides(o), *transfer_queue_overrides(o, True), *o]
               for o in (runner.corner_overrides(c, STEPS, -1) for c in corners)]
        try:
            report = compose_corners(self.python, self.space.config, cpu, 0,
                                     env={**os.environ, **trial_base_env(self.space)})
        except ComposeTimeout as slow:  # this host was too slow: not rehearsed, not failed
            self.findings.append(Finding("config", "unfinished", f"not rehearsed: the corners shrunk for the CPU: "
                                         f"{slow}"))
            return
        except VerlConfigError as bad:  # the interpreter went away since the load (one line, never a traceback)
            self.findings.append(Finding("config", "problem", f"the corners shrunk for the CPU: {bad}"))
            return
        for corner, result in zip(corners, report.results, strict=True):
            if isinstance(result, Exception):
                self.findings.append(Finding("config", "problem", f"corner {corner.name} shrunk for the CPU is "
                                             f"rejected by verl: {result}"))
            else:
                why = interpreter_problem(report.interpreter or {}, result, self.python, cpu=True)
                if why:
                    self.findings.append(Finding("interpreter", "problem", why))
                    break

    def run(self, runner: _Runner, corners: Sequence[RehearsalCorner], parallel: int | None,
            limit: str) -> list[CornerOutcome]:
        """Every corner with verl's ``main_ppo`` on the CPU (``parallel`` at once, else
        :func:`corner_parallelism`); ``limit``: each attempt's, as said."""
        at_once, why = (parallel, "as asked") if parallel else corner_parallelism()
        self.say(f"running {len(corners)} corners with verl's main_ppo on the CPU, {at_once} at a time ({why}); "
                 f"each attempt's limit {limit}")
        with ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
            return list(pool.map(runner.run, corners, range(len(corners))))


def _shrink_findings(space: Space, reply: Mapping[str, Any]) -> list[Finding]:
    """What the shrink script found wrong (the data's columns, the reward function) and the keys nothing reads."""
    found = [Finding(p["check"], "problem", p["message"]) for p in reply["problems"]]
    tuned = {p.key: p.name for p in space.params}
    for key in reply["unread"]:
        if key in tuned:
            found.append(Finding("reach", "problem", f"params.{tuned[key]}: {key} is not a key of verl's config and "
                                 f"no file of verl mentions {key.rpartition('.')[2]!r}: the tuned value reaches "
                                 "no trainer (a typo?)"))
        else:
            found.append(Finding("keys", "note", f"overrides.{key}: not a key of verl's config and no file of verl "
                                 f"mentions {key.rpartition('.')[2]!r}: nothing reads it"))
    return found


def _prepared_findings(reply: Mapping[str, Any]) -> list[Finding]:
    """The data and the reward function passed the shrink script's checks."""
    reward = reply["reward"]
    return [Finding("data", "ok", f"data files have the columns verl reads; {reply['data']['train']['rows']} "
                    "training prompts tokenized with the model's chat template"),
            Finding("reward", "ok", f"{reward['where']} returned finite numbers in {reward['calls']} calls on "
                    f"{reply['data']['val']['rows']} validation rows and the "
                    f"{reply['data']['train'].get('unusual', 0)} training rows with the most unusual ground "
                    f"truths (from {reward['min']:g} to "
                    f"{reward['max']:g})")]


def rehearse(space: Space, studies_dir: Path, *, tokenizer: Path | None = None, fmt: str = "text",
             out: TextIO = sys.stdout, err: TextIO = sys.stderr, python: str | None = None,
             response_tokens: int = RESPONSE_TOKENS, timeout_s: float | None = None,
             parallel: int | None = None, quick: bool = False, reward_timeout_s: float = 120.0,
             gpus: int | None = None, gpu_bytes: int | None = None) -> int:
    """Run the rehearsal (see the module docstring) and print its report; the exit code. ``quick``: the default
    point only, without the resume (the objective, the reward and the keys are still checked). ``reward_timeout_s``:
    what the reward check's calls of the user's function may take in all. ``timeout_s``: each corner attempt's
    limit (None: :func:`corner_timeout`); ``parallel``: corners at once (None: :func:`corner_parallelism`).
    ``gpus``, ``gpu_bytes``: the real study's GPUs per trial and GPU size for the memory estimate (None:
    ``trial.gpus_per_trial``; this host's GPU, else an 80 GiB one). A stop signal (SIGTERM, SIGINT, SIGHUP) stops
    the runs, removes their scratch and returns 128 + its number (:func:`stop_on_signals`)."""
    from hpo.backends.verl._launch import default_python

    started = time.monotonic()
    python = python or space.trial.python or default_python()

    def say(line: str) -> None:
        print(line, file=err, flush=True)

    r = _Rehearsal(space, rehearsal_home(studies_dir, space), python, say, fmt, out, started)
    say(f"rehearsing {space.source} on the CPU in {r.home}")
    halt = threading.Event()
    try:
        with stop_on_signals(halt, say):
            return _steps(r, tokenizer=tokenizer, response_tokens=response_tokens, timeout_s=timeout_s,
                          parallel=parallel, quick=quick, reward_timeout_s=reward_timeout_s, gpus=gpus,
                          gpu_bytes=gpu_bytes, halt=halt)
    except Stopped as stop:
        say(f"stopped by {signal.Signals(stop.signum).name}: not rehearsed (its runs stopped, their scratch removed); "
            f"the files so far are in {r.home}, replaced by the next rehearsal of this experiment")
        return 128 + stop.signum


def _steps(r: _Rehearsal, *, tokenizer: Path | None, response_tokens: int, timeout_s: float | None,
           parallel: int | None, quick: bool, reward_timeout_s: float, gpus: int | None, gpu_bytes: int | None,
           halt: threading.Event) -> int:
    """The rehearsal's steps (see :func:`rehearse`), each ending it with its report when it finds a problem or could
    not finish on this machine."""
    space = r.space
    problem = _prepare(space, r.home)
    if problem:
        r.findings.append(Finding("prepare", "problem", problem))
        return r.finish()
    corners = rehearsal_corners(space)[:1] if quick else rehearsal_corners(space)
    inputs = r.compose(corners, gpus)
    if inputs is None:
        return r.finish()
    info, selected = inputs[0]
    reply = r.shrink(corners[0], info, selected, tokenizer, reward_timeout_s)
    if reply is None:
        return r.finish()
    shrunk = _shrunk_overrides(space, reply, selected, response_tokens, r.swaps, quick)
    limit, limit_from = corner_timeout(space, timeout_s)
    runner = _Runner(space, r.python, r.home, shrunk, limit, r.say, resume=not quick, halt=halt)
    r.check_cpu_corners(runner, corners)
    if r.failed() or any(f.level == "unfinished" for f in r.findings):
        return r.finish()
    outcomes = r.run(runner, corners, parallel, f"{limit:.0f} s ({limit_from})")
    r.findings += memory_lines(space, corners, inputs, gpus, gpu_bytes)
    save_state(r.home, space, r.swaps, outcomes, quick, r.findings)
    r.findings += check_runs(space, outcomes, resumed=not quick)
    return r.finish()
