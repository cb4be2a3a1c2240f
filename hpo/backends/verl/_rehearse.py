"""``verl-hpo rehearse``: a verl experiment's own pipeline, shrunk, run by verl's real ``main_ppo`` on the CPU in
minutes, to find what would fail a study hours into its GPU time.

What runs: the user's config and overrides, their data files (the first rows, prompts as they are), their reward
function, their objective and parameters, with a small model of the same architecture built from the model's
``config.json`` and the model's own tokenizer (``hpo/backends/verl/_shrink.py``, in verl's interpreter), on the CPU
platform of :mod:`hpo.backends.verl._cpu`. What is swapped (the model, world size, tensor parallelism, response
length, loggers) is printed, so the user knows what was not rehearsed.

Corners (:func:`~hpo.backends.verl._rehearse_corners.rehearsal_corners`): the default point (``study.baseline``
where it sets a tuned key, else the middle of each range), every parameter at its low end, every parameter at its
high end; each :data:`~hpo.backends.verl._rehearse_corners.STEPS` steps with validation every step. The default point
runs one step more, is killed once its first checkpoint is complete, and resumes from it as a retried trial does
(``trainer.resume_mode=resume_path``).

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

This module is the command (:func:`rehearse`, :func:`recheck`, :func:`parse_size` for ``--gpu-memory``), the
rehearsal's home, the overrides that shrink every corner and the memory estimate's findings; the corners and their
runs are :mod:`hpo.backends.verl._rehearse_corners`, the steps in verl's interpreter (the rehearsal under way)
:mod:`hpo.backends.verl._rehearse_steps`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hpo.analysis import REHEARSALS_DIR
from hpo.backends._preflight import GiB
from hpo.backends.verl._cpu import CPU_OVERRIDES
from hpo.backends.verl._launch import format_override
from hpo.backends.verl._rehearse_checks import Finding, RehearsalCorner, check_runs, exit_code, failure_line, render
from hpo.backends.verl._rehearse_corners import STEPS, _Runner, corner_timeout, rehearsal_corners
from hpo.backends.verl._rehearse_state import MARKER, load_state, save_state
from hpo.backends.verl._rehearse_steps import ONE_DEVICE_KEYS, _Rehearsal
from hpo.backends.verl._rehearse_stop import Stopped, stop_on_signals, sweep_scratch
from hpo.execution import TrialProcess, TrialRun
from hpo.experiment import SpaceError

if TYPE_CHECKING:
    from hpo.experiment import Space

RESPONSE_TOKENS = 16  # data.max_response_length of the rehearsal


# ----------------------------------------------------------------------------- the rehearsal's home
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
    result = TrialProcess(TrialRun(argv, dict(os.environ), home / "prepare", home / "prepare" / "metrics.jsonl")).run()
    if result.exit_code != 0:
        return f"trial.prepare_command failed (exit {result.exit_code}): {failure_line(result)}"
    return None


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


def rehearse(space: Space, studies_dir: Path, *, tokenizer: Path | None = None, fmt: str = "text",
             out: TextIO = sys.stdout, err: TextIO = sys.stderr, python: str | None = None,
             response_tokens: int = RESPONSE_TOKENS, timeout_s: float | None = None,
             parallel: int | None = None, quick: bool = False, reward_timeout_s: float = 120.0,
             gpus: int | None = None, gpu_bytes: int | None = None) -> int:
    """Run the rehearsal (see the module docstring) and print its report; the exit code. ``quick``: the default
    point only, without the resume (the objective, the reward and the keys are still checked). ``reward_timeout_s``:
    what the reward check's calls of the user's function may take in all. ``timeout_s``: each corner attempt's
    limit (None: :func:`corner_timeout`); ``parallel``: corners at once (None:
    :func:`~hpo.backends.verl._rehearse_corners.corner_parallelism`). ``gpus``, ``gpu_bytes``: the real study's GPUs
    per trial and GPU size for the memory estimate (None: ``trial.gpus_per_trial``; this host's GPU, else an 80 GiB
    one). A stop signal (SIGTERM, SIGINT, SIGHUP) stops the runs, removes their scratch and returns 128 + its number
    (:func:`stop_on_signals`)."""
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
    r.reward_timeout_s = reward_timeout_s
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
