"""A chatty trainer's logs are capped (issue 52, item 8): a trial's stdout.log and stderr.log keep their head and their
tail, say in the file what was cut, and the driver says which log of which trial was cut; the tail still holds the
trainer's last words after a SIGKILL of the whole trial. Real trial processes (the wrapper, the log pump)."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from hpo.execution import TrialProcess, TrialRun
from tests.hpo.conftest import PY

MIB = 1 << 20
CUT = re.compile(rb"^\[verl-hpo: (\d+) bytes \((\d+) lines\) cut here: this log went over its cap of (\S+) MiB", re.M)

# a trainer whose reward prints a line per call: numbered lines to stderr (100 bytes each), then its last words;
# metrics as the contract says, stdout a line
CHATTY = textwrap.dedent('''
    import json, os, signal, sys
    lines, metrics, end = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    out = sys.stderr.buffer
    out.write(b"trainer starting: config loaded\\n")
    pad = b"r" * 83 + b"\\n"
    for i in range(lines):
        out.write(b"reward %08d " % i + pad)
    out.write(b"LAST WORDS: step 2 done\\n")
    out.flush()
    with open(metrics, "w") as f:
        f.write(json.dumps({"step": 1, "data": {"score": 1.0}}) + "\\n")
    print("stdout: trained 1 step", flush=True)
    if end == "sigkill":  # the whole trial at once: the trainer and its wrapper (one process group)
        os.killpg(0, signal.SIGKILL)
''')


def run_chatty(tmp_path: Path, lines: int, end: str = "exit") -> tuple[object, Path]:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    log_dir = tmp_path / "trial"
    metrics = log_dir / "metrics.jsonl"
    result = TrialProcess(TrialRun([PY, str(script), str(lines), str(metrics), end], dict(os.environ), log_dir,
                                   metrics)).run()
    return result, log_dir


def check_cut(log: bytes, lines: int, cap: int) -> tuple[int, int]:
    """The capped log is head + one cut line + tail, in order, nothing else lost: (bytes cut, lines cut)."""
    assert len(log) <= cap
    cuts = CUT.findall(log)
    assert len(cuts) == 1, log[:200]
    cut_bytes, cut_lines = int(cuts[0][0]), int(cuts[0][1])
    assert float(cuts[0][2]) * MIB == cap
    head, _, tail = log.partition(CUT.search(log).group(0))  # type: ignore[union-attr]
    tail = tail.split(b"\n", 1)[1]
    assert head.startswith(b"trainer starting: config loaded\n") and head.endswith(b"\n")
    assert tail.endswith(b"LAST WORDS: step 2 done\n")
    numbers = [int(n) for n in re.findall(rb"^reward (\d{8}) ", log, re.M)]
    split = next(i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1)
    assert numbers[:split] == list(range(split)) and numbers[split:] == list(range(numbers[split], lines))
    assert cut_lines == numbers[split] - split  # exactly the lines missing between head and tail
    assert cut_bytes == cut_lines * 100
    assert len(head) >= cap // 4 - 200 and len(tail) >= cap // 2 - 200  # a quarter of the cap, at least half of it
    return cut_bytes, cut_lines


@pytest.mark.timeout(120)  # a hang guard only (~2 s on a loaded 2-core host); the cap's cost: test_logpump.py
def test_a_trainer_that_prints_50_mb_to_stderr_leaves_its_head_its_tail_and_the_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERL_HPO_LOG_CAP_MIB", raising=False)
    lines = 500_000  # 50 MB
    result, log_dir = run_chatty(tmp_path, lines)
    assert result.exit_code == 0 and result.failure is None and result.last_step == 1  # the trial still finishes
    log = (log_dir / "stderr.log").read_bytes()
    cut_bytes, _ = check_cut(log, lines, 16 * MIB)  # the default cap: 16 MiB
    assert result.logs_cut == {"stderr.log": cut_bytes}
    assert result.stderr_tail.endswith("LAST WORDS: step 2 done")  # what failure labels read
    assert (log_dir / "stdout.log").read_text() == "stdout: trained 1 step\n"
    notes = [n for n in result.log_notes if n.startswith("stderr.log went over its cap of 16 MiB")]
    assert len(notes) == 1 and str(log_dir / "stderr.log") in notes[0] and f"{cut_bytes / 1e6:.1f} MB" in notes[0]


@pytest.mark.timeout(120)
def test_the_tail_keeps_the_last_words_of_a_trial_killed_whole_by_sigkill(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer and its wrapper die by SIGKILL together: the pump, outside the trial, has written every byte it
    read, so the log ends with the trainer's last line and the failure label reads it."""
    monkeypatch.setenv("VERL_HPO_LOG_CAP_MIB", "4")  # the knob changes the cap
    lines = 200_000  # 20 MB
    result, log_dir = run_chatty(tmp_path, lines, end="sigkill")
    assert result.exit_code == -9 and result.failure == "killed"
    check_cut((log_dir / "stderr.log").read_bytes(), lines, 4 * MIB)
    assert result.stderr_tail.endswith("LAST WORDS: step 2 done")
    assert list(result.logs_cut) == ["stderr.log"]


def test_a_log_under_its_cap_is_left_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_HPO_LOG_CAP_MIB", "1")
    result, log_dir = run_chatty(tmp_path, 10_000)  # 1 MB: under 1 MiB
    log = (log_dir / "stderr.log").read_bytes()
    assert result.exit_code == 0 and result.logs_cut == {} and result.log_notes == ()
    assert len(log) == 10_000 * 100 + 56 and not CUT.search(log)


@pytest.mark.parametrize("value", ["lots", "0.5", "-3"])
def test_a_bad_cap_is_one_line_naming_the_variable_before_anything_runs(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         value: str) -> None:
    monkeypatch.setenv("VERL_HPO_LOG_CAP_MIB", value)
    with pytest.raises(ValueError) as err:
        run_chatty(tmp_path, 10)
    assert str(err.value).startswith(f"VERL_HPO_LOG_CAP_MIB={value!r}: expected a number of MiB >= 1")
    assert not (tmp_path / "trial" / "stderr.log").exists()
