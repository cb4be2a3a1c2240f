"""Which stored experiments a driver may run on this host.

A study stores its experiment in the shared storage, so that ``resume`` (and every worker joining the
study) can run it without the file. Anyone who can write that storage can edit it, so the parts that
decide *which programs run here* are not taken from it on trust. Those parts are the backend and its
interpreter, the trial and prepare commands, the trials' extra environment, a trainer config given as a
path (a YAML file can name code), and trainer keys that load user code. Which keys those are, and which commands
are the trainer's own, is the trainer's backend's to say (:class:`CodeRules`, ``Backend.code_rules()``; e.g.
verl_core's ``custom_reward_function.*`` and ``evaluation.custom``; for a verl study every key, since hydra's
``_target_`` instantiates code); the driver passes them in, this layer knows no trainer.

* A stored experiment whose executable part is the default (its trainer's own command on a shipped config, no
  interpreter, extra environment or user code), of a trainer whose backend says that runs no code but its own
  (``CodeRules.default_runs_unasked``), runs: its fixed overrides and parameters are trainer settings,
  which the trainer validates.
* Otherwise it runs only when a local experiment file (``--space FILE``, else the file the study was
  made from, if it exists here) has the same executable part, or when the user passes
  ``--trust-stored-experiment``.

The study also records ``hpo:space_sha256``, the digest of the experiment it was made from, shown when a
check fails.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo.experiment._secrets import MASK, is_secret_key
from hpo.experiment._space import Space, SpaceError, read_space

TRUST_FLAG = "--trust-stored-experiment"


@dataclass(frozen=True)
class CodeRules:
    """What a trainer's backend says about which of an experiment's settings run code (``Backend.code_rules()``)."""

    default_command: tuple[str, ...] = ()  # its own trial.command: an experiment that leaves it (or names it) runs it
    default_prepare_command: tuple[str, ...] | None = None  # the same for trial.prepare_command
    code_keys: tuple[str, ...] = ()  # key prefixes whose values name code to load
    every_key_is_code: bool = False  # any key may name code (e.g. hydra's ``_target_``)
    # its own commands on a shipped config, with no interpreter, environment or code key of the experiment's, run no
    # code but the trainer's: a stored experiment that is that runs unasked (not for a trainer whose config is a
    # file of the user's)
    default_runs_unasked: bool = False


def experiment_digest(raw: dict[str, Any]) -> str:
    """sha256 of the experiment's canonical JSON (sorted keys)."""
    text = json.dumps(raw, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _is_shipped_config(config: str) -> bool:
    return "/" not in config and not config.endswith((".yaml", ".yml"))


def executable_part(space: Space, rules: CodeRules = CodeRules(), default_backend: str = "") -> dict[str, Any]:
    """What decides which programs a trial runs (see the module docstring), by the trainer's ``rules``: its own
    commands count as unset (None), whether the experiment names them or not (a study stored before the default
    command moved into its backend names it), and code keys are those it names (every key with
    ``every_key_is_code``); an unset ``trial.backend`` is ``default_backend`` (the registry's default trainer)."""
    every, prefixes = rules.every_key_is_code, rules.code_keys
    code = {k: v for k, v in space.fixed_overrides().items() if every or (prefixes and k.startswith(prefixes))}
    code.update({f"params.{p.name}": p.key for p in space.params
                 if every or (prefixes and p.key.startswith(prefixes))})
    proxy = space.study.fidelity.proxy  # a proxy run's overrides reach its trainer as the fixed ones do
    code.update({f"study.fidelity.proxy.overrides.{k}": v for k, v in (proxy.overrides if proxy else {}).items()
                 if every or (prefixes and k.startswith(prefixes))})
    command, prepare = space.trial.command, space.trial.prepare_command
    return {
        "trial.backend": space.trial.backend or default_backend,
        "trial.python": space.trial.python,
        "trial.command": None if command in (None, rules.default_command) else list(command or ()),
        "trial.prepare_command": None if prepare in (None, rules.default_prepare_command) else list(prepare or ()),
        "trial.env": {k: MASK if is_secret_key(k) else v for k, v in space.trial.env.items()},  # stored masked
        "config": None if _is_shipped_config(space.config) else space.config,
        "code keys": code,
    }


def is_default(part: dict[str, Any], rules: CodeRules) -> bool:
    return (rules.default_runs_unasked and part["trial.python"] is None
            and part["trial.command"] is None and part["trial.prepare_command"] is None
            and not part["trial.env"] and part["config"] is None and not part["code keys"])


def _parsed(path: str) -> Space:
    return read_space(path)[0]


def _local_space(path: Path, read: Callable[[str], Space]) -> Space | None:
    try:
        return read(str(path))
    except SpaceError:
        return None


def check_stored_experiment(stored: Space, study_name: str, local_path: str | None, stored_source: str | None,
                            trusted: bool, stored_digest: str | None = None, rules: CodeRules = CodeRules(),
                            default_backend: str = "", read_local: Callable[[str], Space] = _parsed) -> str:
    """Raise SpaceError unless the stored experiment may run here; returns how it was accepted (``rules``: the stored
    experiment's trainer's, see :func:`executable_part`; ``default_backend``: the trainer of a local file that names
    none; ``read_local``: a local experiment file read as ``stored`` was, e.g. its relative ``config`` resolved beside
    it, so that the two compare alike)."""
    part = executable_part(stored, rules, default_backend)
    if is_default(part, rules):
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
        local = _local_space(path, read_local)
        if local is not None and executable_part(local, rules, default_backend) == part:
            return str(path)
    differs = [k for k in part if part[k] not in (None, {}, []) and (k != "trial.backend" or
                                                                       not rules.default_runs_unasked)]
    where = f"{candidates[0]} differs" if candidates else "no local experiment file to compare with"
    digest = f" (sha256 {stored_digest[:12]})" if stored_digest else ""
    raise SpaceError(
        f"study {study_name!r}: its stored experiment{digest} sets {', '.join(differs)}, which run code on this "
        f"host, and {where}; pass --space FILE with the same experiment, or {TRUST_FLAG} to run it anyway")
