"""What ``verl-hpo rehearse --recheck`` reads back (``hpo/backends/verl/_rehearse_state.py``): without a rehearsal, or
on a state file that is not what the rehearsal wrote, one line, exit 2, at once (the quick load: no corner is composed
by verl), never a traceback; each field's type and range checked; a good state rechecked from the home's own trial
directories."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpo.backends import load_space
from hpo.backends.verl._rehearse_state import MARKER, STATE, fingerprint, load_state
from tests.hpo.backends.verl.conftest import CPU_SPACE
from tests.hpo.conftest import cli_env

SPACE = CPU_SPACE


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
    assert proc.returncode == 2 and "is malformed (corners[0].name: 1 is not a text)" in proc.stderr \
        and "Traceback" not in proc.stderr, proc.stderr


def _state(**changes: object) -> dict[str, object]:
    """A state as the rehearsal writes it (one finished corner), with ``changes`` (``corner.X``, ``result.X``,
    ``before``: that field replaced)."""
    result: dict[str, object] = {"exit_code": 1, "stop": None, "wall_time_s": 3.0, "final_exception": "ValueError: x",
                                 "stderr_tail": "", "kernel_oom": False}
    corner: dict[str, object] = {"name": "default", "values": {"actor_lr": 1e-6}, "trial_dir": "/elsewhere/0-default",
                                 "index": 0, "resumed_from": None, "results": [result]}
    state: dict[str, object] = {"fingerprint": fingerprint(load_space(str(SPACE))), "quick": True, "swaps": ["s"],
                                "before": [{"check": "data", "level": "ok", "message": "fine"}], "corners": [corner]}
    for key, value in changes.items():
        where, _, field = key.partition("__")
        {"corner": corner, "result": result, "state": state}[where][field] = value
    return state


@pytest.mark.parametrize(("changes", "why"), [
    ({"corner__index": "1e400"}, "corners[0].index: inf is not an integer from 0 to 63"),
    ({"corner__index": -1}, "corners[0].index: -1 is not an integer from 0 to 63"),
    ({"corner__name": "../../x"}, "corners[0].name: '../../x' is not a corner's name (letters, digits, _ and -)"),
    ({"corner__values": {"actor_lr": [1]}}, "corners[0].values.actor_lr: [1] is not a parameter value (a number, a "
                                            "text, true, false or null)"),
    ({"result__final_exception": {"a": 1}}, "corners[0].results[0].final_exception: {'a': 1} is not a text"),
    ({"result__exit_code": 10**30}, "corners[0].results[0].exit_code: 1000000000000000000000000000000 is not an "
                                    "integer from -255 to 255"),
    ({"result__wall_time_s": "1e400"}, "corners[0].results[0].wall_time_s: inf is not a number of seconds from 0 to "
                                       "1e+09"),
    ({"result__stderr_tail": None}, "corners[0].results[0].stderr_tail: None is not a text"),
    ({"state__before": [{"check": 1, "level": "ok", "message": "m"}]}, "before[0].check: 1 is not a text"),
    ({"state__before": [{"check": "c", "level": ["x"], "message": "m"}]}, "before[0].level: ['x'] is not a text"),
    ({"state__before": [{"check": "c", "level": "weird", "message": "m"}]},
     "before[0].level: 'weird' is not one of ok, note, unfinished, problem"),
    ({"state__before": [{"check": "c", "level": "ok", "message": 3}]}, "before[0].message: 3 is not a text"),
    ({"state__swaps": [None]}, "swaps[0]: None is not a text"),
    ({"state__quick": "yes"}, "quick: 'yes' is not true or false"),
])
def test_each_field_of_the_state_is_checked(tmp_path: Path, changes: dict[str, object], why: str) -> None:
    """Each field's type and range (the reader itself, in-process: a millisecond each)."""
    from hpo.experiment import SpaceError

    home = _home(tmp_path, _state(**changes))
    with pytest.raises(SpaceError) as err:
        load_state(home, load_space(str(SPACE)))
    assert str(err.value) == f"{SPACE}: the rehearsal state {home / STATE} is malformed ({why}): rehearse again"


def _home(tmp_path: Path, state: dict[str, object]) -> Path:
    home = tmp_path / "studies" / "rehearsals" / "verl_grpo_cpu"
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).touch()
    (home / STATE).write_text(json.dumps(state).replace('"1e400"', "1e400"))  # JSON Python reads as inf
    return home


def test_the_issue_s_states_are_one_line_from_the_command_line(tmp_path: Path) -> None:
    """issue 53 item 8: a state file with ``index: 1e400``, a non-text ``final_exception`` or findings with
    non-text fields gave a traceback; each is one line naming the file and the field, exit 2."""
    for changes, why in (({"corner__index": "1e400"}, "corners[0].index: inf is not an integer from 0 to 63"),
                         ({"result__final_exception": {"a": 1}},
                          "corners[0].results[0].final_exception: {'a': 1} is not a text"),
                         ({"state__before": [{"check": 1, "level": ["x"], "message": 3}]},
                          "before[0].check: 1 is not a text")):
        home = _home(tmp_path, _state(**changes))
        proc, _ = _recheck(tmp_path)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"error: {SPACE}: the rehearsal state {home / STATE} is malformed ({why}): rehearse again"]


def test_a_good_state_is_rechecked_from_the_home_s_own_trial_directories(tmp_path: Path) -> None:
    """The same file, well formed: the corner's logs are looked for in the home's own ``trials/0-default``, never the
    ``trial_dir`` the file names."""
    home = _home(tmp_path, _state())
    proc, _ = _recheck(tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"corner default (actor_lr=1e-06) failed (crash): ValueError: x (logs: {home / 'trials' / '0-default'})" \
        in proc.stdout, proc.stdout
