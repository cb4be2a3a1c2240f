"""Composing a space's corners in verl's interpreter, the driver's side (``hpo/backends/verl/_composer.py``): the
corners (every parameter at its ends, jointly, never at verl's default), an interpreter without verl refused in one
line naming ``make install-verl``, and the limit on how long composing may take (``VERL_HPO_COMPOSE_TIMEOUT_S``; a
busy host's run out of it is "not finished here": ``tests/hpo/commands/test_rehearse.py``). verl's own answers per
corner: ``test_check.py``; the script that runs there: ``test_compose.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.backends.verl import ComposeReport, VerlConfigError, check_space, space_corners
from hpo.backends.verl._composer import COMPOSE_TIMEOUT_ENV, COMPOSE_TIMEOUT_S, compose_timeout
from hpo.experiment import SpaceError
from tests.hpo.backends.verl.conftest import composed, load_verl_space
from tests.hpo.conftest import PY


def test_no_verl_in_the_interpreter_says_make_install_verl(tmp_path: Path) -> None:
    for python in (PY, str(tmp_path / "no-such-python")):  # the driver's venv has no verl
        with pytest.raises(VerlConfigError, match="make install-verl") as err:
            check_space(python, "ppo_trainer", [[]])
        assert err.value.where == "trial.python" and "\n" not in str(err.value)
    with pytest.raises(VerlConfigError, match="no such file"):
        check_space(PY, str(tmp_path / "missing.yaml"), [[]])


def test_the_corners_are_each_parameter_at_its_ends_with_the_fixed_overrides() -> None:
    space = load_verl_space()
    corners = space_corners(space)
    assert len(corners) == 2 * 2 * 2 * 3  # every joint corner of actor_lr, kl_coef, temperature, mini_batch
    assert corners[0].values == {p.name: p.corner_values()[0] for p in space.params}
    assert len({tuple(sorted(c.values.items())) for c in corners}) == len(corners)
    for corner in corners:  # the fixed overrides, then each parameter's key at the corner's value
        keys = [o.partition("=")[0] for o in corner.overrides]
        assert set(space.overrides) | {p.key for p in space.params} == set(keys)
    assert len(space_corners(space, max_corners=5)) == 5


def test_the_compose_limit_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPOSE_TIMEOUT_ENV, raising=False)
    assert compose_timeout() == COMPOSE_TIMEOUT_S
    monkeypatch.setenv(COMPOSE_TIMEOUT_ENV, "42")
    assert compose_timeout() == 42.0
    monkeypatch.setenv(COMPOSE_TIMEOUT_ENV, "1e400")
    with pytest.raises(SpaceError) as err:
        compose_timeout()
    assert str(err.value) == (f"{COMPOSE_TIMEOUT_ENV}='1e400': must be a number of seconds above 0 and at most 86400 "
                              "(how long composing verl's configs may take)")


def test_a_report_gives_the_composed_corners_and_the_first_refusal() -> None:
    refused = VerlConfigError("override 'x=1': no", "params.x")
    report = ComposeReport((composed(), refused, composed(val_n=4)), 3.0, (1.0, 1.0, 1.0))
    assert [c.val_n for c in report.corners] == [1, 4] and report.first_error is refused
    assert ComposeReport((composed(),), 1.0, (1.0,)).first_error is None
