"""Secrets in an experiment: a fixed override or a ``trial.env`` variable whose name says it holds a token, a password,
a secret or an API key (``hub_token``, ``wandb.api_key``, ``HF_TOKEN``, ``db_password``; :func:`is_secret_key`).

Such a value never appears in a trial's argv, its ``command.json`` or ``config.yaml``, the driver's output, the study's
storage or the dashboard, and the trial still receives it:

* an override goes to the trainer as ``key=${oc.env:VERL_HPO_SECRET_<KEY>}`` (:func:`secret_env_name`) with the value
  in that environment variable of the trial; verl's hydra resolves the reference itself, the TRL launcher at start-up
  (``hpo/backends/trl/_keys.py`` ``resolve_env_refs``), a custom command reads the variable (``verl_core`` has no
  secret key);
* the stored experiment holds the same reference instead of the value (:func:`masked_raw`), so ``resume``, ``worker``
  and ``confirm`` read the value from the driver's environment (``export VERL_HPO_SECRET_<KEY>=...``), and say so in
  one line when it is not there;
* a ``trial.env`` variable is stored as :data:`MASK` and taken from the driver's environment on resume.

Tuning a secret is refused (Optuna stores every parameter value). A value that is already a reference
(``hub_token: ${oc.env:HF_TOKEN}``) is passed through as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
ENV_REF = re.compile(r"^\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}$")
_SECRET_WORDS = ("password", "passwd", "secret", "apikey", "credential", "credentials")
# ``<word>_token`` keys that name a vocabulary entry, not a credential (tokenizers' special tokens)
_TEXT_TOKENS = ("pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "stop", "special", "image", "video",
                "audio", "vision", "think", "placeholder", "default", "first", "last", "min", "max", "num", "new")


def is_secret_key(key: str) -> bool:
    """A key or variable named for a secret: its last dotted part ends with the word ``token`` (not ``tokens``, not
    ``max_token_len``, not a tokenizer's ``pad_token`` / ``eos_token`` ...), or has ``password``, ``secret``,
    ``api_key`` / ``apikey``, ``access_key`` or ``credential``."""
    last = key.lstrip("+~").rsplit(".", 1)[-1].lower()
    words = [w for w in re.split(r"[^a-z0-9]+", last) if w]
    if not words:
        return False
    joined = "_".join(words)
    token = words[-1] == "token" and (len(words) == 1 or words[-2] not in _TEXT_TOKENS)
    return (token or any(w in _SECRET_WORDS for w in words) or "api_key" in joined
            or joined.endswith("_key") and words[-2:-1] == ["access"])


def secret_env_name(key: str) -> str:
    """The trial's environment variable that carries the value of the secret override ``key``."""
    return "VERL_HPO_SECRET_" + re.sub(r"[^A-Za-z0-9]+", "_", key.lstrip("+~")).strip("_").upper()


def env_ref(name: str) -> str:
    return "${oc.env:" + name + "}"


def is_env_ref(value: Any) -> bool:
    return isinstance(value, str) and ENV_REF.match(value) is not None


def secret_overrides(overrides: Mapping[str, Any]) -> dict[str, str]:
    """{environment variable: value} of the secret fixed overrides that hold a value (not a reference)."""
    return {secret_env_name(k): str(v) for k, v in overrides.items()
            if is_secret_key(k) and v is not None and not is_env_ref(v)}


def masked_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """The experiment as stored: each secret override's value replaced by its reference, each secret ``trial.env``
    value by :data:`MASK` (a copy; ``raw`` is not changed)."""
    out = dict(raw)
    fixed = raw.get("overrides")
    if isinstance(fixed, dict):
        out["overrides"] = {k: (env_ref(secret_env_name(k)) if isinstance(k, str) and is_secret_key(k)
                                and v is not None and not is_env_ref(v) else v) for k, v in fixed.items()}
    trial = raw.get("trial")
    if isinstance(trial, dict) and isinstance(trial.get("env"), dict):
        out["trial"] = {**trial, "env": {k: (MASK if isinstance(k, str) and is_secret_key(k) else v)
                                         for k, v in trial["env"].items()}}
    return out


def missing_secrets(overrides: Mapping[str, Any], env: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """What a run of a stored experiment lacks here: the environment variable of each secret override that is a
    reference to a variable not in ``environ``, and each masked ``trial.env`` variable not in ``environ``."""
    out = []
    for key, value in overrides.items():
        m = ENV_REF.match(value) if isinstance(value, str) else None
        if is_secret_key(key) and m is not None and m.group(1) not in environ:
            out.append(f"{m.group(1)} (overrides.{key})")
    out += [f"{k} (trial.env.{k})" for k, v in env.items() if v == MASK and k not in environ]
    return out
