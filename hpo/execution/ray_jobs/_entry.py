"""The entrypoint of a trial's Ray job: runs the trainer on a cluster node and hands its metrics to the driver
through the job's log (no shared filesystem needed). Standard library only: it is shipped to the node as a package
of its own (``py_modules``), without ``hpo`` or its dependencies.

Run (by :mod:`hpo.execution.ray_jobs._job`, never by hand) as::

    python -m verl_hpo_ray_entry --metrics PATH [--max-line-bytes N] [--memory-limit-bytes N] -- ARGV...

It starts ARGV (the trial's argv, as a local trial runs it), and every :data:`TICK_S` seconds:

* echoes each new complete line of the metrics file ``PATH`` (verl's ``file`` logger format, written by the
  trainer) to stdout as ``PREFIX + line``; a line longer than ``--max-line-bytes`` becomes ``BAD`` (the driver
  counts it, as it counts the bad lines of a local metrics file); a file that shrinks is read again from the start;
* sums the peak RSS (``VmHWM``) of the trainer's process tree and, over ``--memory-limit-bytes``, SIGKILLs it (the
  memory cap of a local trial, enforced on the node).

When the trainer exits it drains the file, prints ``END {"exit": ..., "peak_kb": ..., "memory": ...}`` and exits
with the trainer's status (128 + N for a death by signal N). SIGTERM/SIGINT/SIGHUP (Ray's ``stop_job`` signals the
process group) are passed on to the trainer, which also gets Ray's SIGKILL after its grace period.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

PREFIX = "@@verl-hpo-metrics@@ "
BAD = "@@verl-hpo-bad-line@@"
END = "@@verl-hpo-end@@ "
TICK_S = 0.2


class _Tail:
    """Complete new lines of a file, each at most ``cap`` bytes (a longer one is reported as bad)."""

    def __init__(self, path: str, cap: int) -> None:
        self.path, self.cap = path, cap
        self.offset, self.partial, self.skipping = 0, b"", False

    def lines(self) -> list[bytes | None]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return []
        out: list[bytes | None] = []
        try:
            if os.fstat(fd).st_size < self.offset:  # truncated (a restarted trainer): from the start
                self.offset, self.partial, self.skipping = 0, b"", False
            while True:
                chunk = os.pread(fd, 1 << 20, self.offset)
                if not chunk:
                    break
                self.offset += len(chunk)
                self._feed(chunk, out)
        except OSError:
            pass
        finally:
            os.close(fd)
        return out

    def _feed(self, chunk: bytes, out: list[bytes | None]) -> None:
        parts = chunk.split(b"\n")
        for i, piece in enumerate(parts):
            last = i == len(parts) - 1
            if not self.skipping:
                if len(self.partial) + len(piece) > self.cap:
                    out.append(None)
                    self.skipping, self.partial = True, b""
                else:
                    self.partial += piece
            if last:
                return
            if not self.skipping and self.partial.strip():
                out.append(self.partial)
            self.skipping, self.partial = False, b""


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: python -m verl_hpo_ray_entry --metrics PATH [...] -- ARGV...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    opts, cmd = argv[:cut], argv[cut + 1:]
    args = dict(zip(opts[::2], opts[1::2]))  # noqa: B905 - any python 3 on the node
    metrics = args["--metrics"]
    cap = int(args.get("--max-line-bytes", 16 << 20))
    limit = int(args.get("--memory-limit-bytes", "0")) // 1024
    os.makedirs(os.path.dirname(os.path.abspath(metrics)), exist_ok=True)
    tail = _Tail(metrics, cap)
    proc = subprocess.Popen(cmd)

    def forward(signum: int, _frame: object) -> None:
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    peak_kb, over = 0, False

    def drain() -> None:
        for line in tail.lines():
            _emit(BAD if line is None else PREFIX + line.decode("utf-8", "replace"))

    while True:
        rc = proc.poll()
        drain()
        if rc is not None:
            break
        tree_kb = sum(_hwm_kb(p) for p in _tree(proc.pid))
        peak_kb = max(peak_kb, tree_kb)
        if limit and tree_kb > limit and not over:
            over = True
            for pid in _tree(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(TICK_S)
    code = rc if rc >= 0 else 128 - rc
    _emit(END + json.dumps({"exit": rc, "peak_kb": peak_kb, "memory": over}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
