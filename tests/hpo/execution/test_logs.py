"""The driver's side of a trial's logs (:mod:`hpo.execution._logs`), with real processes: the log pump started beside
a writer that is not its parent, the logs it fills (capped) and its report once the writer is gone (a SIGKILLed
writer's last words included); a Ray job's log written by the driver itself (:class:`CappedText`); the two settings,
each refused in one line naming its variable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.execution._logs import (
    DEFAULT_MAX_DROPPED,
    ENV_MAX_DROPPED,
    CappedText,
    LogPump,
    LogReport,
    check_patterns,
    knob_problem,
    max_dropped_rows,
)

PATTERNS = [r"dropped row (?P<key>\d+)"]


def _writer(pump: LogPump, code: str) -> subprocess.Popen[bytes]:
    """A process in a session of its own whose stdout and stderr are the pump's pipes (as the trial wrapper's are)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=pump.stdout, stderr=pump.stderr,
                            start_new_session=True)
    pump.spawned()
    return proc


def test_the_pump_fills_both_logs_and_reports_the_dropped_rows(tmp_path: Path) -> None:
    pump = LogPump(tmp_path, 1 << 20, PATTERNS)
    proc = _writer(pump, "import sys\nprint('hello out')\n"
                         "sys.stderr.write('dropped row 1\\ndropped row 1\\ndropped row 2\\n"
                         "Traceback (most recent call last):\\nKeyError: 2\\n')\n")
    assert proc.wait(timeout=60) == 0
    report = pump.finish()
    assert (tmp_path / "stdout.log").read_text() == "hello out\n"
    assert (tmp_path / "stderr.log").read_text().startswith("dropped row 1\n")
    assert report.dropped_rows == 2 and report.dropped_rows_error == "KeyError: 2 (after: dropped row 1)"
    assert report.cut == {} and report.notes == []


def test_a_log_over_its_cap_is_cut_and_said_and_a_sigkilled_writer_s_last_words_kept(tmp_path: Path) -> None:
    pump = LogPump(tmp_path, 1 << 20)
    proc = _writer(pump, "import os, signal, sys\nfor i in range(30000):\n"
                         "    sys.stderr.write('chatter %08d ' % i + '.' * 82 + '\\n')\n"
                         "sys.stderr.write('LAST WORDS\\n'); sys.stderr.flush()\n"
                         "os.kill(os.getpid(), signal.SIGKILL)\n")
    assert proc.wait(timeout=60) == -signal.SIGKILL
    report = pump.finish()
    text = (tmp_path / "stderr.log").read_bytes()
    assert len(text) <= 1 << 20 and text.endswith(b"LAST WORDS\n") and text.startswith(b"chatter 00000000 ")
    assert set(report.cut) == {"stderr.log"} and report.cut["stderr.log"] > 1_500_000
    assert len(report.notes) == 1 and report.notes[0].startswith("stderr.log went over its cap of 1 MiB "
                                                                 "($VERL_HPO_LOG_CAP_MIB): ")
    assert str(tmp_path / "stderr.log") in report.notes[0]


def test_the_pump_is_outside_the_writer_s_session_and_dies_with_nothing_it_does(tmp_path: Path) -> None:
    pump = LogPump(tmp_path, None)
    proc = _writer(pump, "import os, signal\nprint('bye', flush=True)\nos.killpg(0, signal.SIGKILL)\n")
    assert proc.wait(timeout=60) == -signal.SIGKILL  # it killed its whole process group, as a trial's end does
    assert pump.proc.poll() is None or pump.proc.returncode == 0  # the pump, in a session of its own, lives on
    report = pump.finish()
    assert (tmp_path / "stdout.log").read_text() == "bye\n" and report.notes == []


def test_a_pump_that_leaves_no_report_is_said_not_raised(tmp_path: Path) -> None:
    pump = LogPump(tmp_path, None)
    pump.proc.kill()  # the pump dies before the trial ends
    pump.proc.wait()
    report = pump.finish()
    assert len(report.notes) == 1 and report.notes[0].startswith("the log pump left no report (")
    assert report.notes[0].endswith("its logs may be incomplete, dropped rows were not counted")


def test_a_pattern_that_is_not_a_regular_expression_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^dropped_row_patterns\[1\] 'a\(': not a regular expression"):
        LogPump(tmp_path, None, ["ok", "a("])
    assert list(tmp_path.iterdir()) == []
    check_patterns([r"uid=(?P<key>\S+)", "é+"])


def test_the_driver_s_own_capped_log_of_a_ray_job(tmp_path: Path) -> None:
    path = tmp_path / "stderr.log"
    log = CappedText(path, 1 << 20, PATTERNS)
    log.write("dropped row 7\n")
    assert path.read_bytes() == b""  # buffered until flush (or BUFFER bytes)
    log.flush()
    assert path.read_text() == "dropped row 7\n"
    for i in range(25000):
        log.write(f"line {i:08d} " + "." * 86 + "\n")
    log.write("the end")  # no newline: still counted and kept
    report = log.close()
    text = path.read_bytes()
    assert len(text) <= 1 << 20 and text.endswith(b"the end") and report.dropped_rows == 1
    assert set(report.cut) == {"stderr.log"} and report.notes[0].startswith("stderr.log went over its cap")


def test_log_report_reads_a_pump_s_report() -> None:
    report = LogReport()
    report.add_log("stdout.log", Path("/t/stdout.log"), {"cut_bytes": 0, "error": "No space left on device; the rest "
                                                         "of this log was dropped"}, 1 << 20)
    report.add_rows({"count": 3, "first": "row x", "exception": None, "error": "KeyError: boom"})
    assert report.cut == {} and report.dropped_rows == 3 and report.dropped_rows_error == "row x"
    assert report.notes == ["stdout.log: No space left on device; the rest of this log was dropped (/t/stdout.log)",
                            "counting dropped rows stopped: KeyError: boom"]
    other = LogReport()
    other.add_rows({"count": "3"})
    other.add_log("x", Path("x"), {"cut_bytes": 100}, None)  # no cap: nothing was cut
    assert other.dropped_rows == 0 and other.cut == {} and other.notes == []


@pytest.mark.parametrize(("value", "rows"), [("", DEFAULT_MAX_DROPPED), (" 0 ", 0), ("25", 25)])
def test_the_dropped_rows_setting(value: str, rows: int) -> None:
    assert max_dropped_rows({ENV_MAX_DROPPED: value}) == rows


@pytest.mark.parametrize("value", ["-1", "1.5", "many", "1" * 13])
def test_a_bad_setting_is_one_line_naming_its_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=f"^VERL_HPO_MAX_DROPPED_ROWS={value!r}: expected a whole number >= 0"):
        max_dropped_rows({ENV_MAX_DROPPED: value})
    monkeypatch.setenv(ENV_MAX_DROPPED, value)
    monkeypatch.delenv("VERL_HPO_LOG_CAP_MIB", raising=False)
    assert (knob_problem() or "").startswith(f"VERL_HPO_MAX_DROPPED_ROWS={value!r}")
    monkeypatch.setenv(ENV_MAX_DROPPED, "3")
    assert knob_problem() is None
    monkeypatch.setenv("VERL_HPO_LOG_CAP_MIB", "tiny")
    assert (knob_problem() or "").startswith("VERL_HPO_LOG_CAP_MIB='tiny'")
    assert os.environ["VERL_HPO_LOG_CAP_MIB"] == "tiny"
