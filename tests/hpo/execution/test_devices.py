"""GPUs for trials (:mod:`hpo.execution._devices`): which exist (the driver's ``CUDA_VISIBLE_DEVICES``), where the
locks live, and a pool that hands each trial its devices under a kernel ``flock`` per device, so that two pools of
one host (two drivers, here two pools and a separate process) never hand out the same device, and a holder that dies
frees it. No GPU is needed: the pool locks names."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from hpo.execution._devices import ENV_RUNTIME_DIR, DevicePool, detect_devices, runtime_dir


def test_the_visible_devices_are_the_driver_s_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 2,,GPU-abc")
    assert detect_devices() == ["0", "2", "GPU-abc"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # CUDA's "none"
    assert detect_devices() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_devices() == []


def test_the_runtime_dir_is_the_setting_then_xdg_then_a_private_tmp_dir(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_RUNTIME_DIR, str(tmp_path / "mine"))
    assert runtime_dir() == tmp_path / "mine" and (tmp_path / "mine").is_dir()
    monkeypatch.delenv(ENV_RUNTIME_DIR)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert runtime_dir() == tmp_path / "xdg" / "verl-hpo"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    path = runtime_dir()
    assert path == tmp_path / f"verl-hpo-{os.getuid()}" and stat.S_IMODE(path.stat().st_mode) == 0o700


def test_two_pools_of_one_host_never_hand_out_the_same_device(tmp_path: Path) -> None:
    a, b = DevicePool(["0", "1", "2"], 2, tmp_path), DevicePool(["0", "1", "2"], 2, tmp_path)
    first = a.try_acquire()
    assert first == ["0", "1"]
    assert b.try_acquire() is None  # one device left: not enough for a trial, and nothing kept
    assert a.try_acquire() is None
    a.release(first)
    second = b.try_acquire()
    assert second == ["0", "1"] and a.try_acquire() is None
    b.release(second)
    b.release(second)  # released twice: nothing happens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-0.lock", "gpu-1.lock", "gpu-2.lock"]


def test_a_device_held_by_a_process_that_dies_is_free_again(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from hpo.execution._devices import DevicePool; "
         "p = DevicePool(['GPU-x/1'], 1, Path(sys.argv[1])); print(p.try_acquire(), flush=True); sys.stdin.read()",
         str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "['GPU-x/1']"  # it holds the lock now
    pool = DevicePool(["GPU-x/1"], 1, tmp_path)
    assert pool.try_acquire() is None
    assert (tmp_path / "gpu-GPU-x_1.lock").exists()  # a device name made a file name
    holder.kill()
    holder.wait()
    assert pool.try_acquire() == ["GPU-x/1"]  # the kernel dropped the dead holder's lock


def test_acquire_waits_for_a_release_or_gives_up_when_stopped(tmp_path: Path) -> None:
    a, b = DevicePool(["0"], 1, tmp_path), DevicePool(["0"], 1, tmp_path)
    held = a.acquire()
    stop = threading.Event()
    got: list[list[str]] = []
    waiter = threading.Thread(target=lambda: got.append(b.acquire(stop)))
    waiter.start()
    a.release(held)
    waiter.join(timeout=30)
    assert got == [["0"]]
    stopped: list[list[str]] = []
    waiter = threading.Thread(target=lambda: stopped.append(a.acquire(stop)))
    waiter.start()
    stop.set()
    waiter.join(timeout=30)
    assert stopped == [[]]


def test_a_trial_needs_no_more_devices_than_are_visible_and_none_on_the_cpu(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^trial.gpus_per_trial=3 but only 2 device\(s\) are visible \(0,1\)$"):
        DevicePool(["0", "1"], 3, tmp_path)
    cpu = DevicePool([], 4, tmp_path)
    assert cpu.per_trial == 0 and cpu.try_acquire() == [] and cpu.acquire() == []
    assert list(tmp_path.iterdir()) == []
