"""Which stored experiments a driver may run on this host.

A study stores its experiment in the shared storage, so that ``resume`` (and every worker joining the
study) can run it without the file. Anyone who can write that storage can edit it, so the parts that
decide *which programs run here* are not taken from it on trust. Those parts are the backend and its
interpreter, the trial and prepare commands, the trials' extra environment, a trainer config given as a
path (a YAML file can name code), and trainer keys that load user code (``custom_reward_function.*``,
``evaluation.custom``; for a verl study every key, since hydra's ``_target_`` instantiates code).

* A stored experiment whose executable part is the default (``python -m verl_core train`` on a shipped
  config, no extra environment, no user code) runs: its fixed overrides and parameters are trainer
  settings, which the trainer validates.
* Otherwise it runs only when a local experiment file (``--space FILE``, else the file the study was
  made from, if it exists here) has the same executable part, or when the user passes
  ``--trust-stored-experiment``.

The study also records ``hpo:space_sha256``, the digest of the experiment it was made from, shown when a
check fails.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hpo.experiment._secrets import MASK, is_secret_key
from hpo.experiment._space import DEFAULT_COMMAND, DEFAULT_PREPARE_COMMAND, Space, SpaceError, TrialSpec, read_space

CODE_KEY_PREFIXES = ("custom_reward_function.", "evaluation.custom")
TRUST_FLAG = "--trust-stored-experiment"


def experiment_digest(raw: dict[str, Any]) -> str:
    """sha256 of the experiment's canonical JSON (sorted keys)."""
    text = json.dumps(raw, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _is_shipped_config(config: str) -> bool:
    return "/" not in config and not config.endswith((".yaml", ".yml"))


def executable_part(space: Space, every_key_is_code: bool = False) -> dict[str, Any]:
    """What decides which programs a trial runs (see the module docstring). ``every_key_is_code``: the trainer may
    load code named by any key (verl: hydra's ``_target_`` and its custom reward paths; ``Backend.every_key_is_code``),
    not only by :data:`CODE_KEY_PREFIXES`."""
    every = every_key_is_code
    code = {k: v for k, v in space.fixed_overrides().items() if every or k.startswith(CODE_KEY_PREFIXES)}
    code.update({f"params.{p.name}": p.key for p in space.params if every or p.key.startswith(CODE_KEY_PREFIXES)})
    prepare = space.trial.prepare_command
    return {
        "trial.backend": space.trial.backend,
        "trial.python": space.trial.python,
        "trial.command": list(space.trial.command),
        "trial.prepare_command": None if prepare in (None, DEFAULT_PREPARE_COMMAND) else list(prepare or ()),
        "trial.env": {k: MASK if is_secret_key(k) else v for k, v in space.trial.env.items()},  # stored masked
        "config": None if _is_shipped_config(space.config) else space.config,
        "code keys": code,
    }


def is_default(part: dict[str, Any]) -> bool:
    return (part["trial.backend"] == TrialSpec().backend and part["trial.python"] is None
            and part["trial.command"] == list(DEFAULT_COMMAND)
            and part["trial.prepare_command"] in (None, list(DEFAULT_PREPARE_COMMAND))
            and not part["trial.env"] and part["config"] is None and not part["code keys"])


def _local_space(path: Path) -> Space | None:
    try:
        return read_space(str(path))
    except SpaceError:
        return None


def check_stored_experiment(stored: Space, study_name: str, local_path: str | None, stored_source: str | None,
                            trusted: bool, stored_digest: str | None = None, every_key_is_code: bool = False) -> str:
    """Raise SpaceError unless the stored experiment may run here; returns how it was accepted (``every_key_is_code``:
    see :func:`executable_part`)."""
    part = executable_part(stored, every_key_is_code)
    if is_default(part):
        return "default trainer"
    if trusted:
        return TRUST_FLAG
    candidates: list[Path] = []
    if local_path is not None:
        p = Path(local_path)
        if not p.is_file():  # (read_yaml reads it without following it into a FIFO or a device)
            raise SpaceError(f"--space {local_path}: " + ("not a regular file" if p.exists() else
                                                           "no such experiment file"))
        candidates.append(p)
    elif stored_source and stored_source.endswith((".yaml", ".yml")) and Path(stored_source).is_file():
        candidates.append(Path(stored_source))
    for path in candidates:
        local = _local_space(path)
        if local is not None and executable_part(local, every_key_is_code) == part:
            return str(path)
    differs = [k for k in part if part[k] not in (None, {}, [])
               and (k != "trial.backend" or part[k] != TrialSpec().backend)
               and (k != "trial.command" or part[k] != list(DEFAULT_COMMAND))
               and (k != "trial.prepare_command" or part[k] != list(DEFAULT_PREPARE_COMMAND))]
    where = f"{candidates[0]} differs" if candidates else "no local experiment file to compare with"
    digest = f" (sha256 {stored_digest[:12]})" if stored_digest else ""
    raise SpaceError(
        f"study {study_name!r}: its stored experiment{digest} sets {', '.join(differs)}, which run code on this "
        f"host, and {where}; pass --space FILE with the same experiment, or {TRUST_FLAG} to run it anyway")
