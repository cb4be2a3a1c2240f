"""The entrypoint of a trial's Ray job (:mod:`hpo.execution.ray_jobs._entry`), run as the job runs it (a real
subprocess from the package the job ships, with a trainer that writes good, bad and endless metrics lines): the
metrics lines it echoes read by the driver as the local metrics tail reads the file, a death by signal passed on, the
memory cap enforced on the node. The cluster tests are in ``test_ray_study.py``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hpo.execution import MetricsTail
from hpo.execution.ray_jobs import ENTRY_PACKAGE, JobLog, _entry, entry_package

PY = sys.executable


def run_entry(tmp_path: Path, trainer: str, *opts: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m verl_hpo_ray_entry`` as the job's entrypoint runs it, from the package the job ships."""
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(trainer))
    env = {**os.environ, "PYTHONPATH": str(entry_package().parent)}
    return subprocess.run([PY, "-m", ENTRY_PACKAGE, "--metrics", str(tmp_path / "m" / "metrics.jsonl"), *opts,
                           "--", PY, str(script), str(tmp_path / "m" / "metrics.jsonl")],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


HOSTILE = """
    import json, os, sys, time
    path = sys.argv[1]
    with open(path, "w") as fh:
        for step in range(3):
            fh.write(json.dumps({"step": step, "data": {"eval/reward_mean": step / 10}}) + "\\n"); fh.flush()
            time.sleep(0.3)
        fh.write("not json\\n")
        fh.write('{"step": -1, "data": {}}\\n')
        fh.write("x" * 5000 + "\\n")  # over the line cap
        fh.write('{"step": 3, "data": {"eval/reward_mean": null, "s": "text"}}\\n')
        fh.write('{"step": 4, "data"')  # never completed
    print("trainer output", flush=True)
    print("Traceback (most recent call last):\\nRuntimeError: boom", file=sys.stderr, flush=True)
    sys.exit(3)
"""


def test_the_entrypoint_echoes_metrics_lines_and_the_driver_reads_them_as_the_local_tail(tmp_path: Path) -> None:
    res = run_entry(tmp_path, HOSTILE, "--max-line-bytes", "1000")
    assert res.returncode == 3, res.stderr
    out, mirror = io.StringIO(), io.StringIO()
    log = JobLog(out, mirror)
    records = []
    for i in range(0, len(res.stdout), 37):  # the log arrives in arbitrary chunks
        records += log.feed(res.stdout[i:i + 37])
    log.close()
    local = MetricsTail(tmp_path / "m" / "metrics.jsonl", max_line_bytes=1000)
    expected = local.read()
    assert [s for s, _ in records] == [0, 1, 2, 3] == [s for s, _ in expected]
    assert repr(records) == repr(expected)  # NaN for null, text dropped: parse_line's own rules
    assert log.bad_lines == local.bad_lines == 3  # not JSON, step -1, over the cap
    assert log.end == {"exit": 3, "peak_kb": log.end["peak_kb"], "memory": False}
    assert "trainer output" in out.getvalue() and _entry.PREFIX not in out.getvalue()
    copy = tmp_path / "copy.jsonl"  # the driver-side copy of the good lines reads as the node's file
    copy.write_text(mirror.getvalue())
    assert repr(MetricsTail(copy).read()) == repr(expected)
    assert "RuntimeError: boom" in res.stderr  # the trainer's stderr is the job's, untouched


def test_the_entrypoint_passes_a_signal_death_on_and_enforces_the_memory_cap(tmp_path: Path) -> None:
    killed = run_entry(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert killed.returncode == 128 + 9
    assert json.loads(killed.stdout.split(_entry.END)[1])["exit"] == -9
    hog = run_entry(tmp_path, """
        import time
        blocks = []
        for _ in range(200):
            blocks.append(bytearray(8 * 2**20))
            time.sleep(0.02)
    """, "--memory-limit-bytes", str(100 * 2**20))
    end = json.loads(hog.stdout.split(_entry.END)[1])
    assert end["memory"] is True and end["exit"] == -9 and end["peak_kb"] > 100 * 1024
    assert hog.returncode == 128 + 9


def test_a_restarted_trainer_s_shorter_file_is_read_again_and_a_bad_call_is_exit_2(tmp_path: Path) -> None:
    """A trainer restarted from its checkpoint truncates its metrics file: once the file is shorter than what was read,
    it is read from the start again, whenever the entrypoint happened to look."""
    res = run_entry(tmp_path, """
        import json, sys, time
        path = sys.argv[1]
        with open(path, "w") as fh:  # three long lines, in one write
            fh.write("".join(json.dumps({"step": s, "data": {"x": s, "pad": "p" * 150}}) + "\\n" for s in range(3)))
        time.sleep(0.5)
        with open(path, "w") as fh:  # the restart: one short line
            fh.write(json.dumps({"step": 10, "data": {"x": 10}}) + "\\n")
    """)
    assert res.returncode == 0, res.stderr
    steps = [json.loads(line[len(_entry.PREFIX):])["step"] for line in res.stdout.splitlines()
             if line.startswith(_entry.PREFIX)]
    assert steps[-1] == 10 and steps in ([10], [0, 1, 2, 10]) and _entry.BAD not in res.stdout
    usage = subprocess.run([PY, "-m", ENTRY_PACKAGE, "--metrics", "m.jsonl"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(entry_package().parent)}, timeout=60, cwd=tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: python -m verl_hpo_ray_entry")
