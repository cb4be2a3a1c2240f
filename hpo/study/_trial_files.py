"""What a trial is launched with, beyond what its backend decides (:mod:`hpo.backends`): its directory, the driver's
part of its environment, the files that record the launch (``command.json``, ``params.json``, ``config.yaml``), and
the experiment's one-off prepare step. The contract with a trial is argv + env + the JSONL metrics file.

Every secret a trial gets (:mod:`hpo.experiment._secrets`) is in its environment, never its argv: the fixed
overrides' and, among the overrides a run adds (:func:`launch_extra`: ``study.baseline``'s, a confirmation's), each
secret key's value, replaced on argv by a reference to the variable that carries it (:func:`trial_env`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpo.backends import TrialConfig, backend_of, proxy_space
from hpo.execution import ENV_DRIVER, ENV_STUDY, ENV_TRIAL, TrialProcess, TrialRun
from hpo.experiment import (
    ENV_REF,
    MASK,
    Space,
    SpaceError,
    baseline_secrets,
    env_ref,
    is_env_ref,
    is_secret_key,
    secret_env_name,
    secret_overrides,
)
from hpo.study._checkpoints import TRIAL_MARKER
from hpo.study._errors import DriverError, TrialInterrupted
from hpo.study._progress import Progress


def fresh_trial_dir(trials_dir: Path, study_name: str, number: int, identity: dict[str, Any]) -> Path:
    """An empty ``trials/<number>`` holding the driver's marker. A leftover of an earlier attempt (marker
    present) is removed; anything else at that path is not the driver's to delete: DriverError."""
    trial_dir = trials_dir / str(number)
    if trial_dir.is_symlink() or (trial_dir.exists() and not (trial_dir / TRIAL_MARKER).is_file()):
        raise DriverError(f"{trial_dir} exists and was not created by verl-hpo; move it away to run trial "
                          f"{number}")
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    trial_dir.mkdir(parents=True)
    (trial_dir / TRIAL_MARKER).write_text(json.dumps(
        {"study": study_name, "trial": number, "driver": identity}) + "\n")
    return trial_dir


def launch_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides a run adds beyond the fixed and tuned ones (``study.baseline``'s, a confirmation's seed and
    held-out split) as its argv holds them: each secret key's value (not already a reference) replaced by a
    reference to the variable :func:`trial_env` puts it in."""
    return {k: env_ref(secret_env_name(k)) if is_secret_key(k) and v is not None and not is_env_ref(v) else v
            for k, v in extra.items()}


def extra_secrets(space: Space, extra: Mapping[str, Any]) -> dict[str, str]:
    """{variable: value} of the secrets among ``extra``: a value (its :func:`launch_extra` variable), or a
    reference to a ``study.baseline`` secret whose value the experiment holds (a stored one's: the driver's own
    environment). SpaceError, naming the variable, when a reference's variable is nowhere."""
    known = baseline_secrets(space.raw)
    out = {}
    for key, value in extra.items():
        if not is_secret_key(key) or value is None:
            continue
        m = ENV_REF.match(value) if isinstance(value, str) else None
        if m is None:
            out[secret_env_name(key)] = str(value)
        elif m.group(1) in known:
            out[m.group(1)] = known[m.group(1)]
        elif m.group(1) not in os.environ:
            raise SpaceError(f"{key}: its secret is not stored with the study; export {m.group(1)} in this driver's "
                             "environment and run it again")
    return out


def trial_env(space: Space, study_name: str, number: int, identity: dict[str, Any],
              devices: list[str], extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The driver's environment for one attempt (the backend's :meth:`~hpo.backends.Backend.plan` adds its own),
    with the secrets of the fixed overrides and of ``extra`` (the overrides the run adds, :func:`launch_extra`)."""
    env = dict(os.environ)
    env.update({k: v for k, v in space.trial.env.items() if v != MASK})  # a stored secret: the driver's own value
    env.update(secret_overrides(space.overrides))  # secret overrides: in the environment, never in argv
    env.update(extra_secrets(space, extra or {}))  # study.baseline's and any other run's own
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env["PYTHONUNBUFFERED"] = "1"
    env[ENV_STUDY] = study_name
    env[ENV_TRIAL] = str(number)
    env[ENV_DRIVER] = json.dumps(identity)
    return env


def write_trial_files(space: Space, cwd: str, trial_dir: Path, argv: list[str], env: dict[str, str],
                      config: TrialConfig, params: dict[str, Any]) -> None:
    shown_env = {k: MASK if is_secret_key(k) else env[k] for k in ("CUDA_VISIBLE_DEVICES", *space.trial.env)
                 if k in env}
    (trial_dir / "command.json").write_text(json.dumps(
        {"argv": argv, "env": shown_env, "cwd": cwd, "shell": shlex.join(argv)}, indent=2) + "\n")
    (trial_dir / "params.json").write_text(json.dumps(params, indent=2) + "\n")
    (trial_dir / "config.yaml").write_text(config.config_text)


def prepare(space: Space, study_dir: Path, cwd: str, reporter: Progress, stop_event: threading.Event) -> None:
    """Build the model/data the config needs once, before any trial (its time is no trial's); a proxy search's
    (``study.fidelity.proxy``) also with the proxy's overrides (its model), logged in ``prepare-proxy/``."""
    argv = backend_of(space).prepare_argv(space)
    proxy = backend_of(space).prepare_argv(proxy_space(space, {})) if space.study.fidelity.proxy else None
    if argv:
        _prepare(space, argv, study_dir / "prepare", cwd, reporter, stop_event)
    if proxy and proxy != argv:
        _prepare(space, proxy, study_dir / "prepare-proxy", cwd, reporter, stop_event)


def _prepare(space: Space, argv: list[str], log_dir: Path, cwd: str, reporter: Progress,
             stop_event: threading.Event) -> None:
    reporter.note(f"preparing model and data: {' '.join(argv[1:])}")
    env = {**os.environ, **secret_overrides(space.overrides)}  # the prepare step's argv holds secrets as references
    result = TrialProcess(TrialRun(argv, env, log_dir, log_dir / "metrics.jsonl", cwd=cwd,
                                   stop_event=stop_event)).run()
    if result.stop == "interrupted":
        raise TrialInterrupted("interrupted while preparing")
    if result.exit_code != 0:
        last = (result.stderr_tail.strip().splitlines() or ["(no output)"])[-1]
        if result.exit_code == 2:
            raise SpaceError(f"prepare failed: {last}")
        raise DriverError(f"prepare failed (exit {result.exit_code}): {last}; see {log_dir}/stderr.log")
