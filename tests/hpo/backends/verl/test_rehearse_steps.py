"""The rehearsal's steps in verl's interpreter (``hpo/backends/verl/_rehearse_steps.py``): the driver keeps only the
end of a helper script's output (its reply is the last line), and its own composing steps that run out of their time
on a busy host are "not finished here" (exit 3) with the limit and how to raise it, never a failure that blames the
experiment or the install. The slow host is an interpreter that never answers (``trial.python`` a script that
sleeps): no verl is needed."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml

from hpo.backends import load_space
from hpo.backends.verl._rehearse_checks import exit_code
from hpo.backends.verl._rehearse_corners import _Runner, rehearsal_corners
from hpo.backends.verl._rehearse_steps import SCRIPT_TAIL_BYTES, _Rehearsal, _script
from tests.hpo.backends.verl.conftest import CPU_SPACE


def _slow_interpreter(tmp_path: Path) -> Path:
    """The shipped CPU experiment with a ``trial.python`` that never answers (a host too busy to compose in time)."""
    python = tmp_path / "slow-python"
    python.write_text("#!/bin/sh\nexec sleep 60\n")
    python.chmod(0o755)
    raw = yaml.safe_load(CPU_SPACE.read_text())
    raw["trial"]["python"] = str(python)
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_driver_keeps_only_the_end_of_a_helper_s_output(tmp_path: Path) -> None:
    chatty = tmp_path / "chatty.py"
    chatty.write_text("import sys, json\nsys.stdin.read()\nfor _ in range(50):\n    sys.stdout.write('z' * 1_000_000)"
                      "\nsys.stdout.write('\\n' + json.dumps({'status': 'ok', 'n': 1}) + '\\n')\n")
    assert _script(sys.executable, chatty, {"x": 1}, 120, {}) == {"status": "ok", "n": 1}
    assert SCRIPT_TAIL_BYTES < 50_000_000


def test_the_rehearsal_s_own_composing_steps_out_of_time_are_not_finished_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the load, the rehearsal composes again (its corners with the prompts measured; the corners shrunk for the
    CPU): out of time there is NOT FINISHED HERE, exit 3, never "a real study would fail" / "run make install-verl"
    (what a busy host got before)."""
    monkeypatch.setenv("VERL_HPO_COMPOSE_TIMEOUT_S", "0.5")
    space = load_space(str(_slow_interpreter(tmp_path)))
    python = space.trial.python or ""
    corners = rehearsal_corners(space)
    out = io.StringIO()
    r = _Rehearsal(space, tmp_path, python, lambda _line: None, "text", out, 0.0)
    assert r.compose(corners, None) is None
    r.check_cpu_corners(_Runner(space, python, tmp_path, [], 60.0, lambda _line: None), corners)
    assert [(f.check, f.level) for f in r.findings] == [("config", "unfinished"), ("config", "unfinished")]
    assert all("took over 0.5 s on this machine" in f.message and "VERL_HPO_COMPOSE_TIMEOUT_S" in f.message
               and "install-verl" not in f.message for f in r.findings), r.findings
    assert r.finish() == exit_code(r.findings) == 3
    assert out.getvalue().startswith(f"rehearsal of {space.source}: NOT FINISHED HERE: this machine could not finish "
                                     "the rehearsal's config step in its time (not rehearsed, not failed)")
