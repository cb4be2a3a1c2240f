"""Shared benchmark plumbing: statistics, interleaving, child-process RSS sampling, machine and versions.

Every figure is a median over interleaved repetitions (``A B B A A B ...``), so slow drift of a
shared machine hits both sides alike; results keep each repetition's min and max.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from hpo.execution import tree, tree_rss_bytes

REPO = Path(__file__).resolve().parents[1]
MAIN_PY = REPO / ".venv" / "bin" / "python"
TRL112_PY = REPO / ".venv-bench-trl112" / "bin" / "python"
TRL116_PY = REPO / ".venv-bench-trl116" / "bin" / "python"
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"


def main_python() -> str:
    """The interpreter of our side: the main venv when present, else the one running the benchmarks."""
    return str(MAIN_PY) if MAIN_PY.exists() else sys.executable


# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Stat:
    """Median of repetitions with their min and max (all in the row's unit)."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            raise ValueError(f"no repetitions to summarise, but got {values=}")
        return cls(statistics.median(values), min(values), max(values), len(values))


@dataclass
class Row:
    """One line of results.json; ``ratio`` = ours / baseline, oriented so that higher is better."""

    name: str
    unit: str
    ours: float | None
    baseline: float | None = None
    ratio: float | None = None
    ours_min: float | None = None
    ours_max: float | None = None
    baseline_min: float | None = None
    baseline_max: float | None = None
    ratio_min: float | None = None
    ratio_max: float | None = None
    repetitions: int = 0
    note: str = ""
    group: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def make_row(name: str, unit: str, ours: Sequence[float] | None, baseline: Sequence[float] | None = None, *,
             higher_is_better: bool = True, paired: bool = True, group: str = "", note: str = "",
             raw: dict[str, Any] | None = None) -> Row:
    """Row from per-repetition values. The ratio is the median of per-repetition ratios of interleaved
    pairs (``paired``), inverted for lower-is-better units so that > 1 always means ours is better."""
    row = Row(name=name, unit=unit, ours=None, group=group, note=note, raw=dict(raw or {}))
    if ours:
        s = Stat.of(ours)
        row.ours, row.ours_min, row.ours_max, row.repetitions = s.median, s.min, s.max, s.n
        row.raw.setdefault("ours", list(ours))
    if baseline:
        b = Stat.of(baseline)
        row.baseline, row.baseline_min, row.baseline_max = b.median, b.min, b.max
        row.raw.setdefault("baseline", list(baseline))
    if ours and baseline:
        if paired and len(ours) == len(baseline):
            pairs = list(zip(ours, baseline))
        else:
            pairs = [(Stat.of(ours).median, Stat.of(baseline).median)]
        ratios = [(o / b if higher_is_better else b / o) for o, b in pairs if o and b]
        if ratios:
            r = Stat.of(ratios)
            row.ratio, row.ratio_min, row.ratio_max = r.median, r.min, r.max
    return row


def interleave(n_reps: int, labels: Sequence[str]) -> list[tuple[int, str]]:
    """Run order ``(rep, label)``: A B | B A | A B ... so neither side always goes first."""
    order: list[tuple[int, str]] = []
    for rep in range(n_reps):
        seq = list(labels) if rep % 2 == 0 else list(reversed(labels))
        order += [(rep, label) for label in seq]
    return order


# ----------------------------------------------------------------------------- processes
@dataclass
class Measured:
    """A finished child process: exit code, output, wall time and the peak RSS of its process tree."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_gb: float


class RssSampler:
    """Samples the summed RSS of a process tree (or of one process) every ``period_s`` in a thread."""

    def __init__(self, pid: int, period_s: float = 0.1, children: bool = True) -> None:
        self.pid, self.period_s, self.children = pid, period_s, children
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> int:
        if self.children:
            return tree_rss_bytes(tree(self.pid))  # the driver's own accounting of a trial's tree
        try:
            return tree_rss_bytes([psutil.Process(self.pid)])
        except psutil.NoSuchProcess:
            return 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self._stop.wait(self.period_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_measured(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 timeout_s: float = 1800, rss_children: bool = True) -> Measured:
    """Run ``argv`` to completion in its own session, sampling its process tree's RSS.

    Own session: with Linux autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) CPU time is
    shared fairly between sessions, so every measured process gets the same treatment as a user's command
    (or a driver trial, which the driver also starts in a new session), whatever else this script runs."""
    full_env = {**os.environ, **(env or {})}
    t0 = time.perf_counter()
    with subprocess.Popen(list(argv), env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        with RssSampler(proc.pid, children=rss_children) as sampler:
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                err += f"\n[benchmarks] killed after {timeout_s}s"
    return Measured(proc.returncode, out, err, time.perf_counter() - t0, sampler.peak / 2**30)


def hpo_cli(args: Sequence[str], studies: Path, *, nice: bool = False, timeout_s: float | None = None) -> float:
    """``python -m hpo ARGS --studies-dir STUDIES`` with the main venv from the repo root; its wall seconds. A
    non-zero exit raises with the tail of its stderr. ``nice``: below the trials' priority."""
    argv = [*(["nice", "-n", "10"] if nice else []), main_python(), "-m", "hpo", *args, "--studies-dir", str(studies)]
    m = run_measured(argv, env={"PYTHONPATH": str(REPO)}, cwd=str(REPO), rss_children=False,
                     **({"timeout_s": timeout_s} if timeout_s is not None else {}))
    if m.returncode != 0:
        raise RuntimeError(f"verl-hpo {' '.join(args[:3])} failed (exit {m.returncode}):\n{tail(m.stderr)}")
    return float(m.wall_s)


def last_json_line(text: str) -> dict[str, Any]:
    """The last stdout line that parses as a JSON object (benchmark scripts print their result there)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    raise ValueError("no JSON result line in the output")


def tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# ----------------------------------------------------------------------------- machine and versions
def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu,
        "logical_cpus": psutil.cpu_count(logical=True),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


_VERSION_SNIPPET = (
    "import importlib.metadata as m, json\n"
    "out = {}\n"
    "for p in %r:\n"
    "    try: out[p] = m.version(p)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(out))\n"
)


def versions_of(python: str | Path, packages: Sequence[str]) -> dict[str, str]:
    """Installed versions of ``packages`` in the environment of ``python`` ({} when it is missing)."""
    if not Path(python).exists():
        return {}
    try:
        out = subprocess.run([str(python), "-c", _VERSION_SNIPPET % (list(packages),)], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return dict(json.loads(out))
    except (subprocess.SubprocessError, ValueError, OSError):
        return {}


def all_versions() -> dict[str, dict[str, str]]:
    core = ["torch", "transformers", "tokenizers", "optuna", "numpy", "psutil"]
    out = {"main venv (.venv)": versions_of(main_python(), core)}
    for label, py, extra in (("TRL 1.12 venv (.venv-bench-trl112)", TRL112_PY, ["trl", "accelerate", "datasets"]),
                             ("TRL 1.16 venv (.venv-bench-trl116)", TRL116_PY, ["trl", "accelerate", "datasets"]),
                             ("vLLM venv (.venv-vllm)", VLLM_PY, ["vllm", "torch"])):
        v = versions_of(py, ["torch", "transformers", *extra])
        if v:
            out[label] = v
    return out


Progress = Callable[[str], None]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
