"""The rehearsal's reward check (``hpo/backends/verl/_shrink.py``, run in verl's interpreter) bounded in time and in
what the user's function prints (issue 44 item 8), and the driver keeping only the end of a helper's output: a
looping function costs the limit, not 15 minutes; a function that prints 50 MB costs 64 KiB."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[3]
VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
pytestmark = pytest.mark.skipif(not VERL_PY.exists(), reason="needs .venv-verl (make install-verl)")


def _check(tmp_path: Path, body: str, timeout_s: float) -> tuple[dict, float, int]:
    reward = tmp_path / "reward.py"
    reward.write_text(textwrap.dedent(body))
    val = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "mine", "reward_model": {"ground_truth": "4"},
                                          "extra_info": {"index": i}} for i in range(3)]), val)
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT / "hpo" / "backends" / "verl")!r})
        import _shrink
        from omegaconf import OmegaConf
        cfg = OmegaConf.create({{"reward": {{"custom_reward_function": {{"path": {str(reward)!r},
                                                                         "name": "compute_score"}}}}}})
        print(json.dumps(_shrink.check_reward(cfg, {str(val)!r}, timeout_s={timeout_s})))
    """)
    started = time.monotonic()
    res = subprocess.run([str(VERL_PY), "-c", script], capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.decode().strip().splitlines()[-1]), time.monotonic() - started, len(res.stdout)


def test_a_looping_reward_function_is_stopped_at_the_limit(tmp_path: Path) -> None:
    out, seconds, _ = _check(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            while True:
                pass
    """, timeout_s=5)
    msg = out["problem"]["message"]
    # on a busy host the limit may already end the module's load ("its first call"), else the first row's call
    assert "did not return within 5 s" in msg and "--reward-timeout" in msg, msg
    assert "validation row 0" in msg or "its first call" in msg, msg
    assert seconds < 240, seconds  # the limit, not the 900 s it was


def test_what_a_reward_function_prints_is_capped_and_counted(tmp_path: Path) -> None:
    out, _, stdout_bytes = _check(tmp_path, """
        import sys
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            sys.stdout.write("x" * 5_000_000)
            print("y" * 1_000_000, file=sys.stderr)
            return 1.0 if solution_str.strip() == ground_truth else 0.0
    """, timeout_s=60)
    assert "problem" not in out and out["calls"] > 0
    assert out["printed_bytes"] >= 6_000_000 * out["calls"] and out["printed_dropped_bytes"] > 5_000_000
    assert stdout_bytes < 100_000  # none of it reached the reply's stream


def test_the_driver_keeps_only_the_end_of_a_helper_s_output(tmp_path: Path) -> None:
    from hpo.backends.verl._rehearse_steps import SCRIPT_TAIL_BYTES, _script

    chatty = tmp_path / "chatty.py"
    chatty.write_text("import sys, json\nsys.stdin.read()\nfor _ in range(50):\n    sys.stdout.write('z' * 1_000_000)"
                      "\nsys.stdout.write('\\n' + json.dumps({'status': 'ok', 'n': 1}) + '\\n')\n")
    assert _script(sys.executable, chatty, {"x": 1}, 120, {}) == {"status": "ok", "n": 1}
    assert SCRIPT_TAIL_BYTES < 50_000_000


@pytest.mark.parametrize("body, needles", [
    ("def compute_score(:\n    pass\n", ["SyntaxError", "reward.py:1"]),
    ("import nonexistent_scoring_lib\ndef compute_score(*a, **k):\n    return 0.0\n",
     ["ModuleNotFoundError", "'nonexistent_scoring_lib' is not installed", "reward.py:1"]),
    ("def helper():\n    raise KeyError('oops')\nhelper()\n", ["KeyError", "reward.py:2"]),
])
def test_a_reward_module_that_does_not_load_names_its_root_cause(tmp_path: Path, body: str,
                                                                  needles: list[str]) -> None:
    """verl wraps every load failure in ``RuntimeError: Error loading module from module_path=...``: the line says
    the real exception, the file and line, and the missing module (issue 43 item 5)."""
    out, _, _ = _check(tmp_path, body, timeout_s=60)
    msg = out["problem"]["message"]
    assert "does not load" in msg and "Error loading module" not in msg, msg
    for n in needles:
        assert n in msg, msg
