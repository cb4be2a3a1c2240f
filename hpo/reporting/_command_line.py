"""``verl-hpo best --format command``: the shell line that trains as a trial did, pasted anywhere.

The line is rebuilt from the stored experiment and the trial's values, through its backend's
:meth:`~hpo.backends.Backend.command_line` (the same code that planned the trial: verl's interpreter, the CPU platform's
overrides and environment, TRL's launcher and metrics file), never copied from the trial's ``command.json``, which
anyone who can write the studies directory may have changed. Of that file one fact is read, strictly: how many devices
the trial was handed (``CUDA_VISIBLE_DEVICES``, none for a trial on the CPU), which decides verl's platform; a file
that is not the driver's form is passed over, and the devices are those the driver would hand a trial here
(``trial.devices``, else the visible GPUs).

The environment comes first, as ``env [-u NAME ...] NAME=value ... <command>``: what the backend adds (its ``env``
prefix) and ``trial.env``. A secret never shows: a secret ``trial.env`` variable, and each variable through which the
driver hands a secret override to the trainer (``key=${oc.env:VERL_HPO_SECRET_<KEY>}`` on argv), is written
``NAME="${NAME:?}"``: the shell takes it from the user's environment, and stops with its name when it is not there
(:mod:`hpo.experiment._secrets`)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpo.backends import Attempt, backend_of
from hpo.experiment import MASK, Space, format_value, is_secret_key

# a reference to a variable through which the driver hands a secret override (hpo.experiment._secrets.secret_env_name)
_SECRET_REF = re.compile(r"\$\{oc\.env:(VERL_HPO_SECRET_[A-Za-z0-9_]*)\}")
MAX_COMMAND_JSON = 4 << 20  # bytes: a trial's argv and env are capped well below (hpo.experiment._limits)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICES = re.compile(r"^(?:[A-Za-z0-9-]{1,64}(?:,[A-Za-z0-9-]{1,64}){0,1023})?$")  # GPU indices or UUIDs


def best_command(space: Space, trial: Any) -> str:
    """The command line of ``trial`` (a FrozenTrial of ``space``'s study) as it ran (:func:`command_for`): its
    overrides as its backend configured them (:meth:`~hpo.backends.Backend.configure`: the fixed ones, secrets as
    references, and its tuned values, in the trainer's syntax; a place in the trial's directory, such as a
    checkpoint directory, is one in the current directory instead)."""
    try:
        overrides = backend_of(space).configure(Attempt(space=space, values=dict(trial.params),
                                                        trial_dir=Path("."))).overrides
    except (OSError, ValueError):  # the trainer's config is gone from here: the experiment's own overrides
        overrides = [*(f"{k}={format_value(v)}" for k, v in space.fixed_overrides().items()),
                     *(f"{p.key}={format_value(trial.params[p.name])}" for p in space.params if p.name in trial.params)]
    trial_dir = trial.user_attrs.get("trial_dir")
    return command_for(space, overrides, Path(trial_dir) if isinstance(trial_dir, str) and trial_dir else None)


def command_for(space: Space, overrides: Sequence[str], trial_dir: Path | None = None) -> str:
    """The shell line that runs the trainer of ``space`` with ``overrides`` as the trial in ``trial_dir`` ran (None:
    as a trial would run on this host), its environment first; see the module docstring."""
    if space.trial.executor != "ray":  # a Ray job's devices are trial.ray's
        gpus = trial_devices(trial_dir)
        gpus = host_devices(space) if gpus is None else gpus
        space = dataclasses.replace(space, trial=dataclasses.replace(space.trial, gpus_per_trial=gpus))
    argv = list(backend_of(space).command_line(space, list(overrides)))
    unset, added, cmd = split_env(argv)
    if cmd and cmd[0] == "python":  # the driver's interpreter, as Backend.command runs it
        cmd[0] = sys.executable
    env: dict[str, str | None] = {}  # None: a secret, taken from the user's environment
    for name, value in space.trial.env.items():
        if name not in unset:  # the backend took it away after trial.env was applied (verl's CPU platform)
            env[name] = None if value == MASK or is_secret_key(name) else value
    env.update(added)
    for o in overrides:  # quoted or not, as the trainer's syntax has it
        for name in _SECRET_REF.findall(o):
            env[name] = None
    return shell_line(unset, env, cmd)


def split_env(argv: Sequence[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """``env [-u NAME ...] [NAME=value ...] command...`` as (unset, set, command); an argv without ``env``: nothing
    to unset or set."""
    if not argv or argv[0] != "env":
        return [], {}, list(argv)
    unset: list[str] = []
    added: dict[str, str] = {}
    i = 1
    while i < len(argv):
        if argv[i] == "-u" and i + 1 < len(argv):
            unset.append(argv[i + 1])
            i += 2
        elif "=" in argv[i] and not argv[i].startswith("="):
            name, _, value = argv[i].partition("=")
            added[name] = value
            i += 1
        else:
            break
    return unset, added, list(argv[i:])


def shell_line(unset: Sequence[str], env: dict[str, str | None], cmd: Sequence[str]) -> str:
    """``env -u NAME NAME=value NAME="${NAME:?}" ... command`` quoted for a POSIX shell; the command alone when there
    is no environment. A secret whose name a shell cannot expand is left to the user's environment."""
    words = [w for name in unset if name not in env for w in ("-u", shlex.quote(name))]  # set again: not unset
    for name, value in env.items():
        if value is not None:
            words.append(shlex.quote(f"{name}={value}"))
        elif _NAME.match(name):
            words.append(f'{name}="${{{name}:?}}"')  # the shell's own value; it stops, naming it, when unset
    return " ".join(["env", *words, shlex.join(cmd)]) if words else shlex.join(cmd)


def trial_devices(trial_dir: Path | None) -> int | None:
    """The devices the trial in ``trial_dir`` was handed, from its ``command.json`` (``env.CUDA_VISIBLE_DEVICES``;
    absent: the trial's backend took it away for the CPU platform); None when the file is not there or not the
    driver's form (a regular file under :data:`MAX_COMMAND_JSON` bytes, an object whose ``env`` is an object of
    strings, the devices GPU indices or UUIDs)."""
    if trial_dir is None:
        return None
    path = trial_dir / "command.json"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_COMMAND_JSON:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if not _DEVICES.match(visible):
        return None
    return len(visible.split(",")) if visible else 0


def host_devices(space: Space) -> int:
    """The devices a trial of ``space`` gets on this host: ``trial.gpus_per_trial`` when there are any
    (``trial.devices``, else the visible GPUs), else none (the CPU), as the driver hands them out."""
    from hpo.execution import detect_devices

    devices = list(space.trial.devices) if space.trial.devices is not None else detect_devices()
    return space.trial.gpus_per_trial if devices else 0
