"""One trial process: metrics tailing, kill of the whole tree (escaped descendants included), timeout, the memory
cap and peak with every mechanism this machine offers, honest exit labels, and death together with the driver.
All with real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from hpo.execution import TrialRun, _cgroup
from hpo.execution._identity import driver_identity
from hpo.execution._runner import (
    MetricsTail,
    RunResult,
    TrialProcess,
    classify_exit,
    final_exception,
    kill_tree,
)
from tests.hpo.conftest import FAKE_TRAINER, PY, ROOT, cli_env

# every mechanism this machine offers: polling always, a cgroup where the kernel lets us create one
MECHANISMS = ["poll"] + [m for m in ("cgroup-v2", "cgroup-v1") if _cgroup.mechanism(m) is not None]
WAIT_S = 60.0  # waits on a state end when it holds: this long only guards against a hang (a busy machine is slow)


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries TEST_TAG=tag (trial processes and their children)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def trainers(tag: str) -> list[psutil.Process]:
    """The tagged trainer processes (not the wrapper, not the grandchildren)."""
    out = []
    for p in tagged(tag):
        try:
            cmd = p.cmdline()
        except psutil.NoSuchProcess:
            continue
        if len(cmd) > 1 and cmd[1] in (str(FAKE_TRAINER), "-c"):
            out.append(p)
    return out


def wait_gone(tag: str, timeout: float = WAIT_S) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = tagged(tag)
        if not left:
            return []
        time.sleep(0.1)
    return tagged(tag)


def run_argv(tmp_path: Path, argv: list[str], memory_mechanism: str | None = None,
             **kw: Any) -> tuple[RunResult, str]:
    tag = uuid.uuid4().hex
    env = {**os.environ, "TEST_TAG": tag}
    metrics = tmp_path / "metrics.jsonl"
    argv = [a.replace("{metrics}", str(metrics)) for a in argv]
    return TrialProcess(TrialRun(argv, env, tmp_path, metrics, **kw), memory_mechanism=memory_mechanism).run(), tag


def run_fake(tmp_path: Path, *overrides: str, **kw: Any) -> tuple[RunResult, str]:
    return run_argv(tmp_path, [PY, str(FAKE_TRAINER), "train", "--metrics-file", "{metrics}", *overrides], **kw)


def test_metrics_tail_reads_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # file not there yet
    with path.open("w") as fh:
        fh.write(json.dumps({"step": 0, "data": {"a": 1}}) + "\n" + '{"step": 1, "da')
    assert tail.read() == [(0, {"a": 1})]
    with path.open("a") as fh:
        fh.write('ta": {"a": 2}}\nnot json\n{"step": 2}\n')
    assert tail.read() == [(1, {"a": 2})]
    assert tail.bad_lines == 2


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_clean_run_reports_every_step_and_peak_memory(tmp_path: Path, mechanism: str) -> None:
    seen: list[int] = []

    def on_metrics(step: int, data: dict[str, object]) -> str | None:
        seen.append(step)
        return None

    result, tag = run_fake(tmp_path, "trainer.total_training_steps=4", on_metrics=on_metrics,
                           memory_mechanism=mechanism)
    assert result.exit_code == 0 and result.stop is None and result.failure is None
    assert seen == [0, 1, 2, 3, 4]
    assert result.peak_memory_gb > 0 and result.first_metric_s is not None
    assert result.memory_mechanism == mechanism
    assert (result.cgroup_peak_gb is not None) == mechanism.startswith("cgroup")
    assert not (tmp_path / ".wrapper-status.json").exists()
    assert wait_gone(tag) == []


@pytest.mark.parametrize("child", ["group", "session"])
def test_stop_kills_the_whole_tree(tmp_path: Path, child: str) -> None:
    """A decision from on_metrics (prune/converge) kills the trainer and its children, even one that left
    the process group, and even when the trainer ignores SIGTERM."""
    def stop_at_2(step: int, data: dict[str, object]) -> str | None:
        return "pruned" if step == 2 else None

    result, tag = run_fake(tmp_path, "trainer.total_training_steps=1000", "fake.step_s=0.05", f"fake.child={child}",
                           "fake.ignore_sigterm=true", on_metrics=stop_at_2)
    assert result.stop == "pruned" and result.last_step == 2 and result.failure is None
    assert result.exit_code == -signal.SIGKILL  # killed: not the 1,000 steps' end of a trainer deaf to SIGTERM
    assert wait_gone(tag) == []


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_escaped_grandchild_is_killed_after_a_clean_exit(tmp_path: Path, mechanism: str) -> None:
    """A grandchild in its own session (setsid) outlives nothing: the trainer exits 0, the grandchild dies."""
    result, tag = run_fake(tmp_path, "trainer.total_training_steps=2", "fake.child=session",
                           memory_mechanism=mechanism)
    assert result.exit_code == 0 and result.failure is None
    assert wait_gone(tag) == []
    assert result.leftovers_killed == 1


@pytest.mark.timeout(300)  # a timeout that never fires fails here, not after the trainer's hour
def test_timeout(tmp_path: Path) -> None:
    result, tag = run_fake(tmp_path, "fake.hang_at=1", "fake.child=group", timeout_s=1.5)
    assert result.stop == "timeout" and result.failure == "timeout"
    assert result.exit_code == -signal.SIGTERM  # stopped by the driver, where it would have slept an hour
    assert result.wall_time_s >= 1.5  # not before its time (a slow machine only takes longer)
    assert wait_gone(tag) == []


def test_timeout_is_not_delayed_by_a_blocked_metrics_callback(tmp_path: Path) -> None:
    """The callback (a storage write on a busy database) blocks until the trainer is gone: the 1 s timeout kills
    the trainer meanwhile, without waiting for the callback to return."""
    tag_box: list[str] = []
    gone_while_blocked: list[bool] = []

    def blocked(step: int, data: dict[str, object]) -> str | None:
        deadline = time.monotonic() + WAIT_S  # a hang guard: the timeout kills the trainer long before
        while time.monotonic() < deadline and trainers(tag_box[0]):
            time.sleep(0.05)
        gone_while_blocked.append(not trainers(tag_box[0]))
        return None

    tag_box.append(uuid.uuid4().hex)
    metrics = tmp_path / "metrics.jsonl"
    result = TrialProcess(TrialRun([PY, str(FAKE_TRAINER), "train", "--metrics-file", str(metrics), "fake.hang_at=1"],
                                   {**os.environ, "TEST_TAG": tag_box[0]}, tmp_path, metrics,
                                   timeout_s=1.0, on_metrics=blocked)).run()
    assert result.stop == "timeout"
    assert gone_while_blocked[:1] == [True], gone_while_blocked  # killed while the first call still blocked


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_memory_cap_is_oom(tmp_path: Path, mechanism: str) -> None:
    result, tag = run_fake(tmp_path, "trainer.total_training_steps=200", "fake.step_s=0.05", "fake.alloc_mb=20",
                           memory_limit_gb=0.15, memory_mechanism=mechanism)
    assert result.stop == "memory" and result.failure == "oom"
    assert result.memory_mechanism == mechanism
    if mechanism == "poll":
        assert result.peak_memory_gb > 0.15
    else:  # the kernel enforced it: nothing above the cap was ever charged
        assert result.kernel_oom and result.exit_code == -signal.SIGKILL
        assert result.cgroup_peak_gb is not None and 0.13 < result.cgroup_peak_gb <= 0.15
    assert wait_gone(tag) == []


SPIKE = textwrap.dedent("""
    import json, sys, time
    metrics, mb, hold = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    def line(step):
        with open(metrics, "a") as fh:
            fh.write(json.dumps({"step": step, "data": {}}) + "\\n")
    line(0)
    time.sleep(0.5)
    block = bytearray(int(mb * 2**20))
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    time.sleep(hold)
    del block
    time.sleep(1.0)
    line(1)
""")


def _blocked_callback(seconds: float) -> Any:
    def on_metrics(step: int, data: dict[str, object]) -> str | None:
        if step == 0:
            time.sleep(seconds)  # e.g. a storage write waiting on a locked SQLite file
        return None
    return on_metrics


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_short_spike_over_the_cap_is_caught_while_the_callback_blocks(tmp_path: Path, mechanism: str) -> None:
    """A 0.2 s spike of 400 MB under a 0.1 GB cap, while the metrics callback is stuck for 5 s."""
    result, tag = run_argv(tmp_path, [PY, "-c", SPIKE, "{metrics}", "400", "0.2"], memory_limit_gb=0.1,
                           memory_mechanism=mechanism, on_metrics=_blocked_callback(5))
    assert result.stop == "memory" and result.failure == "oom", result
    assert result.last_step == 0  # killed before it got to step 1
    if mechanism == "poll":  # caught while the pages were being touched, or right after
        assert result.peak_memory_gb > 0.1
    assert wait_gone(tag) == []


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_peak_memory_sees_a_short_spike_while_the_callback_blocks(tmp_path: Path, mechanism: str) -> None:
    """No cap: a 0.2 s spike of 600 MB is in the recorded peak although nobody polled during it."""
    result, _ = run_argv(tmp_path, [PY, "-c", SPIKE, "{metrics}", "600", "0.2"], memory_mechanism=mechanism,
                         on_metrics=_blocked_callback(5))
    assert result.exit_code == 0 and result.failure is None and result.last_step == 1
    assert 0.58 < result.peak_memory_gb < 1.0
    if mechanism != "poll":
        assert result.cgroup_peak_gb is not None and result.cgroup_peak_gb > 0.58


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_spike_in_a_short_lived_child_is_oom(tmp_path: Path, mechanism: str) -> None:
    """A child that goes 200 MB over a 0.1 GB cap and exits at once (maybe between two samples) while the
    trainer carries on: killed by the kernel (cgroup), or found in the child's peak RSS at the end (poll)."""
    code = ("import subprocess, sys, time; subprocess.run([sys.executable, '-c', "
            "'b = bytearray(300 * 2**20); b[::4096] = b\"x\" * len(b[::4096])']); time.sleep(0.3)")
    result, _ = run_argv(tmp_path, [PY, "-c", code], memory_limit_gb=0.1, memory_mechanism=mechanism)
    assert result.stop == "memory" and result.failure == "oom", result


# ----------------------------------------------------------------------------- labels
CRASH_AFTER_OOM_TEXT = textwrap.dedent("""
    import sys
    print("warning: CUDA out of memory on the first try, retrying with a smaller batch", file=sys.stderr)
    try:
        raise MemoryError("first attempt")
    except MemoryError:
        pass
    raise ValueError("batch size must be positive")
""")


@pytest.mark.parametrize(("argv", "failure", "needle"), [
    ([PY, str(FAKE_TRAINER), "train", "fake.oom_at=2"], "oom", "MemoryError"),
    ([PY, str(FAKE_TRAINER), "train", "fake.sigkill_at=2"], "killed", ""),  # SIGKILL alone is no OOM
    ([PY, str(FAKE_TRAINER), "train", "fake.crash_at=2"], "crash", "RuntimeError: fake crash"),
    ([PY, str(FAKE_TRAINER), "train", "fake.bad=1"], "crash", "error: fake.bad"),
    ([PY, "-c", CRASH_AFTER_OOM_TEXT], "crash", "CUDA out of memory"),
    ([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], "crash", ""),
    ([PY, "-c", "raise SystemExit(137)"], "killed", ""),
], ids=["MemoryError", "sigkill", "crash", "exit2", "oom-text-then-ValueError", "segv", "exit137"])
def test_exit_labels(tmp_path: Path, argv: list[str], failure: str, needle: str) -> None:
    result, _ = run_argv(tmp_path, argv)
    assert result.stop is None and result.failure == failure, result
    assert needle in result.stderr_tail
    assert not result.kernel_oom


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sigkill_by_someone_else_is_killed_not_oom(tmp_path: Path, mechanism: str) -> None:
    """A user's kill -9 (or a scheduler's, or another driver's sweep) reads -9 through the wrapper: 'killed'."""
    tag = uuid.uuid4().hex

    def killer() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = trainers(tag)
            if found:
                found[0].kill()
                return
            time.sleep(0.05)

    threading.Thread(target=killer, daemon=True).start()
    metrics = tmp_path / "metrics.jsonl"
    result = TrialProcess(TrialRun([PY, str(FAKE_TRAINER), "train", "--metrics-file", str(metrics), "fake.hang_at=1"],
                                   {**os.environ, "TEST_TAG": tag}, tmp_path, metrics),
                          memory_mechanism=mechanism).run()
    assert result.exit_code == -signal.SIGKILL and result.stop is None
    assert result.failure == "killed" and not result.kernel_oom


def test_exit_status_passes_through_the_wrapper(tmp_path: Path) -> None:
    for code, expected in (("sys.exit(3)", 3), ("os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
                           ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL), ("pass", 0)):
        result, _ = run_argv(tmp_path, [PY, "-c", f"import os, signal, sys; {code}"])
        assert result.exit_code == expected, code
    with pytest.raises(FileNotFoundError):  # as Popen itself would raise
        run_argv(tmp_path, ["/nonexistent/trainer", "train"])


def test_classify_exit() -> None:
    assert classify_exit(-9, "") == "killed"
    assert classify_exit(137, "") == "killed"
    assert classify_exit(-15, "") == "killed"
    assert classify_exit(-9, "", kernel_oom=True) == "oom"
    assert classify_exit(-11, "") == "crash"
    assert classify_exit(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == "oom"
    assert classify_exit(1, "ValueError: nope") == "crash"
    tb = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\n{exc}\nshutting down\n"
    assert classify_exit(1, tb.format(exc="MemoryError")) == "oom"
    assert classify_exit(1, tb.format(exc="RuntimeError: CUDA error: out of memory")) == "oom"
    assert classify_exit(1, tb.format(exc="torch.cuda.OutOfMemoryError: CUDA out of memory.")) == "oom"
    # an OOM text in the output (or an earlier, handled OOM traceback) does not make a later error an OOM
    oom_then_value = tb.format(exc="MemoryError") + "out of memory\n" + tb.format(exc="ValueError: bad lr")
    assert classify_exit(1, oom_then_value) == "crash"
    assert classify_exit(1, "CUDA out of memory, retrying\n" + tb.format(exc="ValueError: x")) == "crash"


def test_final_exception() -> None:
    chained = ("Traceback (most recent call last):\n  File \"a\", line 1\nKeyError: 'x'\n\n"
               "During handling of the above exception, another exception occurred:\n\n"
               "Traceback (most recent call last):\n  File \"b\", line 2\n    g()\n    ^^^\n"
               "torch.OutOfMemoryError: CUDA out of memory.\n")
    assert final_exception(chained) == "torch.OutOfMemoryError: CUDA out of memory."
    ranked = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"t.py\", line 3, in <module>\n"
              "[rank0]: RuntimeError: NCCL error\nother output\n")
    assert final_exception(ranked) == "RuntimeError: NCCL error"
    assert final_exception("  File \"t.py\", line 9, in f\n    x()\nMemoryError\n") == "MemoryError"  # header cut off
    assert final_exception("step:3 - loss:0.1\nerror: bad value\n") is None
    cpp = "terminate called after throwing an instance of 'c10::OutOfMemoryError'\n  what():  CUDA out of memory"
    assert classify_exit(-6, cpp) == "oom"


# ----------------------------------------------------------------------------- kill_tree, spawning
def test_kill_tree_never_signals_a_reaped_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the leader is reaped its pid (= the group id) may belong to someone else: no killpg then."""
    popen = subprocess.Popen([PY, "-c", "pass"], start_new_session=True)
    popen.wait()
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: calls.append((pgid, sig)))
    kill_tree(popen, grace_s=0.1)
    assert calls == []


def test_no_preexec_fn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """preexec_fn is unsafe while the driver runs threads (n_jobs, heartbeats): never used."""
    seen: list[dict[str, Any]] = []
    real = subprocess.Popen

    class Spy(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    result, _ = run_fake(tmp_path, "trainer.total_training_steps=1")
    assert result.exit_code == 0
    assert seen and all(kw.get("preexec_fn") is None for kw in seen)
    assert all(kw.get("start_new_session") for kw in seen)


def test_stop_event_interrupts(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    result, tag = run_fake(tmp_path, "fake.hang_at=1", stop_event=stop)
    assert result.stop == "interrupted"
    assert wait_gone(tag) == []


DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from hpo.execution._identity import driver_identity
    from hpo.execution import TrialProcess, TrialRun
    out = Path(sys.argv[1])
    env = {**os.environ, "VERL_HPO_STUDY": sys.argv[2], "VERL_HPO_DRIVER": json.dumps(driver_identity())}
    argv = [sys.executable, sys.argv[3], "train", "--metrics-file", str(out / "m.jsonl"), "fake.hang_at=1"]
    if sys.argv[4] != "none":
        argv.append("fake.child=" + sys.argv[4])
    TrialProcess(TrialRun(argv, env, out, out / "m.jsonl"), memory_mechanism=sys.argv[5]).run()
""")


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("child", ["none", "group", "session"])
def test_whole_trial_dies_with_a_sigkilled_driver(tmp_path: Path, child: str, mechanism: str) -> None:
    """After a SIGKILL of the driver, the trainer and its grandchildren (also one in its own session) die with it,
    without waiting for a later driver to sweep them; the trial's cgroup goes too."""
    tag, study = uuid.uuid4().hex, f"s-{uuid.uuid4().hex[:8]}"
    args = [PY, "-c", DRIVER, str(tmp_path), study, str(FAKE_TRAINER), child, mechanism]
    driver = subprocess.Popen(args, cwd=ROOT, env=cli_env(TEST_TAG=tag))
    deadline = time.monotonic() + WAIT_S
    while not (tmp_path / "m.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    want = 2 if child == "none" else 3
    procs = [p for p in tagged(tag) if p.pid != driver.pid]
    while len(procs) < want and time.monotonic() < deadline:  # the grandchild starts a moment after the first line
        time.sleep(0.05)
        procs = [p for p in tagged(tag) if p.pid != driver.pid]
    assert len(procs) == want, "wrapper, trainer (and grandchild) did not start"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert psutil.wait_procs(procs, timeout=WAIT_S)[1] == [], "part of the trial survived its driver"
    found = _cgroup.mechanism(mechanism) if mechanism != "poll" else None
    if found is not None:
        assert not list(found.parent.glob(f"{_cgroup.PREFIX}{driver.pid}.*"))


def test_identity_of_this_process() -> None:
    ident = driver_identity()
    assert ident["pid"] == os.getpid() and ident["started"] > 0
    assert sys.platform != "linux" or os.path.exists(f"/proc/{os.getpid()}")


STEPS_OUT_OF_ORDER = """\
import json, sys
with open(sys.argv[1], "w") as fh:
    for step in (0, 5, 3):
        fh.write(json.dumps({"step": step, "data": {"a": step}}) + "\\n")
"""


def test_last_step_is_the_highest_step_not_the_last_line(tmp_path: Path) -> None:
    seen: list[int] = []
    result, _ = run_argv(tmp_path, [PY, "-c", STEPS_OUT_OF_ORDER, "{metrics}"],
                         on_metrics=lambda step, data: seen.append(step))
    assert seen == [0, 5, 3] and result.exit_code == 0
    assert result.last_step == 5


REPLACES_ITS_LOGS = """\
import os, sys
for name in ("stderr.log", ".wrapper-status.json"):
    path = os.path.join(sys.argv[1], name)
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path)
sys.exit(3)
"""


@pytest.mark.timeout(120)
def test_a_trial_that_puts_fifos_in_place_of_its_logs_cannot_hang_the_driver(tmp_path: Path) -> None:
    """The driver reads the stderr tail and the wrapper's status from the trial's directory: a FIFO there used to
    block the wrapper's write (until the driver killed it) and then the driver's own read, for ever."""
    result, _ = run_argv(tmp_path, [PY, "-c", REPLACES_ITS_LOGS, str(tmp_path)])
    # exit 3: the wrapper wrote its status and exited with the trainer's code; one blocked on the FIFO would have
    # been SIGKILLed by the driver (after KILL_GRACE_S + 10 s); a driver's read that blocks: the timeout above
    assert result.exit_code == 3 and result.stderr_tail == "" and result.failure == "crash"
