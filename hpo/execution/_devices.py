"""GPUs for trials: which exist, and which one a trial may use, across every driver on this host.

Each running trial holds an exclusive ``flock`` on ``<runtime dir>/gpu-<id>.lock`` for each of its devices,
for the trial's whole life. The kernel drops the lock when the holder dies, so a SIGKILLed driver never
leaves a device taken; two drivers on one host (or ``n_jobs`` threads of one) never hand out the same GPU.
The runtime dir is ``$VERL_HPO_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/verl-hpo``, else
``/tmp/verl-hpo-<uid>`` (mode 0700; lock files are empty and never removed).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

ENV_RUNTIME_DIR = "VERL_HPO_RUNTIME_DIR"
POLL_S = 0.2


def detect_devices() -> list[str]:
    """GPU ids visible to the driver: its CUDA_VISIBLE_DEVICES, else nvidia-smi, else none (CPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def runtime_dir() -> Path:
    if os.environ.get(ENV_RUNTIME_DIR):
        path = Path(os.environ[ENV_RUNTIME_DIR])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "verl-hpo"
    else:
        path = Path(tempfile.gettempdir()) / f"verl-hpo-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _lock_name(device: str) -> str:
    return "gpu-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in device) + ".lock"


class DevicePool:
    """Hands ``per_trial`` devices to each trial, blocking while fewer are free on this host."""

    def __init__(self, devices: list[str], per_trial: int, lock_dir: Path | None = None) -> None:
        if devices and per_trial > len(devices):
            raise ValueError(f"trial.gpus_per_trial={per_trial} but only {len(devices)} device(s) are visible "
                             f"({','.join(devices)})")
        self.devices = list(devices)
        self.per_trial = per_trial if devices else 0
        self.lock_dir = lock_dir
        self._held: dict[str, int] = {}  # device -> fd of its lock file
        self._mutex = threading.Lock()

    def _try_lock(self, device: str) -> int | None:
        assert self.lock_dir is not None
        fd = os.open(self.lock_dir / _lock_name(device), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def try_acquire(self) -> list[str] | None:
        """``per_trial`` devices locked for the caller, or None when not enough are free right now."""
        if self.per_trial == 0:
            return []
        if self.lock_dir is None:
            self.lock_dir = runtime_dir()
        with self._mutex:
            taken: dict[str, int] = {}
            for d in self.devices:
                if d in self._held:
                    continue
                fd = self._try_lock(d)
                if fd is not None:
                    taken[d] = fd
                    if len(taken) == self.per_trial:
                        self._held.update(taken)
                        return list(taken)
            for fd in taken.values():
                os.close(fd)
            return None

    def acquire(self, stop: threading.Event | None = None) -> list[str]:
        """Block until devices are free; [] when ``stop`` is set first (or none are needed)."""
        while True:
            got = self.try_acquire()
            if got is not None:
                return got
            if stop is not None and stop.wait(POLL_S):
                return []
            if stop is None:
                threading.Event().wait(POLL_S)

    def release(self, taken: list[str]) -> None:
        with self._mutex:
            for d in taken:
                fd = self._held.pop(d, None)
                if fd is not None:
                    os.close(fd)
