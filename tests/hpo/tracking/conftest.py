"""A real MLflow tracking server for the tracking tests: ``mlflow server`` on a SQLite backend and a free port, started
once per session (it takes 20-60 s on a busy 2-core machine), stoppable and restartable on the same port and
database (the outage test)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

MLFLOW = Path(sys.executable).with_name("mlflow")
START_S = 300.0  # a cold start (schema migrations, imports) on a loaded CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the server's for its lifetime
        self.proc = subprocess.Popen(
            [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port",
             str(self.port), "--workers", "1"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"})
        log.close()
        deadline = time.monotonic() + START_S
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: "
                                   f"{(self.root / 'server.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not healthy after {START_S:.0f} s")
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server (its process group: uvicorn and its workers; SIGKILL after 5 s) and wait until it no
        longer answers."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):  # uvicorn may linger on open connections
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None
        deadline = time.monotonic() + 30
        while self.healthy() and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    pytest.importorskip("mlflow")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()
