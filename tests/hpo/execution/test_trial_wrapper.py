"""A verl trial's /tmp (issue 21 item 3): verl 0.9.1 binds its weight-sync socket at a fixed
``/tmp/rl-colocate-zmq-1-replica-0-rank-0.sock`` (removing the path first) in every trial, so two trials on one host
must not share /tmp. Stand-ins launched through the real trial wrapper do what verl does, at the same time."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpo.execution._runner import WRAPPER
from hpo.execution._trial_wrapper import ENV_PRIVATE_TMP

SOCKET = "/tmp/rl-colocate-zmq-1-replica-0-rank-0.sock"  # verl's name for job 1, replica 0, rank 0
NOBODY = 65534
WAIT_S = 60.0  # generous: these tests wait on files, never on time

# One trial: like verl's sender, remove the socket path and bind it; wait until the other trial has bound too (a
# barrier through files in the shared directory); then a separate process (like the vLLM worker) connects to the
# path and records whose server answered. Serve until both peers are done. In `hold` mode: start, then wait.
STANDIN = textwrap.dedent("""
    import os, socket, subprocess, sys, time
    mode, name, shared = sys.argv[1:4]
    def mark(what, text=""):
        with open(os.path.join(shared, what + "-" + name), "w") as fh:
            fh.write(text)
    def wait_for(*names):
        deadline = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(shared, n)) for n in names):
            if time.monotonic() > deadline:
                sys.exit("timed out waiting for " + repr(names))
            time.sleep(0.02)
    if mode == "hold":
        mark("started")
        wait_for("release-" + name)
        sys.exit(0)
    path = "/tmp/rl-colocate-zmq-1-replica-0-rank-0.sock"
    if os.path.exists(path):
        os.remove(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(0.05)
    mark("bound")
    wait_for("bound-a", "bound-b")
    peer = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX); "
                             "s.connect(sys.argv[1]); print(s.recv(16).decode())", path], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(shared, "reached-" + n)) for n in "ab"):
        if time.monotonic() > deadline:
            sys.exit("timed out waiting for the peers")
        try:
            conn, _ = srv.accept()
            conn.sendall(name.encode())
            conn.close()
        except socket.timeout:
            pass
        if peer.poll() is not None and not os.path.exists(os.path.join(shared, "reached-" + name)):
            mark("reached", peer.stdout.read().decode().strip())
""")


def _wrapped(python: str, private: Path, standin: Path, mode: str, name: str, shared: Path) -> list[str]:
    return [python, "-I", "-S", str(WRAPPER), "--parent", str(os.getpid()), "--private-tmp", str(private), "--",
            python, str(standin), mode, name, str(shared)]


def _refused(python: str, private: Path, user: int | None) -> str | None:
    """Why the wrapper, run as ``user``, cannot give a trial a private /tmp on this kernel (None: it can)."""
    code = (f"import sys; sys.path.insert(0, {str(WRAPPER.parent)!r}); import _trial_wrapper as w; "
            f"print(w.private_tmp_refused({str(private)!r}) or '')")
    out = subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, user=user,
                         env={k: v for k, v in os.environ.items() if k != ENV_PRIVATE_TMP})
    return (out.stdout.strip() or None) if out.returncode == 0 else f"probe failed: {out.stderr.strip()}"


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A directory under the host's /tmp that a trial of any user can use (pytest's tmp_path is 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="vhpo-private-tmp-", dir="/tmp"))
    root.chmod(0o777)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _as(user: int | None) -> tuple[str, int | None]:
    """(an interpreter that ``user`` may run, user); skips when there is none (sys.executable under /root)."""
    if user is None:
        return sys.executable, None
    if os.getuid() != 0:
        pytest.skip("only root can start a trial as another user")
    for python in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        try:
            if python and subprocess.run([python, "-I", "-S", "-c", "0"], user=user, capture_output=True,
                                         timeout=30).returncode == 0:
                return python, user
        except PermissionError:
            continue
    pytest.skip(f"no python interpreter that uid {user} can run")


@pytest.mark.parametrize("user", [None, NOBODY], ids=["this-user", "unprivileged-user-namespace"])
def test_two_concurrent_trials_each_reach_their_own_socket(shared_root: Path, user: int | None) -> None:
    """Both trials remove and bind the same /tmp path at the same time; each one's peer still reaches its own
    server, the socket lives in the trial's private directory, and the trial still sees the host's /tmp entries
    (the shared directory is under /tmp). As uid 65534 (run by root) the unprivileged user-namespace branch runs."""
    python, user = _as(user)
    shared = shared_root / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    standin = shared_root / "standin.py"
    standin.write_text(STANDIN)
    standin.chmod(0o644)
    privates = {n: shared_root / f"private-{n}" for n in "ab"}
    probe = shared_root / "probe"
    probe.mkdir(mode=0o777)
    probe.chmod(0o777)
    why = _refused(python, probe, user)
    if why is not None:
        pytest.skip(f"this kernel gives no private /tmp here: {why}")
    procs = {n: subprocess.Popen(_wrapped(python, privates[n], standin, "sockets", n, shared), user=user,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                 env={k: v for k, v in os.environ.items() if k != ENV_PRIVATE_TMP})
             for n in "ab"}
    try:
        outs = {n: p.communicate(timeout=WAIT_S * 2) for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for n, p in procs.items():
        assert p.returncode == 0, (n, outs[n][1].decode())
    reached = {n: (shared / f"reached-{n}").read_text() for n in "ab"}
    assert reached == {"a": "a", "b": "b"}, f"a weight sync reached the other trial's socket: {reached}"
    for n in "ab":  # the socket lived in the trial's private directory, not in the host's /tmp
        assert stat.S_ISSOCK((privates[n] / Path(SOCKET).name).lstat().st_mode)


def test_without_a_private_tmp_one_trial_runs_per_host_and_the_next_waits(shared_root: Path) -> None:
    """The fallback (forced here with VERL_HPO_PRIVATE_TMP=lock; taken where the kernel refuses the namespaces):
    the host's /tmp, a host-wide lock, a second trial waits with one line saying why, a stop ends the wait."""
    shared = shared_root / "shared"
    shared.mkdir()
    standin = shared_root / "standin.py"
    standin.write_text(STANDIN)
    env = {**os.environ, ENV_PRIVATE_TMP: "lock"}

    def start(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(_wrapped(sys.executable, shared_root / f"private-{name}", standin, "hold", name,
                                         shared), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                start_new_session=True)

    def wait_for(path: Path) -> None:
        deadline = time.monotonic() + WAIT_S
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.02)

    first = start("a")
    procs = [first]
    try:
        wait_for(shared / "started-a")
        second = start("b")
        third = start("c")
        procs += [second, third]
        assert second.stderr is not None and third.stderr is not None
        line = second.stderr.readline().decode()  # blocks until the wrapper says why it waits
        assert "no private /tmp here (VERL_HPO_PRIVATE_TMP=lock)" in line and "waiting" in line, line
        third.stderr.readline()
        assert not (shared / "started-b").exists() and second.poll() is None
        third.send_signal(signal.SIGTERM)  # e.g. pruned or timed out while waiting: gone, never started
        assert third.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
        (shared / "release-a").touch()
        assert first.wait(timeout=WAIT_S) == 0
        wait_for(shared / "started-b")
        (shared / "release-b").touch()
        assert second.wait(timeout=WAIT_S) == 0
        assert second.stderr.read() == b""  # the reason was one line
        assert not (shared / "started-c").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
