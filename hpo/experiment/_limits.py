"""What keeps every trial of an experiment launchable and its study's storage responsive, checked when the file is
parsed rather than once a study exists: at most :data:`MAX_PARAMS` tuned parameters, no trial argument over Linux's
per-argument limit and a trial's argv and environment well under ``ARG_MAX`` (:func:`check_argv_sizes`), and user
code named by a fixed override a regular file (:func:`check_code_files`, which the backends' check calls with the
trainer's own code keys). Each problem is one
:class:`~hpo.experiment._errors.SpaceError` line naming the field, never a long value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from hpo.analysis import FileRefused, check_regular
from hpo.experiment._errors import ErrorContext
from hpo.experiment._schema import Param, TrialSpec, format_value

# Parameters a space may tune: Optuna stores every suggested value in a transaction of its own (measured on SQLite:
# 4 ms a parameter idle, 13-16 ms on a busy 2-core host), so a trial of 7,500 parameters spent 30-120 s being
# suggested before it started.
MAX_PARAMS = 1000
MAX_ARG_BYTES = 128 * 1024 - 1  # Linux MAX_ARG_STRLEN: the longest single argv entry execve accepts
MAX_ARGV_BYTES = 512 * 1024  # argv + the trial's own env entries: well under ARG_MAX (2 MiB by default)


def check_param_count(count: int, ctx: ErrorContext) -> None:
    """At most :data:`MAX_PARAMS` tuned parameters."""
    if count > MAX_PARAMS:
        raise ctx.error("params", f"{count} parameters; at most {MAX_PARAMS} (Optuna's storage writes each "
                        "parameter of each trial in its own transaction: 4-16 ms each on SQLite, 30-120 s per trial "
                        "at 7,500)")


def check_argv_sizes(fixed: dict[str, Any], params: tuple[Param, ...], trial: TrialSpec, ctx: ErrorContext) -> None:
    """Every trial must be launchable: no argument over Linux's 128 KiB per-argument limit, and the trainer's argv
    (with the longest choice of each parameter) plus the trial's own environment well under ``ARG_MAX``;
    otherwise ``execve`` fails with "Argument list too long" only once a study exists. The errors give sizes and
    the field, never the (long) value."""
    def size(text: str) -> int:
        return len(text.encode("utf-8", "surrogateescape")) + 1

    sizes: list[tuple[int, str, str]] = []  # (bytes, field, what a single one of them may have)
    for k, v in fixed.items():
        sizes.append((size(f"{k}={format_value(v)}"), f"overrides.{k}", "one argument of a trial"))
    for p in params:
        longest = max((size(f"{p.key}={format_value(c)}") for c in p.choices), default=0) if p.choices else 64
        sizes.append((longest, f"params.{p.name}.choices", "one argument of a trial (its longest choice)"))
    sizes += [(size(c), f"trial.command[{i}]", "one argument") for i, c in enumerate(trial.command or ())]
    sizes += [(size(f"{k}={v}"), f"trial.env.{k}", "one variable") for k, v in trial.env.items()]
    for n, where, what in sizes:
        if n > MAX_ARG_BYTES:
            raise ctx.error(where, f"{n} bytes; {what} may have at most {MAX_ARG_BYTES} (Linux MAX_ARG_STRLEN)")
    total = sum(n for n, _, _ in sizes)
    if total > MAX_ARGV_BYTES:
        n, where, _ = max(sizes, key=lambda s: s[0])  # the first of the largest
        raise ctx.error(where, f"a trial's arguments and trial.env add up to {total} bytes, the largest being this "
                        f"one ({n} bytes); at most {MAX_ARGV_BYTES} fit beside the environment under Linux's ARG_MAX")


def check_code_files(fixed: dict[str, Any], error: Callable[[str, str], Exception],
                     code_files: Callable[[str, Any], Sequence[str]]) -> None:
    """A user-code file that a fixed override names (``code_files(key, value)``: the trainer's backend says which
    keys name files, ``Backend.code_files``) and that exists here must be a regular file: importing a FIFO blocks, and
    ``/dev/zero`` is read without end, in the trainer and in its config check alike. (A missing file is the trainer's
    to report: it may exist only where the trials run.)"""
    for key, value in fixed.items():
        for path in code_files(key, value):
            try:
                if path and os.path.exists(os.path.expanduser(path)):
                    check_regular(os.path.expanduser(path), path)
            except FileRefused as err:
                raise error(f"overrides.{key}", f"{err}; user code must be a regular .py file") from None
            except OSError:
                pass  # unreadable here: the trainer says why where it runs
