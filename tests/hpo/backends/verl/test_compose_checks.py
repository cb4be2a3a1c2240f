"""What verl's interpreter makes of one composed corner besides verl's own checks
(``hpo/backends/verl/_compose_checks.py``, imported by ``_compose.py`` there): why a user's module did not load, from
the root of verl's wrapped exceptions; one call of the user's reward function bounded in time; and which of
``algorithm.gamma`` / ``lam`` an advantage estimator reads, from verl 0.9.1's own code. The checks on composed configs
themselves: ``test_check.py``'s corners."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpo.backends.verl._compose_checks import CALL_LIMIT_ENV, _bounded, call_limit, estimator_reads, load_error
from tests.hpo.backends.verl.conftest import VERL_PY, needs_verl
from tests.hpo.conftest import ROOT


def _wrapped(cause: BaseException) -> RuntimeError:
    """What verl raises for a module that does not load: its own RuntimeError over the real cause."""
    try:
        try:
            raise cause
        except BaseException as err:
            raise RuntimeError("Error loading module from module_path=/x/reward.py") from err
    except RuntimeError as wrapper:
        return wrapper


def test_a_module_that_does_not_load_is_named_by_its_root_cause(tmp_path: Path) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text("import os\n\nimport nonexistent_scoring_lib\n")
    try:
        exec(compile(reward.read_text(), str(reward), "exec"), {})
    except ModuleNotFoundError as err:
        missing = _wrapped(err)
    assert load_error(missing) == (f"ModuleNotFoundError: No module named 'nonexistent_scoring_lib' (the module "
                                   f"'nonexistent_scoring_lib' is not installed in {sys.executable}) at {reward}:3")
    try:
        compile("def compute_score(:\n", str(reward), "exec")
    except SyntaxError as err:
        broken = _wrapped(err)
    assert load_error(broken).startswith("SyntaxError: ") and load_error(broken).endswith(f" at {reward}:1")


def test_one_call_is_bounded_in_time_and_a_coroutine_is_awaited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CALL_LIMIT_ENV, raising=False)
    assert call_limit(30.0) == 30.0
    monkeypatch.setenv(CALL_LIMIT_ENV, "2.5")
    assert call_limit() == 2.5
    monkeypatch.setenv(CALL_LIMIT_ENV, "soon")
    assert call_limit(7.0) == 7.0  # the driver refuses such a value before it runs this; here: the default
    assert _bounded(5.0, lambda x: x + 1, x=1) == 2

    async def score(x: int) -> int:
        await asyncio.sleep(0)
        return x * 3

    assert _bounded(5.0, score, x=2) == 6
    finished: list[bool] = []

    def slow() -> None:  # a minute, unless interrupted
        time.sleep(60)
        finished.append(True)

    with pytest.raises(TimeoutError):
        _bounded(0.3, slow)
    assert finished == []  # the limit cut the call short: not a TimeoutError after the function's minute


def test_which_of_gamma_and_lambda_an_estimator_reads() -> None:
    assert estimator_reads("gae") == ["gamma", "lam"] and estimator_reads("grpo") == []
    assert estimator_reads("reinforce_plus_plus") is None  # not decidable without verl's code: here, no verl


@needs_verl
def test_verl_s_own_estimators_are_read_from_its_code() -> None:
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import _compose_checks as c; "
            "print(json.dumps([c.estimator_reads(a) for a in ('reinforce_plus_plus', 'grpo', 'no_such_estimator')]))")
    res = subprocess.run([str(VERL_PY), "-c", code, str(ROOT / "hpo" / "backends" / "verl")], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [["gamma"], [], None]
