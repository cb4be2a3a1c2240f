"""What a trial is launched with: its directory, its trainer command line (config + overrides), its environment and
the files that record them (``command.json``, ``params.json``, ``config.yaml``), and the experiment's one-off
``prepare_command``. The contract with a trial is argv + env + the JSONL metrics file (no import of the trainer,
except verl_core's config loader for the default command)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from hpo.backends.verl._launch import verl_overrides
from hpo.execution import ENV_DRIVER, ENV_STUDY, ENV_TRIAL, TrialProcess
from hpo.experiment._heldout import TEST_KEY
from hpo.experiment._space import Space, SpaceError, format_value
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


def trial_command(space: Space) -> list[str]:
    cmd = list(space.trial.command)
    if cmd and cmd[0] == "python":  # the driver's interpreter (the venv), not whatever is on PATH
        cmd[0] = sys.executable
    return cmd


def trainer_overrides(space: Space, values: dict[str, Any], trial_dir: Path,
                      extra: dict[str, Any] | None = None) -> list[str]:
    """The trial's trainer overrides: fixed ones, tuned values, then ``extra`` (which replaces a fixed
    override of the same key, e.g. a confirmation run's seed)."""
    extra = extra or {}
    if space.trial.is_verl:  # hydra syntax (one value per key); the driver's own keys come from verl_argv
        fixed = {k: v for k, v in space.overrides.items() if k not in extra}
        return verl_overrides(fixed, {**{p.key: values[p.name] for p in space.params if p.name in values}, **extra})
    overrides = space.trainer_overrides(values) + [f"{k}={format_value(v)}" for k, v in extra.items()]
    if space.trial.is_default_command:
        overrides.append(f"trainer.default_local_dir={trial_dir / 'checkpoints'}")
        if TEST_KEY not in extra:  # a search trial never evaluates the held-out split, whatever the config says
            overrides.append(f"{TEST_KEY}=null")
    return overrides


def total_steps(space: Space, overrides: list[str]) -> int | None:
    if space.trial.is_default_command:
        from verl_core.config import load_config

        return int(load_config(space.config, overrides).trainer.total_training_steps)
    for o in overrides:
        if o.startswith("trainer.total_training_steps="):
            try:
                return int(o.partition("=")[2])
            except ValueError:
                return None
    return None


def trial_env(space: Space, study_name: str, number: int, identity: dict[str, Any], devices: list[str],
              metrics: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(space.trial.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env["VERL_FILE_LOGGER_PATH"] = str(metrics)  # verl's own file-logger variable
    env["PYTHONUNBUFFERED"] = "1"
    env[ENV_STUDY] = study_name
    env[ENV_TRIAL] = str(number)
    env[ENV_DRIVER] = json.dumps(identity)
    return env


def write_trial_files(space: Space, cwd: str, trial_dir: Path, argv: list[str], env: dict[str, str],
                      overrides: list[str], params: dict[str, Any]) -> None:
    shown_env = {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", *space.trial.env) if k in env}
    (trial_dir / "command.json").write_text(json.dumps(
        {"argv": argv, "env": shown_env, "cwd": cwd, "shell": shlex.join(argv)}, indent=2) + "\n")
    (trial_dir / "params.json").write_text(json.dumps(params, indent=2) + "\n")
    if space.trial.is_default_command:
        from verl_core.config import dump_yaml, load_config

        text = dump_yaml(load_config(space.config, overrides))
    else:
        text = yaml.safe_dump({"config": space.config, "overrides": overrides}, sort_keys=False)
    (trial_dir / "config.yaml").write_text(text)


def prepare(space: Space, study_dir: Path, cwd: str, reporter: Progress, stop_event: threading.Event) -> None:
    """Build the model/data the config needs once, before any trial (its time is no trial's)."""
    cmd = space.trial.prepare_command
    if not cmd:
        return
    argv = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(cmd)]
    argv += ["--config", space.config, *space.trainer_overrides({})]
    log_dir = study_dir / "prepare"
    reporter.note(f"preparing model and data: {' '.join(argv[1:])}")
    result = TrialProcess(argv=argv, env=dict(os.environ), log_dir=log_dir, metrics_path=log_dir / "metrics.jsonl",
                          cwd=cwd, stop_event=stop_event).run()
    if result.stop == "interrupted":
        raise TrialInterrupted("interrupted while preparing")
    if result.exit_code != 0:
        last = (result.stderr_tail.strip().splitlines() or ["(no output)"])[-1]
        if result.exit_code == 2:
            raise SpaceError(f"prepare failed: {last}")
        raise DriverError(f"prepare failed (exit {result.exit_code}): {last}; see {log_dir}/stderr.log")
