"""The rehearsal's verdicts mean what they say (issue 43 item 1): a corner that ran out of time or that the host
killed is "not finished here" (exit 3), never a failure of the experiment (exit 1); a failed corner's cause is the
root exception from the workers' logs, or "none found" with where the logs are, never a random last line; the
corner limit follows the experiment, and corners run one at a time on a host without the free cores for two."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hpo.backends import load_space
from hpo.backends.verl._data import overlong_verdict
from hpo.backends.verl._rehearse import parse_size
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
from hpo.backends.verl._rehearse_corners import CORNER_TIMEOUT_S, corner_parallelism, corner_timeout
from hpo.execution._runner import RunResult

ROOT = Path(__file__).resolve().parents[3]
SPACE = load_space(str(ROOT / "search_spaces" / "verl_grpo_cpu.yaml"), check=False)
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


def test_the_corner_limit_follows_the_experiment_and_busy_hosts_run_corners_one_at_a_time() -> None:
    assert corner_timeout(SPACE, 120.0) == (120.0, "--corner-timeout")
    timed = dataclasses.replace(SPACE, trial=dataclasses.replace(SPACE.trial, timeout_s=3600.0))
    assert corner_timeout(timed, None) == (3600.0, "trial.timeout_s")
    untimed = dataclasses.replace(SPACE, trial=dataclasses.replace(SPACE.trial, timeout_s=None))
    assert corner_timeout(untimed, None) == (CORNER_TIMEOUT_S, "the default")
    assert corner_parallelism(2, 0.1)[0] == 2  # a quiet 2-core host: two corners at once
    busy, why = corner_parallelism(2, 2.0)  # two CPU-bound processes beside it
    assert busy == 1 and why.startswith("one at a time: 0.0 of 2 cores free, two corners need 1.5"), why
    assert corner_parallelism(16, 3.0)[0] == 2


def test_gpu_sizes_as_typed() -> None:
    assert parse_size("80GiB") == 80 * 2**30 == parse_size("80") == parse_size("80 GB") == parse_size("80g")
    assert parse_size("24576MiB") == 24 * 2**30 and parse_size("1.5T") == int(1.5 * 2**40)
    assert parse_size("lots") is None and parse_size("-3G") is None and parse_size("0") is None


def test_overlong_prompts_are_judged_as_verl_treats_them() -> None:
    found = {"rows": 400, "tokenized": 1, "count": 1, "first": [["/d/train.parquet", 150, 1664]],
             "longest": ["/d/train.parquet", 150, 1664], "capped": False, "limit": 128}
    for truncation in ("error", "left"):  # verl 0.9.1's RL path never reads data.truncation: its agent loop cuts
        level, line = overlong_verdict({**found, "truncation": truncation, "filter": False}) or ("", "")
        assert level == "warning" and "1 of 400 prompts are longer than data.max_prompt_length=128 tokens (first: " \
            "train.parquet row 150: 1664 tokens" in line and "keeps only their last 128 tokens" in line and \
            "raise data.max_prompt_length to 1664" in line, line
    level, line = overlong_verdict({**found, "truncation": "error", "filter": True}) or ("", "")
    assert level == "note" and "filter_overlong_prompts drops them" in line
    assert overlong_verdict({**found, "count": 0}) is None and overlong_verdict(None) is None


def test_a_cpu_rehearsal_gives_the_gpu_estimate_of_the_real_study(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """issue 43 item 7: a study whose trials run on the CPU gets no GPU estimate unless asked (and is told how);
    with ``--gpus 2 --gpu-memory 141GiB`` each corner's estimate is for 2 GPUs of 141 GiB, never "on cuda" for a
    CPU trial."""
    from hpo.backends.verl._rehearse import memory_lines
    from tests.hpo.backends.test_verl_memory import BASE, _fake_inputs

    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    cpu = dataclasses.replace(SPACE, trial=dataclasses.replace(SPACE.trial, memory_limit_gb=None))
    corners = [RehearsalCorner("default", {}, []), RehearsalCorner("high", {}, [])]
    (note,) = memory_lines(cpu, corners, _fake_inputs(BASE)(cpu, [[], []], 1, None, 0))
    assert note.level == "note" and "--gpus N --gpu-memory 80GiB gives one for N GPUs" in note.message
    lines = memory_lines(cpu, corners, _fake_inputs(BASE)(cpu, [[], []], 2, None, 0), 2, 141 * 2**30)
    assert [f.check for f in lines] == ["memory", "memory"], lines
    assert all(f.message.startswith(("corner default on 2 GPU(s): ", "corner high on 2 GPU(s): ")) and
               "budget 141 GiB (a GPU of 141 GiB)" in f.message and "cuda" not in f.message for f in lines), lines
