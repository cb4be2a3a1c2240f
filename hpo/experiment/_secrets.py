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
(``hub_token: ${oc.env:HF_TOKEN}``) is passed through as it is. A secret takes one value: a mapping or a list is
refused, by key, with its value not shown (:func:`check_secret_value`).

``study.baseline`` follows the same rule: a secret there is held as a reference from the start
(``${oc.env:VERL_HPO_SECRET_BASELINE_<KEY>}``, :func:`baseline_env_name`; :func:`baseline_refs`), so whatever shows
the baseline shows the reference; its value stays in the experiment's raw mapping only, and reaches the baseline
runs' environment (:func:`baseline_secrets`; ``hpo.study._trial_files``).

URLs (a storage's, an MLflow tracking URI) are shown through :func:`mask_uri`: a password in the userinfo, a
userinfo that is a bare token (``https://TOKEN@host``; a database URL's bare user name is a role, shown), and every
credential-named query parameter (``?password=``, ``?token=``, ``?access_token=``, ``?api_key=`` ...) become
:data:`MASK`; :func:`uri_secrets` lists what was masked (to scrub from error texts, and to refuse a credential in an
experiment file, which would be stored).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

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
    """The experiment as stored: each secret override's value replaced by its reference, each secret
    ``study.baseline`` value by its baseline reference, each secret ``trial.env`` value by :data:`MASK` (a copy;
    ``raw`` is not changed)."""
    out = dict(raw)
    fixed = raw.get("overrides")
    if isinstance(fixed, dict):
        out["overrides"] = {k: (env_ref(secret_env_name(k)) if isinstance(k, str) and is_secret_key(k)
                                and v is not None and not is_env_ref(v) else v) for k, v in fixed.items()}
    study = raw.get("study")
    if isinstance(study, dict) and isinstance(study.get("baseline"), dict):
        out["study"] = {**study, "baseline": baseline_refs(study["baseline"])}
    trial = raw.get("trial")
    if isinstance(trial, dict) and isinstance(trial.get("env"), dict):
        out["trial"] = {**trial, "env": {k: (MASK if isinstance(k, str) and is_secret_key(k) else v)
                                         for k, v in trial["env"].items()}}
    return out


def masked(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` (keys to values) as it may be shown: each secret key's value (not a reference) :data:`MASK`."""
    return {k: MASK if isinstance(k, str) and is_secret_key(k) and v is not None and not is_env_ref(v) else v
            for k, v in mapping.items()}


def shown_value(key: Any, value: Any) -> str:
    """``repr(value)`` for an error line, or a note in its place when ``key`` names a secret."""
    if isinstance(key, str) and is_secret_key(key) and not is_env_ref(value):
        return "<a secret, not shown>"
    return repr(value)


def check_secret_value(where: str, key: Any, value: Any, error: Callable[[str, str], Exception]) -> None:
    """A secret takes one value (a string, a number, a reference): a mapping or a list is refused, naming the key
    (``where``), never the value."""
    if isinstance(key, str) and is_secret_key(key) and isinstance(value, (dict, list, tuple)):
        kind = "a mapping" if isinstance(value, dict) else "a list"
        raise error(where, f"{key!r} names a secret: it takes one value (a string), got {kind} (its content is "
                    "not shown)")


# ----------------------------------------------------------------------------- study.baseline
def baseline_env_name(key: str) -> str:
    """The environment variable that carries the value of the secret ``study.baseline`` key ``key`` (its own, not
    the fixed override's: the two may differ)."""
    return secret_env_name("baseline." + key.lstrip("+~"))


def baseline_refs(baseline: Mapping[str, Any]) -> dict[str, Any]:
    """``study.baseline`` as a run holds it: each secret value (not a reference) replaced by its reference."""
    return {k: (env_ref(baseline_env_name(k)) if isinstance(k, str) and is_secret_key(k) and v is not None
                and not is_env_ref(v) else v) for k, v in baseline.items()}


def baseline_secrets(raw: Mapping[str, Any]) -> dict[str, str]:
    """{environment variable: value} of the secret ``study.baseline`` values in an experiment's raw mapping (none
    in a stored one: those are references)."""
    study = raw.get("study")
    baseline = study.get("baseline") if isinstance(study, dict) else None
    if not isinstance(baseline, dict):
        return {}
    return {baseline_env_name(k): str(v) for k, v in baseline.items()
            if isinstance(k, str) and is_secret_key(k) and v is not None and not is_env_ref(v)
            and not isinstance(v, (dict, list))}


def missing_secrets(overrides: Mapping[str, Any], env: Mapping[str, str], environ: Mapping[str, str],
                    baseline: Mapping[str, Any] | None = None) -> list[str]:
    """What a run of a stored experiment lacks here: the environment variable of each secret override (and secret
    ``study.baseline`` value) that is a reference to a variable not in ``environ``, and each masked ``trial.env``
    variable not in ``environ``."""
    out = []
    for where, mapping in (("overrides", overrides), ("study.baseline", baseline or {})):
        for key, value in mapping.items():
            m = ENV_REF.match(value) if isinstance(value, str) else None
            if is_secret_key(key) and m is not None and m.group(1) not in environ:
                out.append(f"{m.group(1)} ({where}.{key})")
    out += [f"{k} (trial.env.{k})" for k, v in env.items() if v == MASK and k not in environ]
    return out


# ----------------------------------------------------------------------------- URLs
# a database URL's bare user name (``postgresql://alice@host``) is a role, not a credential
_DB_SCHEMES = ("postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle", "sqlite", "redis", "rediss", "unix",
               "cockroachdb")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(//)?")
# a query parameter named for a credential: password, pwd, sslpassword, token, access_token, api_key, apikey,
# secret, client_secret, credential(s), auth, sig / signature (a signed URL), key (sslkey, a key's path: shown masked)
_CREDENTIAL_PARAM = re.compile(r"pass|pwd|secret|token|key|credential|auth|sig", re.IGNORECASE)


def _userinfo(uri: str) -> tuple[int, int] | None:
    """Where the userinfo of ``uri`` is (start, end: the index of its ``@``), or None. A password may hold ``/``,
    ``?`` or ``#`` unescaped (SQLAlchemy reads ``user:password@`` up to the ``@``): then it is still found."""
    m = _SCHEME.match(uri)
    if m is None or not m.group(2):
        return None
    start = m.end()
    rest = uri[start:]
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0], default=len(rest))
    at = rest.rfind("@", 0, end)
    if at >= 0:
        return start, start + at
    loose = re.match(r"[^/?#@:]*:[^@]*@", rest)
    return (start, start + loose.end() - 1) if loose else None


def _db_scheme(uri: str) -> bool:
    m = _SCHEME.match(uri)
    return m is not None and m.group(1).lower().split("+", 1)[0] in _DB_SCHEMES


def _query_secrets(uri: str) -> list[tuple[int, int]]:
    """(start, end) of each credential-named query parameter's value in ``uri``."""
    q = uri.find("?")
    if q < 0:
        return []
    out = []
    for m in re.finditer(r"([^&;#=]*)=([^&;#]*)", uri[q + 1:]):
        if m.group(2) and _CREDENTIAL_PARAM.search(unquote(m.group(1))):
            out.append((q + 1 + m.start(2), q + 1 + m.end(2)))
    return out


def _secret_spans(uri: str) -> list[tuple[int, int]]:
    """(start, end) of each secret in ``uri``: the userinfo's password (the whole userinfo when it is a bare token),
    then each credential-named query value after it."""
    spans = []
    info = _userinfo(uri)
    if info is not None:
        start, at = info
        user, colon, _ = uri[start:at].partition(":")
        if colon:
            spans.append((start + len(user) + 1, at))
        elif at > start and not _db_scheme(uri):
            spans.append((start, at))
    after = info[1] if info is not None else 0
    shifted = uri[after:]
    return spans + [(after + s, after + e) for s, e in _query_secrets(shifted)]


def mask_uri(uri: str) -> str:
    """``uri`` as it may be shown: each secret (:func:`uri_secrets`) replaced by :data:`MASK`."""
    out, last = [], 0
    for start, end in _secret_spans(uri):
        out += [uri[last:start], MASK]
        last = end
    return "".join(out) + uri[last:]


def uri_secrets(uri: str) -> list[str]:
    """The secrets in ``uri`` as written and percent-decoded (empty: none): what :func:`mask_uri` hides."""
    found = [uri[s:e] for s, e in _secret_spans(uri) if e > s]
    return list(dict.fromkeys([*found, *(unquote(f) for f in found)]))
