"""One ``verl-hpo rehearse`` under way (:class:`_Rehearsal`, driven by :mod:`hpo.backends.verl._rehearse`) and
its steps: the corners composed by verl for the real study's GPUs, with every training prompt measured
(:meth:`_Rehearsal.compose`); the experiment shrunk in verl's interpreter by ``_shrink.py`` (:data:`SHRINK_SCRIPT`,
run by :func:`_script`: the small model, the data's first rows, the reward function's calls, the keys nothing reads;
:meth:`_Rehearsal.shrink`); the shrunk corners composed as they run on the CPU
(:meth:`_Rehearsal.check_cpu_corners`); the corners run (:meth:`_Rehearsal.run`); the report
(:meth:`_Rehearsal.finish`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hpo.backends.verl._check import (
    ComposeTimeout,
    VerlConfigError,
    compose_corners,
    compose_timed_out,
    compose_timeout,
    interpreter_problem,
    trial_base_env,
)
from hpo.backends.verl._cpu import cpu_overrides, transfer_queue_overrides
from hpo.backends.verl._rehearse_checks import CornerOutcome, Finding, RehearsalCorner, exit_code, render
from hpo.backends.verl._rehearse_corners import STEPS, _Runner, corner_parallelism
from hpo.experiment import SpaceError

if TYPE_CHECKING:
    from hpo.experiment import Space

SHRINK_SCRIPT = Path(__file__).parent / "_shrink.py"
VAL_ROWS = 8  # validation rows kept (every one is scored by the reward function)
SHRINK_FACTOR = 1.5  # the shrink script's limit: this times the compose limit (900 s by default), plus --reward-timeout
# GPU-only sizes the CPU rehearsal sets to one (each swap is printed when the experiment sets another value).
ONE_DEVICE_KEYS = ("actor_rollout_ref.rollout.tensor_model_parallel_size",
                   "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                   "actor_rollout_ref.ref.ulysses_sequence_parallel_size")

REHEARSAL_SELECT = ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size",
                    *ONE_DEVICE_KEYS)


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

# ----------------------------------------------------------------------------- the steps
def _model_configs(selected: Mapping[str, Any], use_critic: bool) -> dict[str, dict[str, Any]]:
    from hpo.backends.verl._model_config import read_hub_or_local_config

    keys = ["actor_rollout_ref.model.path"]
    if use_critic and selected.get("critic.model.path") not in (None, selected.get(keys[0])):
        keys.append("critic.model.path")
    return {k: read_hub_or_local_config(str(selected.get(k)), k) for k in keys}


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
    reward_timeout_s: float | None = None  # what the reward's calls may take in all (rehearse --reward-timeout)
    reward_called: bool = False  # the compose step called the reward on every distinct ground truth (or its budget)

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

    def compose(self, corners: Sequence[RehearsalCorner],
                gpus: int | None) -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
        """The corners composed by verl for the real study's GPUs (the memory estimate's inputs, the keys the
        rehearsal swaps), every row of the user's data through verl's own data path and the reward on every distinct
        ground truth (as ``validate`` does, the reward's calls within :attr:`reward_timeout_s` in all), and every prompt
        against ``data.max_prompt_length``; None when verl rejects a corner or a row or the reward fails (named in
        the user's own files, before anything is shrunk)."""
        from hpo.backends.verl._data import overlong_verdict
        from hpo.backends.verl._memory import MEASURED_PROMPTS, verl_memory_inputs
        from hpo.backends.verl._rows import row_check_request, row_lines

        space = self.space
        self.say(f"composing {len(corners)} corners, reading every row of the data with verl's own data path and "
                 f"calling the reward function in {self.python}")
        try:
            inputs = verl_memory_inputs(space, [c.overrides for c in corners],
                                        gpus or max(1, space.trial.gpus_per_trial), self.python,
                                        MEASURED_PROMPTS, extra_select=REHEARSAL_SELECT,
                                        check_rows=row_check_request(self.reward_timeout_s))
        except ComposeTimeout as slow:  # this host was too slow: not rehearsed, not failed
            self.findings.append(Finding("config", "unfinished", f"not rehearsed: {slow}"))
            return None
        except SpaceError as bad:
            self.findings.append(Finding("config", "problem", str(bad)))
            return None
        self.reward_called = bool((inputs[0][0].get("rows") or {}).get("reward"))
        for level, where, line in row_lines(space, inputs[0][0].get("rows")):
            check = "reward" if line.startswith(("reward", "called on")) or "reward_function" in where else "data"
            self.findings.append(Finding(check, level, f"{where}: {line}" if level == "problem" else line))
        long = overlong_verdict((inputs[0][0].get("prompt_lengths") or {}).get("overlong"))
        if long is not None:
            self.findings.append(Finding("data", "problem" if long[0] == "problem" else "note", long[1]))
        # A reward that fails is not the end: the next step (the shrink) still finds the faults it alone can (a tuned
        # key that reaches no trainer), and stops there, nothing launched, so one rehearsal names every such fault.
        only_reward = all(f.check == "reward" for f in self.findings if f.level == "problem")
        return None if self.failed() and not only_reward else inputs

    def shrink(self, corner: RehearsalCorner, info: Mapping[str, Any], selected: Mapping[str, Any],
               tokenizer: Path | None, reward_timeout_s: float) -> dict[str, Any] | None:
        """The small model of the same architecture, the data's first rows and the reward function's calls, in
        verl's interpreter (:data:`SHRINK_SCRIPT`): its reply, or None when the rehearsal cannot go on."""
        space = self.space
        try:
            models = _model_configs(selected, bool(info.get("use_critic")))
        except Exception as bad:  # noqa: BLE001 - EstimateError / ModelConfigUnavailable: one line
            path = selected.get("actor_rollout_ref.model.path")
            self.findings.append(Finding("model", "problem", f"{bad}; to rehearse, fetch config.json, tokenizer.json "
                                         f"and tokenizer_config.json of {path} (https://huggingface.co/{path}) into a "
                                         "directory and set --override actor_rollout_ref.model.path=DIR"))
            return None
        set_keys = [*space.overrides, *(p.key for p in space.params)]
        request = {**_config_request(space.config), "overrides": corner.overrides, "out": str(self.home / "shrunk"),
                   "train_rows": max(1, int(selected.get("data.train_batch_size") or 8)) * (STEPS + 1),
                   "val_rows": VAL_ROWS, "tokenizer": str(tokenizer) if tokenizer else None, "models": models,
                   "set_keys": set_keys, "reward_timeout_s": reward_timeout_s,
                   "call_reward": not self.reward_called}  # the rows it keeps were scored already
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
    reward = reply.get("reward") or {}
    found = [Finding("data", "ok", f"data files have the columns verl reads; {reply['data']['train']['rows']} "
                     "training prompts tokenized with the model's chat template")]
    if reward.get("calls"):
        found.append(Finding("reward", "ok", f"{reward['where']} returned finite numbers in {reward['calls']} calls "
                             f"on {reply['data']['val']['rows']} validation rows and the "
                             f"{reply['data']['train'].get('unusual', 0)} training rows with the most unusual ground "
                             f"truths (from {reward.get('min', 0):g} to {reward.get('max', 0):g})"))
    if reward.get("note"):
        found.append(Finding("reward", "note", f"the kept rows: {reward['note']}"))
    return found

