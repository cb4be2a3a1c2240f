"""What keeps every trial launchable (:mod:`hpo.experiment._limits`), checked at load: the number of tuned parameters,
Linux's per-argument limit and the trial's argv and environment under ``ARG_MAX`` (sizes and the field named, never
the long value), and user code that must be a regular file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpo.experiment._errors import ErrorContext, SpaceError
from hpo.experiment._limits import (
    MAX_ARG_BYTES,
    MAX_ARGV_BYTES,
    MAX_PARAMS,
    check_argv_sizes,
    check_code_files,
    check_param_count,
)
from hpo.experiment._schema import Param, TrialSpec

CTX = ErrorContext("exp.yaml", {})


def _refusal(fixed: dict[str, object], params: tuple[Param, ...] = (), trial: TrialSpec = TrialSpec()) -> str | None:
    try:
        check_argv_sizes(fixed, params, trial, CTX)
    except SpaceError as err:
        return str(err)
    return None


def test_at_most_max_params_parameters() -> None:
    check_param_count(MAX_PARAMS, CTX)
    with pytest.raises(SpaceError, match=rf"^exp.yaml: params: {MAX_PARAMS + 1} parameters; at most {MAX_PARAMS} "):
        check_param_count(MAX_PARAMS + 1, CTX)


def test_one_argument_over_linux_s_limit_is_named_by_its_field_and_size() -> None:
    key = "data.path"
    fits = "x" * (MAX_ARG_BYTES - len(key) - 2)  # key=value and its NUL: exactly the limit
    assert _refusal({key: fits}) is None
    line = _refusal({key: fits + "x"})
    assert line == (f"exp.yaml: overrides.{key}: {MAX_ARG_BYTES + 1} bytes; one argument of a trial may have at most "
                    f"{MAX_ARG_BYTES} (Linux MAX_ARG_STRLEN)")
    choice = Param("p", "model.prompt", "categorical", choices=("short", "y" * MAX_ARG_BYTES))
    assert "params.p.choices:" in (_refusal({}, (choice,)) or "")  # its longest choice
    assert "trial.env.BIG:" in (_refusal({}, trial=TrialSpec(env={"BIG": "z" * MAX_ARG_BYTES})) or "")
    assert "trial.command[1]:" in (_refusal({}, trial=TrialSpec(command=("python", "w" * MAX_ARG_BYTES))) or "")


def test_arguments_that_add_up_past_the_budget_name_the_largest_and_never_a_value() -> None:
    each = MAX_ARG_BYTES // 2
    fixed = {f"k{i}": chr(ord("a") + i) * each for i in range(MAX_ARGV_BYTES // each + 1)}
    line = _refusal(fixed)
    assert line is not None and line.startswith("exp.yaml: overrides.k0: a trial's arguments and trial.env add up to ")
    assert f"at most {MAX_ARGV_BYTES} fit" in line and "aaaa" not in line
    assert _refusal(dict(list(fixed.items())[:2])) is None


def test_user_code_must_be_a_regular_file_where_it_exists_here(tmp_path: Path) -> None:
    fifo = tmp_path / "reward.py"
    os.mkfifo(fifo)
    regular = tmp_path / "ok.py"
    regular.write_text("def f(): pass\n")
    named = {"reward.path": str(fifo), "other.path": str(regular), "gone.path": str(tmp_path / "missing.py")}

    def code_files(key: str, value: object) -> list[str]:
        return [str(value)] if key.endswith(".path") else []

    def error(where: str, msg: str) -> SpaceError:
        return SpaceError(f"{where}: {msg}")

    with pytest.raises(SpaceError, match=r"^overrides.reward.path: .*user code must be a regular .py file$"):
        check_code_files(named, error, code_files)
    named.pop("reward.path")
    check_code_files(named, error, code_files)  # a regular file; one missing here is the trainer's to report
    check_code_files({"x": "/dev/zero"}, error, lambda k, v: [])  # a key the trainer does not name: not code
    with pytest.raises(SpaceError, match="overrides.x"):
        check_code_files({"x": "/dev/zero"}, error, lambda k, v: [str(v)])
