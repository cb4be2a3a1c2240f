"""The rehearsal's verdicts mean what they say (issue 43 item 1; ``hpo/backends/verl/_rehearse_checks.py``): a corner
that ran out of time or that the host killed is "not finished here" (exit 3), never a failure of the experiment (exit
1); a failed corner's cause is the root exception from the workers' logs, or "none found" with where the logs are,
never a random last line; a quick rehearsal says the resume was not checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hpo.backends import load_space
from hpo.backends.verl._rehearse_checks import (
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_UNFINISHED,
    CornerOutcome,
    Finding,
    RehearsalCorner,
    check_runs,
    exit_code,
    failure_line,
    render,
    root_cause,
)
from hpo.execution._runner import RunResult
from tests.hpo.backends.verl.conftest import CPU_SPACE

SPACE = load_space(str(CPU_SPACE), check=False)
# what verl 0.9.1 printed last on the busy host of issue 43: a warning of TransferQueue's and a logging.cc frame
UNRELATED_TAIL = ("WARNING 12-02 10:14:03 transfer_queue: 4 storage units but only 2 threads available\n"
                  "*** SIGTERM received at time=1764670443 on cpu 1 ***\n"
                  "    @     0x7f3c8a1b2c3d  (unknown)  absl::log_internal::LogMessage::~LogMessage() logging.cc:98\n")


def _result(exit_code: int | None, stop: str | None = None, wall: float = 900.0, tail: str = UNRELATED_TAIL,
            final: str | None = None) -> RunResult:
    return RunResult(exit_code, stop, 0.5, wall, 40.0, None, tail, final_exception=final)


def _outcome(tmp_path: Path, name: str, result: RunResult, records: list[dict] | None = None,
             timeout_s: float | None = 900.0) -> CornerOutcome:
    trial_dir = tmp_path / name
    trial_dir.mkdir(exist_ok=True)
    (trial_dir / "stdout.log").write_text("")
    (trial_dir / "stderr.log").write_text(result.stderr_tail)
    o = CornerOutcome(RehearsalCorner(name, {"lr": 1e-5}, []), trial_dir, 0, timeout_s=timeout_s)
    o.results.append(result)
    o.records.append(records or [])
    return o


STEP0 = [{"step": 0, "data": {"val-core/arith/reward/mean@1": 0.0}}]


def test_a_corner_that_ran_out_of_time_is_not_finished_here_not_a_failure(tmp_path: Path) -> None:
    slow = _outcome(tmp_path, "default", _result(-15, "timeout"), STEP0)
    findings = check_runs(SPACE, [slow])
    run = [f for f in findings if f.check == "run"]
    assert [f.level for f in run] == ["unfinished"], findings
    assert "not rehearsed: it ran out of the corner's time limit (900 s; --corner-timeout S gives it more) after " \
           "verl's step-0 validation, 900 s in" in run[0].message and "says nothing against the experiment" in \
           run[0].message, run[0].message
    assert "transfer_queue" not in run[0].message and "logging.cc" not in run[0].message
    # its resume was not rehearsed either, and says so
    assert [f.level for f in findings if f.check == "resume"][0] == "unfinished"
    assert exit_code(findings) == EXIT_UNFINISHED == 3
    text = render(SPACE, [], findings, "text", 950, tmp_path)
    assert "NOT FINISHED HERE: 1 corner(s) could not finish on this machine" in text.splitlines()[0]
    assert "FAIL" not in text.splitlines()[0] and "NOT RUN  run: corner default" in text


def test_a_host_kill_is_not_finished_here_and_a_real_failure_still_fails(tmp_path: Path) -> None:
    killed = _outcome(tmp_path, "low", _result(-9, None, 300), [*STEP0, {"step": 1, "data": {"actor/lr": 1e-6}}])
    oom = _outcome(tmp_path, "high", dataclasses.replace(_result(-9, None, 200), kernel_oom=True))
    findings = check_runs(SPACE, [killed, oom], resumed=False)
    run = {f.message.split()[1]: f for f in findings if f.check == "run"}
    assert run["low"].level == "unfinished" and "killed by the host (SIGKILL, not sent by the rehearsal)" in \
        run["low"].message and "1 training step(s) (last: 1)" in run["low"].message
    assert run["high"].level == "unfinished" and "kernel OOM killer" in run["high"].message
    assert exit_code(findings) == EXIT_UNFINISHED
    crashed = _outcome(tmp_path, "default", _result(1, None, 60, final="ValueError: bad reward"))
    both = check_runs(SPACE, [crashed, killed])
    assert exit_code(both) == EXIT_FAIL  # a problem wins over "could not finish"
    assert render(SPACE, [], both, "text", 1, tmp_path).splitlines()[0].startswith(
        f"rehearsal of {SPACE.source}: FAIL: 1 problem(s)")
    assert exit_code([Finding("run", "ok", "fine"), Finding("memory", "note", "n")]) == EXIT_PASS


def test_ray_that_could_not_start_on_a_busy_host_is_not_finished_here(tmp_path: Path) -> None:
    """verl's main_ppo starts a local Ray node; on a host too busy for it Ray gives up ("The current node timed out
    during startup", seen on 2 cores with two other verl runs beside the rehearsal): not rehearsed, not a failure of
    the experiment (exit 3, and the objective it could not check is not a problem either). The same exception
    raised by the experiment's own code after Ray started is not Ray's start-up."""
    ray_line = ("Exception: The current node timed out during startup. This could happen because some of the raylet "
                "failed to startup or the GCS has become overloaded.")
    crashed = _outcome(tmp_path, "default", _result(1, None, 64, final=ray_line))
    (crashed.trial_dir / "stdout.log").write_text("Traceback (most recent call last):\n  File \"node.py\", line "
                                                  f"441, in _wait_for_startup\n{ray_line}\n")
    findings = check_runs(SPACE, [crashed], resumed=False)
    (run,) = [f for f in findings if f.check == "run"]
    assert run.level == "unfinished" and "could not start Ray on this machine in time" in run.message and \
        "before verl logged its first metrics line" in run.message, run.message
    assert [f.level for f in findings if f.check == "objective"] == ["unfinished"], findings
    assert exit_code(findings) == EXIT_UNFINISHED
    other = _outcome(tmp_path, "low", _result(1, None, 64, final="Exception: the reward server timed out"))
    assert exit_code(check_runs(SPACE, [other], resumed=False)) == EXIT_FAIL


def test_the_root_cause_comes_from_the_workers_tracebacks(tmp_path: Path) -> None:
    """Ray prints a worker's traceback into the driver's output with its ``(Actor pid=N)`` prefix, wrapped in
    RayTaskError: the cause is the worker's own exception (a bare AssertionError too), not the wrapper, not a
    warning line before it."""
    (tmp_path / "stdout.log").write_text(
        "(TaskRunner pid=4242) UserWarning: something benign: ValueError: not this one\n"
        "Error executing job with overrides: []\n"
        "Traceback (most recent call last):\n"
        '  File "main_ppo.py", line 42, in main\n'
        "    run_ppo(config)\n"
        "ray.exceptions.RayTaskError(KeyError): ray::TaskRunner.run() (pid=4242, ip=10.0.0.1)\n"
        "(TaskRunner pid=4242) Traceback (most recent call last):\n"
        '(TaskRunner pid=4242)   File "/u/reward.py", line 3, in compute_score\n'
        "(TaskRunner pid=4242)     return table[ground_truth]\n"
        "(TaskRunner pid=4242) KeyError: 'answer'\n")
    (tmp_path / "stderr.log").write_text(UNRELATED_TAIL)
    assert root_cause(tmp_path) == "KeyError: 'answer'"
    (tmp_path / "stdout.log").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                         "    assert n > 0\nAssertionError\n")
    assert root_cause(tmp_path) == "AssertionError"
    # no traceback anywhere: says so and where the logs are, never the last line of output
    (tmp_path / "stdout.log").write_text("step 0 done\n")
    line = failure_line(_result(1), tmp_path)
    assert line.startswith("no exception found in its logs (") and str(tmp_path) in line and "logging.cc" not in line
    assert failure_line(_result(1, final="RuntimeError: boom"), tmp_path) == "RuntimeError: boom"


def test_quick_says_the_resume_was_not_checked() -> None:
    notes = [f for f in check_runs(SPACE, [], resumed=False) if f.check == "resume"]
    assert [f.level for f in notes] == ["note"] and "not checked (--quick)" in notes[0].message
