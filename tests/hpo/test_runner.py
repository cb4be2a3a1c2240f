"""One trial process: metrics tailing, kill of the whole tree, timeout, memory cap, exit classification,
and death together with the driver (PR_SET_PDEATHSIG)."""

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

import psutil
import pytest

from hpo._runner import MetricsTail, TrialProcess, classify_exit, driver_identity, sweep_orphans
from tests.hpo.conftest import FAKE_TRAINER, PY, ROOT, cli_env


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


def wait_gone(tag: str, timeout: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = tagged(tag)
        if not left:
            return []
        time.sleep(0.1)
    return tagged(tag)


def run_fake(tmp_path: Path, *overrides: str, **kw: object) -> tuple[object, str]:
    tag = uuid.uuid4().hex
    env = {**os.environ, "TEST_TAG": tag}
    metrics = tmp_path / "metrics.jsonl"
    argv = [PY, str(FAKE_TRAINER), "train", "--metrics-file", str(metrics), *overrides]
    proc = TrialProcess(argv=argv, env=env, log_dir=tmp_path, metrics_path=metrics, **kw)  # type: ignore[arg-type]
    return proc.run(), tag


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


def test_clean_run_reports_every_step_and_peak_memory(tmp_path: Path) -> None:
    seen: list[int] = []

    def on_metrics(step: int, data: dict[str, object]) -> str | None:
        seen.append(step)
        return None

    result, _ = run_fake(tmp_path, "trainer.total_training_steps=4", on_metrics=on_metrics)
    assert result.exit_code == 0 and result.stop is None and result.failure is None  # type: ignore[attr-defined]
    assert seen == [0, 1, 2, 3, 4]
    assert result.peak_memory_gb > 0 and result.first_metric_s is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize("child", ["group", "session"])
def test_stop_kills_the_whole_tree(tmp_path: Path, child: str) -> None:
    """A decision from on_metrics (prune/converge) kills the trainer and its children, even one that left
    the process group, and even when the trainer ignores SIGTERM."""
    def stop_at_2(step: int, data: dict[str, object]) -> str | None:
        return "pruned" if step == 2 else None

    start = time.monotonic()
    result, tag = run_fake(tmp_path, "trainer.total_training_steps=1000", "fake.step_s=0.05", f"fake.child={child}",
                           "fake.ignore_sigterm=true", on_metrics=stop_at_2)
    assert result.stop == "pruned" and result.last_step == 2  # type: ignore[attr-defined]
    assert wait_gone(tag) == []
    assert time.monotonic() - start < 15


def test_timeout(tmp_path: Path) -> None:
    result, tag = run_fake(tmp_path, "fake.hang_at=1", "fake.child=group", timeout_s=1.5)
    assert result.stop == "timeout" and result.failure == "timeout"  # type: ignore[attr-defined]
    assert 1.5 <= result.wall_time_s < 8  # type: ignore[attr-defined]
    assert wait_gone(tag) == []


def test_memory_cap_is_oom(tmp_path: Path) -> None:
    result, tag = run_fake(tmp_path, "trainer.total_training_steps=200", "fake.step_s=0.05", "fake.alloc_mb=20",
                           memory_limit_gb=0.15)
    assert result.stop == "memory" and result.failure == "oom"  # type: ignore[attr-defined]
    assert result.peak_memory_gb > 0.15  # type: ignore[attr-defined]
    assert wait_gone(tag) == []


@pytest.mark.parametrize(("override", "failure", "needle"), [
    ("fake.oom_at=2", "oom", "MemoryError"),
    ("fake.sigkill_at=2", "oom", ""),
    ("fake.crash_at=2", "crash", "RuntimeError: fake crash"),
    ("fake.bad=1", "crash", "error: fake.bad"),
])
def test_exit_classification(tmp_path: Path, override: str, failure: str, needle: str) -> None:
    result, _ = run_fake(tmp_path, override)
    assert result.stop is None and result.failure == failure  # type: ignore[attr-defined]
    assert needle in result.stderr_tail  # type: ignore[attr-defined]


def test_classify_exit_markers() -> None:
    assert classify_exit(-9, "") == "oom"
    assert classify_exit(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == "oom"
    assert classify_exit(1, "ValueError: nope") == "crash"
    assert classify_exit(-11, "") == "crash"


def test_stop_event_interrupts(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    result, tag = run_fake(tmp_path, "fake.hang_at=1", stop_event=stop)
    assert result.stop == "interrupted"  # type: ignore[attr-defined]
    assert wait_gone(tag) == []


DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from hpo._runner import TrialProcess, driver_identity
    out = Path(sys.argv[1])
    env = {**os.environ, "VERL_HPO_STUDY": sys.argv[2], "VERL_HPO_DRIVER": json.dumps(driver_identity())}
    argv = [sys.executable, sys.argv[3], "train", "--metrics-file", str(out / "m.jsonl"), "fake.hang_at=1"]
    if sys.argv[4] != "none":
        argv.append("fake.child=" + sys.argv[4])
    TrialProcess(argv=argv, env=env, log_dir=out, metrics_path=out / "m.jsonl").run()
""")


@pytest.mark.parametrize("child", ["none", "group"])
def test_trial_dies_with_a_sigkilled_driver(tmp_path: Path, child: str) -> None:
    """PR_SET_PDEATHSIG kills the trainer when the driver is SIGKILLed; grandchildren (if any) are swept
    by the next driver of the study (sweep_orphans)."""
    tag, study = uuid.uuid4().hex, f"s-{uuid.uuid4().hex[:8]}"
    args = [PY, "-c", DRIVER, str(tmp_path), study, str(FAKE_TRAINER), child]
    driver = subprocess.Popen(args, cwd=ROOT, env=cli_env(TEST_TAG=tag))
    deadline = time.monotonic() + 20
    while not (tmp_path / "m.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    trainer = [p for p in tagged(tag) if p.pid != driver.pid and str(FAKE_TRAINER) in " ".join(p.cmdline())]
    assert trainer, "trainer did not start"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert psutil.wait_procs(trainer, timeout=3)[1] == [], "trainer survived its driver"
    if child == "group":
        sweep_orphans(study)
    assert wait_gone(tag) == []


def test_identity_of_this_process() -> None:
    ident = driver_identity()
    assert ident["pid"] == os.getpid() and ident["started"] > 0
    assert sys.platform != "linux" or os.path.exists(f"/proc/{os.getpid()}")
