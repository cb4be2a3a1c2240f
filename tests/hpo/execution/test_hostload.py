"""How busy the host was while a trial ran (:mod:`hpo.execution._hostload`): the busy and total CPU seconds of
``/proc/stat``'s ``cpu`` line, and the share of the window that processes other than the trial used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpo.execution._hostload import cpu_times, others_share

HZ = os.sysconf("SC_CLK_TCK")


def test_the_host_s_cpu_times_come_from_the_cpu_line(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (guest fields after: not summed, they are in user)
    stat.write_text(f"cpu  {HZ * 10} 0 {HZ * 5} {HZ * 80} {HZ * 5} 0 0 0 {HZ * 7} 0\ncpu0 1 2 3 4 5\n")
    assert cpu_times(str(stat)) == pytest.approx((15.0, 100.0))
    live = cpu_times()
    assert live is not None and 0 < live[0] < live[1]
    later = cpu_times()
    assert later is not None and later[1] >= live[1]


@pytest.mark.parametrize("text", ["", "cpu0 1 2 3 4 5\n", "cpu 1 2 x 4 5\n", "cpu 1 2 3\n"])
def test_a_file_not_in_linux_s_form_gives_no_reading(tmp_path: Path, text: str) -> None:
    stat = tmp_path / "stat"
    stat.write_text(text)
    assert cpu_times(str(stat)) is None
    assert cpu_times(str(tmp_path / "missing")) is None


def test_the_others_share_is_the_busy_time_left_after_the_trial_s_own() -> None:
    assert others_share((100.0, 400.0), (160.0, 500.0), own_cpu_s=40.0) == pytest.approx(0.2)
    assert others_share((100.0, 400.0), (160.0, 500.0), own_cpu_s=90.0) == 0.0  # never below 0
    assert others_share((0.0, 0.0), (500.0, 100.0), own_cpu_s=0.0) == 1.0  # never above 1
    assert others_share(None, (1.0, 2.0), 0.0) is None and others_share((1.0, 2.0), None, 0.0) is None
    assert others_share((1.0, 2.0), (1.0, 2.0), 0.0) is None  # no time passed
