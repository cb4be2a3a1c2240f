"""The module loaded inside every process of a verl trial to record or replay its first rollout
(``hpo/backends/verl/in_verl/verl_hpo_first_rollout.py``), without verl: loaded with neither variable set it patches
nothing; a replay reads the records of regular ``.jsonl`` files only, each line bounded, a broken line skipped, in the
order recorded per prompt and session; what a process did is reported whole. Its patches of verl's own code run in
``tests/hpo/backends/verl/test_real.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.hpo.conftest import ROOT

IN_VERL = ROOT / "hpo" / "backends" / "verl" / "in_verl"
PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import verl_hpo_first_rollout as m
finder = any(type(f).__name__ == "_Finder" for f in sys.meta_path)
records = {f"{k[0]}|{k[1]}": [r["token_ids"] for r in v] for k, v in m._load().items()} if m._REPLAY else None
m._COUNTS["replayed"] = 3
m._report()
print(json.dumps({"finder": finder, "records": records, "key": list(m._key([5, 6, 7], 1))}))
"""


def probe(**env: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", PROBE, str(IN_VERL)], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", **env})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_with_neither_variable_set_nothing_is_patched() -> None:
    out = probe()
    assert out["finder"] is False and out["records"] is None


def test_a_replay_reads_only_regular_record_files_in_their_order(tmp_path: Path) -> None:
    key = probe()["key"]
    record = tmp_path / "record"
    record.mkdir()
    line = {"prompt": key[0], "session": key[1], "token_ids": [1], "stop_reason": "stop"}
    (record / "100.jsonl").write_text(json.dumps(line) + "\n" + "not json\n" + json.dumps({**line, "token_ids": [2]})
                                      + "\n" + json.dumps({"prompt": "other"}) + "\n")
    (record / "101.jsonl").write_text(json.dumps({**line, "session": 0, "token_ids": [9]}) + "\n")
    (record / "notes.txt").write_text(json.dumps({**line, "token_ids": [7]}) + "\n")  # not a record file
    outside = tmp_path / "planted.jsonl"
    outside.write_text(json.dumps({**line, "token_ids": [8]}) + "\n")
    (record / "102.jsonl").symlink_to(outside)  # never followed
    report = tmp_path / "report"
    out = probe(VERL_HPO_FIRST_ROLLOUT_REPLAY=str(record), VERL_HPO_FIRST_ROLLOUT_REPORT=str(report))
    assert out["finder"] is True
    assert out["records"] == {f"{key[0]}|1": [[1], [2]], f"{key[0]}|0": [[9]]}
    (written,) = report.iterdir()
    assert json.loads(written.read_text()) == {"recorded": 0, "replayed": 3, "missed": 0}
    assert not list(report.glob("*.tmp"))
