"""A Ray job's log (what the driver writes to the trial's stderr.log from the job's log stream) is capped and its
dropped rows counted as a local trial's are (issue 52, items 1 and 8), against the fake job client of
``test_job`` (no cluster)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from hpo.backends.verl._backend import VerlBackend
from hpo.execution.ray_jobs import _entry
from tests.hpo.execution.ray_jobs.test_job import FakeClient, run_job


def test_a_chatty_job_s_log_is_capped_and_its_dropped_prompts_counted(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_HPO_LOG_CAP_MIB", "1")
    chatter = "(TaskRunner pid=11) " + "x" * 79 + "\n"  # 100 bytes
    dropped = textwrap.dedent("""\
        (AgentLoopWorkerTQ pid=7) ERROR:2026-01-01 10:00:00,000:Error in _run_prompt for uid=4f0c-1
        (AgentLoopWorkerTQ pid=7) Traceback (most recent call last):
        (AgentLoopWorkerTQ pid=7)   File "reward.py", line 3, in compute_score
        (AgentLoopWorkerTQ pid=7)     return float(int(ground_truth) == 57)
        (AgentLoopWorkerTQ pid=7) ValueError: invalid literal for int() with base 10: 'NA'
        (AgentLoopWorkerTQ pid=8) ERROR:2026-01-01 10:00:01,000:Error in _run_prompt for uid=9a1d-2
        """)
    log = (chatter * 20_000 + dropped + chatter * 20_000 + "the job's last line\n"
           + f"{_entry.PREFIX}{json.dumps({'step': 1, 'data': {'score': 1.0}})}\n" + f"{_entry.END}{{\"exit\": 0}}\n")
    _, res = run_job(tmp_path, monkeypatch, FakeClient(log), dropped_row_patterns=VerlBackend.dropped_row_patterns)
    assert (res.exit_code, res.failure, res.last_step) == (0, None, 1)
    assert res.dropped_rows == 2
    assert res.dropped_rows_error.startswith("ValueError: invalid literal for int() with base 10: 'NA' (after: ")
    text = (tmp_path / "trial" / "stderr.log").read_bytes()
    assert len(text) <= 1 << 20 and text.endswith(b"the job's last line\n")
    cut = re.findall(rb"^\[verl-hpo: (\d+) bytes \((\d+) lines\) cut here", text, re.M)
    assert len(cut) == 1 and res.logs_cut == {"stderr.log": int(cut[0][0])}
    assert res.stderr_tail.endswith("the job's last line")
