"""How busy the host was while a trial ran: the CPU time the host's cores spent busy (``/proc/stat``'s ``cpu`` line,
read at the trial's spawn and after its whole tree is gone: one line of one file, no polling) less the trial's own
processes' CPU time (user + system of everything its wrapper reaped), as a share of all the host's CPU time in that
window. What is left is other processes' load (the driver's own included, a few percent at most): a trial that
shares two cores with a benchmark runs at half speed whatever its settings, so a throughput study's summary reports
it (:mod:`hpo.reporting._speed_search`)."""

from __future__ import annotations

import os

STAT = "/proc/stat"


def cpu_times(path: str = STAT) -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the host since boot, summed over its cores (busy: all but idle and iowait);
    None where the file is not there or not Linux's form."""
    try:
        with open(path, "rb") as fh:
            fields = fh.readline().split()
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest: in user)
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    if not fields or fields[0] != b"cpu" or len(ticks) < 5 or hz <= 0:
        return None
    total = sum(ticks)
    return (total - ticks[3] - ticks[4]) / hz, total / hz


def others_share(before: tuple[float, float] | None, after: tuple[float, float] | None,
                 own_cpu_s: float) -> float | None:
    """The share (0..1) of the host's CPU time between ``before`` and ``after`` (:func:`cpu_times`) that processes
    other than the trial's (``own_cpu_s``) used; None when either reading is missing or no time passed."""
    if before is None or after is None:
        return None
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return None
    return min(1.0, max(0.0, (busy - own_cpu_s) / total))
