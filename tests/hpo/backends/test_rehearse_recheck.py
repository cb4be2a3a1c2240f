"""``verl-hpo rehearse --recheck`` without a rehearsal, or on a state file that is not what the rehearsal wrote: one
line, exit 2, at once (the quick load: no corner is composed by verl), never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpo.backends import load_space
from hpo.backends.verl._rehearse import MARKER, STATE, fingerprint
from tests.hpo.conftest import cli_env

SPACE = Path(__file__).resolve().parents[3] / "search_spaces" / "verl_grpo_cpu.yaml"


def _recheck(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", str(SPACE), "--recheck",
                           "--studies-dir", str(tmp_path / "studies")], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - started


def test_recheck_without_a_rehearsal_is_one_line_at_once(tmp_path: Path) -> None:
    proc, seconds = _recheck(tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no finished rehearsal" in proc.stderr and "Traceback" not in proc.stderr
    assert seconds < 30, seconds  # the quick load (~1 s); composing every corner took 50-109 s


def test_a_malformed_state_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "studies" / "rehearsals" / "verl_grpo_cpu"
    home.mkdir(parents=True)
    (home / MARKER).touch()
    (home / STATE).write_text("[]")
    proc, _ = _recheck(tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is malformed (a JSON list" in proc.stderr and "Traceback" not in proc.stderr
    space = load_space(str(SPACE))  # the right fingerprint, corners that are not what the rehearsal writes
    (home / STATE).write_text(json.dumps({"fingerprint": fingerprint(space), "corners": [{"name": 1}], "before": [],
                                          "quick": True, "swaps": []}))
    proc, _ = _recheck(tmp_path)
    assert proc.returncode == 2 and "is malformed (KeyError" in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr


def test_a_study_whose_retries_start_over_is_said() -> None:
    """verl's default trainer.save_freq (-1) saves only at the last step: validate and rehearse say a retry starts
    over (issue 43 item 6); the shipped verl_grpo_cpu saves every 4 of 8 steps."""
    from hpo.backends.verl._resume import retry_note

    shipped = load_space(str(SPACE))
    assert retry_note(shipped) is None
    import dataclasses

    none = dataclasses.replace(shipped, overrides={k: v for k, v in shipped.overrides.items()
                                                   if k != "trainer.save_freq"})
    assert "trainer.save_freq=-1: no checkpoint before the last step" in (retry_note(none) or "")
    last = dataclasses.replace(shipped, overrides={**shipped.overrides, "trainer.save_freq": 8})
    assert "starts over from step 0" in (retry_note(last) or "")


def test_quick_says_the_resume_was_not_checked() -> None:
    from hpo.backends.verl._rehearse_checks import check_runs

    notes = [f for f in check_runs(load_space(str(SPACE)), [], resumed=False) if f.check == "resume"]
    assert [f.level for f in notes] == ["note"] and "not checked (--quick)" in notes[0].message


def test_a_cpu_study_s_estimate_says_it_is_for_a_gpu() -> None:
    """verl_grpo_cpu's trials train on the CPU: the verl estimate is for a GPU and says so, never 'no GPU visible'
    as if the trials needed one (issue 43 item 7)."""
    from hpo.backends.verl._memory import _verl_budget

    budget, source, _ = _verl_budget(load_space(str(SPACE)), [], None)
    assert "trials run on the CPU (trial.gpus_per_trial: 0)" in source and budget > 0
