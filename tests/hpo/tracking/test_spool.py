"""The spool a driver writes and its tracking process reads (:mod:`hpo.tracking._spool`): complete lines only, each
read once, a torn or foreign line never an event; one file per driver; one tracking process per spool (its lock)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from hpo.tracking._spool import (
    SpoolReader,
    SpoolWriter,
    is_locked,
    sidecar,
    spool_driver,
    spool_lock,
    spool_path,
    tracking_dir,
)


def test_events_are_read_once_each_and_a_torn_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tracking_dir(tmp_path, "s") / "spool-h-1-0.jsonl"
    writer, reader = SpoolWriter(path), SpoolReader(path)  # the writer makes the directory
    assert reader.read() == []
    writer.event("start", trial=0)
    writer.event("finish", trial=0)
    first = reader.read()
    assert [(e["ev"], e["trial"]) for e in first] == [("start", 0), ("finish", 0)]
    assert all(isinstance(e["t"], float) for e in first)
    assert reader.read() == []
    with path.open("a") as fh:
        fh.write('{"ev": "start", "tri')  # a line being written
    assert reader.read() == []
    with path.open("a") as fh:
        fh.write('al": 1}\nnot json\n[1, 2]\n{"no_ev": 1}\n{"ev": "end"}\n')
    assert reader.read() == [{"ev": "start", "trial": 1}, {"ev": "end"}]  # junk skipped, never an event
    writer.close()
    writer.event("start", trial=2)  # after close: dropped, not an error
    assert reader.read() == []


def test_lines_written_by_many_threads_are_never_interleaved(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    writer = SpoolWriter(path)

    def burst(k: int) -> None:
        for i in range(200):
            writer.event("start", trial=k * 1000 + i, pad="x" * 500)

    threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    events = SpoolReader(path).read()
    assert len(events) == 800 and len({e["trial"] for e in events}) == 800


def test_each_driver_has_a_spool_of_its_own_with_its_sidecars_beside_it(tmp_path: Path) -> None:
    one = spool_path(tmp_path, {"host": "node/1 a", "pid": 42, "started": 1700000000.9})
    assert one.name == "spool-node_1_a-42-1700000000.jsonl" and one.parent == tmp_path
    assert spool_path(tmp_path, {"host": "node/1 a", "pid": 43, "started": 1700000000.9}) != one
    assert sidecar(one, ".state.json").name == "spool-node_1_a-42-1700000000.state.json"
    assert sidecar(one, ".lock").parent == tmp_path


def test_a_spool_s_name_gives_back_its_driver_s_host_pid_and_start_second(tmp_path: Path) -> None:
    one = spool_path(tmp_path, {"host": "gpu-node-3.lan", "pid": 42, "started": 1700000000.9})
    assert spool_driver(one) == ("gpu-node-3.lan", 42, 1700000000)
    for foreign in ("spool-x.jsonl", "spool-h-1.jsonl", "spool--1-0.jsonl", "spool-h-x-0.jsonl"):
        assert spool_driver(tmp_path / foreign) is None, foreign


def test_one_tracking_process_per_spool(tmp_path: Path) -> None:
    """The lock is the kernel's (flock): another process sees it held while this one holds it, and free after."""
    spool = tmp_path / "spool-h-1-0.jsonl"
    probe = [sys.executable, "-c", "import sys; from pathlib import Path; from hpo.tracking._spool import is_locked; "
             "print(is_locked(Path(sys.argv[1])))", str(spool)]
    root = str(Path(__file__).resolve().parents[3])

    def run() -> str:
        return subprocess.run(probe, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": root},
                              check=True).stdout.strip()

    assert not is_locked(spool)
    with spool_lock(spool, wait=False) as got:
        assert got
        assert run() == "True"
        with spool_lock(spool, wait=False) as second:  # flock: a second descriptor, even in this process
            assert not second
    assert run() == "False" and not is_locked(spool)
