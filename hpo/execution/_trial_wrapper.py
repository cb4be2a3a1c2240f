"""The trial wrapper: a tiny parent process between the driver and the trainer, plus the stdlib-only
process-tree primitives it shares with the driver.

Run (by ``hpo.execution._runner``, never by hand) as::

    python -I -S hpo/execution/_trial_wrapper.py --parent DRIVER_PID [--grace S] [--cgroup DIR] [--status FILE]
                                       [--private-tmp DIR] -- ARGV...

It is started in its own session (``start_new_session``) and then

* dies with the driver: ``PR_SET_PDEATHSIG`` (SIGUSR1) fires when the driver thread that spawned it exits,
  SIGKILL included; it then SIGKILLs the whole trial and removes the trial's cgroup;
* is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant that daemonizes or starts its own session
  is reparented to the wrapper instead of init, so it stays findable (a descendant of the wrapper);
* forks the trainer, which joins the trial's cgroup (``--cgroup``) before ``exec`` and gets
  ``PR_SET_PDEATHSIG`` = SIGKILL (it dies if the wrapper is SIGKILLed);
* with ``--private-tmp DIR`` (every verl trial) gives the trainer a ``/tmp`` of its own (:func:`enter_private_tmp`),
  or, where the kernel allows no mount namespace, runs one such trial per host at a time (:func:`wait_host_lock`);
* on SIGTERM/SIGINT/SIGHUP from the driver (prune, timeout, interrupt): SIGTERMs every descendant, waits
  ``--grace`` seconds for the trainer, then SIGKILLs; on SIGUSR1 (driver death) or SIGUSR2 (the driver's
  memory-cap kill): SIGKILLs at once;
* when the trainer exits (on its own or not), SIGKILLs every remaining descendant and every process left in the
  cgroup, reaps them, writes ``{"maxrss_kb": ..., "leftovers": ..., "cpu_s": ...}`` (the trial's CPU time) to
  ``--status`` and exits with the trainer's status: the same exit code, or death by the same signal (a trainer
  killed by SIGKILL reads as -9 to the driver, as without the wrapper).

Signals are handled synchronously (blocked, then ``sigtimedwait``), so there are no handlers racing the main
loop. Start-up is kept to a bare interpreter (``-I -S``, no ``hpo``, ``json``, ``re`` or ``enum`` import) plus
``ctypes``.

Processes are signalled through a pidfd opened after checking that the pid still is the process that was
found (same start time, same cgroup), so a pid recycled in between is never hit.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import stat
import sys
import time

TYPE_CHECKING = False  # not `from typing import ...`: typing costs ~10 ms of start-up
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable, Collection, Iterable, Sequence
else:  # start-up time: the public module builds enums (~15 ms); the functions and constants are the same
    import _signal as signal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DRIVER_DEATH_SIGNAL = signal.SIGUSR1  # PR_SET_PDEATHSIG: the driver thread that spawned us is gone
KILL_NOW_SIGNAL = signal.SIGUSR2  # from the driver: SIGKILL the trial now (memory cap)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # graceful stop
KILL_WAIT_S = 10.0  # give up waiting for SIGKILLed processes (uninterruptible sleep) after this long
EXIT_EXEC_FAILED = 127

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


def prctl(option: int, arg: int) -> bool:
    if _libc is None:
        return False
    return int(_libc.prctl(option, arg, 0, 0, 0)) == 0


# ----------------------------------------------------------------------------- /proc primitives
def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time in clock ticks since boot, state letter) of a live process, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # the command name is in parentheses and may itself contain spaces and ')'
    fields = raw[raw.rfind(b")") + 2:].split()
    return int(fields[1]), int(fields[19]), fields[0].decode()


def start_time(pid: int) -> int | None:
    st = proc_stat(pid)
    return None if st is None else st[1]


def ppid_map() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, start time, state) for every process."""
    out: dict[int, tuple[int, int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def descendants(root: int) -> dict[int, int]:
    """Live (non-zombie) descendants of ``root``: pid -> start time."""
    children: dict[int, list[tuple[int, int, str]]] = {}
    for pid, (ppid, started, state) in ppid_map().items():
        children.setdefault(ppid, []).append((pid, started, state))
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, started, state in children.get(todo.pop(), []):
            if pid not in out:
                todo.append(pid)
                if state not in ("Z", "X"):
                    out[pid] = started
    return out


def cgroup_procs(cgroup_dir: str) -> list[int]:
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs")) as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def _in_cgroup(pid: int, cgroup_dir: str) -> bool:
    """Whether /proc/<pid>/cgroup lists the cgroup whose directory is ``cgroup_dir`` (v1 or v2)."""
    name = os.path.basename(cgroup_dir.rstrip("/"))
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return any(line.rstrip("\n").endswith("/" + name) for line in fh)
    except OSError:
        return False


def _send(pid: int, sig: int, check: Callable[[], bool]) -> bool:
    """Signal ``pid`` if ``check()`` (run after a pidfd pinned the process) says it still is the one we mean."""
    try:
        fd = os.pidfd_open(pid)
    except AttributeError:  # Python without pidfd: best effort
        fd = -1
    except OSError:
        return False
    try:
        if not check():
            return False
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def signal_process(pid: int, started: int, sig: int) -> bool:
    """Signal ``pid`` only if it is still the process that started at ``started`` (not a recycled pid)."""
    return _send(pid, sig, lambda: start_time(pid) == started)


def signal_tree(root: int, sig: int, cgroup_dir: str | None = None) -> int:
    """Send ``sig`` to every live descendant of ``root`` and every process in ``cgroup_dir``; return the count."""
    found = descendants(root)
    n = sum(signal_process(pid, started, sig) for pid, started in found.items())
    if cgroup_dir:
        n += signal_cgroup(cgroup_dir, sig, skip=found.keys())
    return n


def signal_cgroup(cgroup_dir: str, sig: int, skip: Collection[int] = ()) -> int:
    """Send ``sig`` to every process in the cgroup ``cgroup_dir`` (but this one and ``skip``); return the count."""
    me = os.getpid()
    return sum(_send(pid, sig, lambda pid=pid: _in_cgroup(pid, cgroup_dir))  # type: ignore[misc]
               for pid in cgroup_procs(cgroup_dir) if pid != me and pid not in skip)


def cgroup_kill(cgroup_dir: str) -> None:
    """v2 ``cgroup.kill`` (kills the whole cgroup, including processes forking right now) where it exists."""
    try:
        with open(os.path.join(cgroup_dir, "cgroup.kill"), "w") as fh:
            fh.write("1")
    except OSError:
        pass


# ----------------------------------------------------------------------------- a private /tmp
# verl 0.9.1 syncs weights to vLLM through ``ipc:///tmp/rl-colocate-zmq-{ray job id}-replica-{r}-rank-{k}.sock``:
# a hard-coded /tmp, the path removed before each bind, and every trial's own Ray cluster numbers its first job 1.
# Two verl trials on one host (n_jobs > 1, two workers) would steal each other's socket: syncs cross or hang.
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
ENV_PRIVATE_TMP = "VERL_HPO_PRIVATE_TMP"  # auto (default): a private /tmp where possible; lock: always the lock
HOST_LOCK = "/tmp/verl-hpo-shared-tmp.lock"  # one trial at a time on the host's /tmp (any user: never removed)
HOST_LOCK_POLL_S = 0.5


def _check(name: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    if _libc is None:  # pragma: no cover - not Linux
        raise OSError(errno.ENOSYS, "unshare: no libc")
    _check("unshare", int(_libc.unshare(flags)))


def _mount(source: str | None, target: str, flags: int) -> None:
    assert _libc is not None
    _check(f"mount {target}", int(_libc.mount(None if source is None else source.encode(), target.encode(), None,
                                              ctypes.c_ulong(flags), None)))


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def enter_private_tmp(private: str, carry: bool = True) -> None:
    """Put this process (and what it will exec) in a mount namespace of its own whose ``/tmp`` is ``private``.

    A root with ``CAP_SYS_ADMIN`` only needs ``unshare(CLONE_NEWNS)``. Elsewhere an unprivileged user namespace
    comes with it, mapping the caller's uid and gid to themselves (not to root): the trial keeps its ids, files and
    devices, the driver (same uid, parent namespace) can still signal, ptrace and read ``/proc`` of every process,
    the cgroup was joined before; what such a trial loses is ``setgroups`` and set-uid programs (``sudo``), and
    files of unmapped owners show as ``nobody``.

    With ``carry``, every entry at the top of the host's ``/tmp`` when the trial starts (a study or data directory
    under ``/tmp``, pytest's ``tmp_path``) stays reachable at its path, through a bind mount (a symlink is copied),
    except Unix sockets, so a stale socket of another run is neither reached nor (being a mount point) made
    impossible to remove. What the trial creates at the top of ``/tmp`` (verl's sockets) lives in ``private``, and
    the host's later top-level entries are not seen. Raises OSError when the kernel refuses."""
    names = os.listdir("/tmp") if carry else []
    uid, gid = os.geteuid(), os.getegid()
    try:
        _unshare(CLONE_NEWNS)
    except OSError as e:
        if e.errno != errno.EPERM:
            raise
        _unshare(CLONE_NEWUSER | CLONE_NEWNS)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", MS_REC | MS_PRIVATE)  # nothing mounted here propagates to the host, nor back
    host_tmp = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)  # (opened in the new namespace: a bind source)
    try:
        _mount(private, "/tmp", MS_BIND | MS_REC)
        for name in names:
            src, dst = f"/proc/self/fd/{host_tmp}/{name}", os.path.join("/tmp", name)
            try:
                mode = os.lstat(src).st_mode
                if stat.S_ISSOCK(mode) or os.path.lexists(dst):
                    continue
                if stat.S_ISLNK(mode):
                    os.symlink(os.readlink(src), dst)
                    continue
                if stat.S_ISDIR(mode):
                    os.mkdir(dst, 0o700)
                else:
                    os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
                _mount(src, dst, MS_BIND | MS_REC)
            except FileNotFoundError:  # removed from the host's /tmp meanwhile
                continue
    finally:
        os.close(host_tmp)
    try:  # a working directory under /tmp: the same directory, reached through the carried mount
        os.chdir(os.getcwd())
    except OSError:
        pass


def private_tmp_refused(private: str) -> str | None:
    """Why this process cannot give a trial a private ``/tmp`` (tried in a throw-away child), else None."""
    if os.environ.get(ENV_PRIVATE_TMP, "auto") == "lock":
        return f"{ENV_PRIVATE_TMP}=lock"
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: the same calls, nothing carried, then gone with its namespace
        try:
            os.close(rfd)
            enter_private_tmp(private, carry=False)
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - report and exit, never return into the wrapper's code
            try:
                os.write(wfd, str(e).encode()[:500])
            finally:
                os._exit(1)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as fh:
        why = fh.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else (why or f"probe exited with status {status}")


def wait_host_lock(why: str, waited: Collection[int]) -> int:
    """Hold :data:`HOST_LOCK` (returns its fd; the kernel drops the lock when the wrapper dies). While another
    trial holds it, say so on stderr once and wait; a stop signal meanwhile ends the wrapper as that signal."""
    import fcntl

    fd = -1
    while fd < 0:
        try:  # (O_CREAT on another user's existing file in sticky /tmp is refused: open it first)
            fd = os.open(HOST_LOCK, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                fd = os.open(HOST_LOCK, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                continue
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        if not said:
            os.write(2, (f"trial wrapper: no private /tmp here ({why}) and this trainer binds fixed paths under the "
                         f"host's /tmp: waiting until the other such trial on this host, which holds {HOST_LOCK}, "
                         f"ends\n").encode())
            said = True
        info = signal.sigtimedwait(waited, HOST_LOCK_POLL_S)
        if info is not None and info.si_signo != signal.SIGCHLD:
            os._exit(128 + info.si_signo)  # stopped (pruned, timed out, interrupted) before it started


# ----------------------------------------------------------------------------- the wrapper
class _Reaper:
    """Reaps our children (the trainer and orphans reparented to us) and remembers the trainer's status."""

    def __init__(self, child: int) -> None:
        self.child = child
        self.status: int | None = None
        self.maxrss_kb = 0
        self.cpu_s = 0.0  # user + system time of every child reaped (each with its own reaped descendants)

    def reap(self) -> bool:
        """Reap what can be reaped now; True while we still have children."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            self.maxrss_kb = max(self.maxrss_kb, usage.ru_maxrss)
            self.cpu_s += usage.ru_utime + usage.ru_stime
            if pid == self.child:
                self.status = status


def _spawn(argv: Sequence[str], cgroup_dir: str | None, old_mask: Iterable[int], private_tmp: str | None) -> int:
    wrapper = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: join the cgroup, die with the wrapper, a private /tmp, restore the signal mask, exec
        if cgroup_dir:
            with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != wrapper:
            os._exit(128 + signal.SIGKILL)
        if private_tmp is not None:  # after the cgroup: a user namespace could not join it any more
            enter_private_tmp(private_tmp)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        os.execvp(argv[0], list(argv))
    except BaseException as e:  # noqa: BLE001 - report and exit, never return into the wrapper's code
        try:
            os.write(2, f"trial wrapper: cannot start {argv[0]!r}: {e}\n".encode())
        finally:
            os._exit(EXIT_EXEC_FAILED)
    raise AssertionError("unreachable")  # pragma: no cover


def _exit_like(status: int) -> None:
    """Exit with the same status as the trainer: its exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            try:
                resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            except (OSError, ValueError):
                pass
        os.kill(os.getpid(), sig)
        time.sleep(0.1)  # a signal whose default is to be ignored ends up here
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _rmdir(path: str, tries: int = 50) -> bool:
    """Remove an (empty) cgroup, retrying while the kernel still counts the last tasks that exited."""
    for _ in range(tries):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            err = e
            time.sleep(0.02)
    os.write(2, f"trial wrapper: cannot remove {path}: {err}\n".encode())
    return False


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: _trial_wrapper.py --parent PID [--grace S] [--cgroup DIR] [--status FILE] "
                         "[--private-tmp DIR] -- ARGV")
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1:]
    if len(opts) % 2 or not cmd:
        raise SystemExit("trial wrapper: bad arguments")
    return {opts[i].lstrip("-"): opts[i + 1] for i in range(0, len(opts), 2)}, cmd


def main(argv: list[str]) -> None:
    opts, cmd = _parse(argv)
    grace = float(opts.get("grace", "3"))
    cgroup_dir = opts.get("cgroup")
    waited = {signal.SIGCHLD, DRIVER_DEATH_SIGNAL, KILL_NOW_SIGNAL, *STOP_SIGNALS}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, DRIVER_DEATH_SIGNAL)
    if os.getppid() != int(opts["parent"]):  # the driver died before PR_SET_PDEATHSIG took effect
        os._exit(128 + signal.SIGKILL)
    private_tmp = opts.get("private-tmp")
    if private_tmp is not None:
        os.makedirs(private_tmp, mode=0o700, exist_ok=True)
        why = private_tmp_refused(private_tmp)
        if why is not None:  # the host's /tmp, one such trial at a time (the lock's fd lives as long as we do)
            wait_host_lock(why, waited)
            private_tmp = None
    reaper = _Reaper(_spawn(cmd, cgroup_dir, old_mask, private_tmp))
    me = os.getpid()
    driver_gone = False
    deadline: float | None = None  # SIGKILL everything at this time (after a graceful stop request)
    while reaper.reap() and reaper.status is None:
        timeout = 3600.0 if deadline is None else deadline - time.monotonic()
        info = signal.sigtimedwait(waited, max(timeout, 0.0)) if timeout > 0 else None
        if info is None:  # grace is over
            signal_tree(me, signal.SIGKILL, cgroup_dir)
            deadline = time.monotonic() + 3600.0
        elif info.si_signo in (DRIVER_DEATH_SIGNAL, KILL_NOW_SIGNAL):
            # (not getppid(): when the driver is SIGKILLed its spawning thread may exit first, and we are
            # reparented to one of its other, still dying threads)
            driver_gone = driver_gone or info.si_signo == DRIVER_DEATH_SIGNAL
            signal_tree(me, signal.SIGKILL, cgroup_dir)
            deadline = time.monotonic() + 3600.0
        elif info.si_signo in STOP_SIGNALS and deadline is None:
            signal_tree(me, signal.SIGTERM, cgroup_dir)
            deadline = time.monotonic() + grace
    # the trainer is gone: nothing of the trial may outlive it
    leftovers: int | None = None
    give_up = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < give_up:
        if cgroup_dir:
            cgroup_kill(cgroup_dir)
        n = signal_tree(me, signal.SIGKILL, cgroup_dir)
        leftovers = n if leftovers is None else leftovers
        more = reaper.reap()
        if n == 0 and not more:
            break
        signal.sigtimedwait({signal.SIGCHLD}, 0.02)
    reaper.reap()
    if driver_gone and cgroup_dir:  # nobody else will remove it (until a later driver sweeps stale ones)
        _rmdir(cgroup_dir)
    if "status" in opts:
        try:
            # in the trial's directory: never through a link the trial made, never blocking on its FIFO
            fd = os.open(opts["status"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(f'{{"maxrss_kb": {reaper.maxrss_kb}, "leftovers": {leftovers or 0}, '  # (no json: start-up)
                         f'"cpu_s": {reaper.cpu_s:.3f}}}')
        except OSError:
            pass
    _exit_like(reaper.status if reaper.status is not None else int(signal.SIGKILL))  # (a raw wait status)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except OSError as e:  # pragma: no cover - e.g. fork failed
        if e.errno != errno.EINTR:
            print(f"trial wrapper: {e}", file=sys.stderr)
        os._exit(EXIT_EXEC_FAILED)
