"""The ``tracking:`` section of an experiment file and ``--tracking`` on the command line: which experiment trackers
(MLflow, Weights & Biases) get one run per trial, grouped by study (what is logged: :mod:`hpo.tracking`).

.. code-block:: yaml

    tracking:
      mlflow:
        uri: http://mlflow.internal:5000   # null: $MLFLOW_TRACKING_URI; never a password (it would be stored)
        experiment: verl-hpo               # MLflow experiment holding the study's parent run
      wandb:
        project: verl-hpo
        entity: null                       # null: your default entity
        mode: online                       # online | offline (offline: run directories to `wandb sync` later)
        dir: null                          # null: <studies-dir>/<study>/tracking
      flush_s: 60                          # at the end of a study, wait this long for the logging to catch up

The section is stored with the experiment, so it must hold no secret: a credential in ``mlflow.uri`` (a password
or a token as its userinfo, a credential-named query parameter such as ``?token=``) is refused (use
``MLFLOW_TRACKING_TOKEN`` or ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, or pass the URI
with ``--tracking``, which is never stored); W&B reads its key from ``WANDB_API_KEY`` or ``wandb login``. Every
problem is one :class:`~hpo.experiment._errors.SpaceError` line naming the file (or flag), key and value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hpo.experiment._secrets import mask_uri, shown_value, uri_secrets

WANDB_MODES = ("online", "offline")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._/-]{0,127}$")
_WANDB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class MlflowSpec:
    uri: str | None = None
    """Tracking URI (``http(s)://host:port``, ``file:...``, ``sqlite:///...``); None: ``$MLFLOW_TRACKING_URI``."""
    experiment: str = "verl-hpo"
    """MLflow experiment: one parent run per study in it, the study's trials nested under it."""


@dataclass(frozen=True)
class WandbSpec:
    project: str = "verl-hpo"
    entity: str | None = None
    mode: str = "online"
    """online | offline (run directories under ``dir``; ``wandb sync`` them later)."""
    dir: str | None = None
    """Where W&B writes its run directories; None: ``<studies-dir>/<study>/tracking``."""


@dataclass(frozen=True)
class TrackingSpec:
    mlflow: MlflowSpec | None = None
    wandb: WandbSpec | None = None
    flush_s: float = 60.0
    """At the end of a study, how long the driver waits for the tracker to catch up (then ``verl-hpo track``)."""

    @property
    def enabled(self) -> bool:
        return self.mlflow is not None or self.wandb is not None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(raw: dict[str, Any]) -> TrackingSpec:
        ml, wb = raw.get("mlflow"), raw.get("wandb")
        return TrackingSpec(mlflow=None if ml is None else MlflowSpec(**ml),
                            wandb=None if wb is None else WandbSpec(**wb), flush_s=float(raw.get("flush_s", 60.0)))


# ----------------------------------------------------------------------------- secrets
def redact_uri(uri: str) -> str:
    """``uri`` as it is shown and logged: a password or a bare token in its userinfo, and credential-named query
    parameters, replaced by ``***`` (:func:`hpo.experiment._secrets.mask_uri`)."""
    return mask_uri(uri)


def uri_password(uri: str) -> str | None:
    """The first credential in ``uri`` (a userinfo password or token, a credential-named query value), or None."""
    found = uri_secrets(uri)
    return found[0] if found else None


# ----------------------------------------------------------------------------- the experiment file
Error = Callable[[str, str], Exception]


def _mapping(raw: Any, where: str, known: Sequence[str], error: Error) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise error(where, f"expected a mapping, got {raw!r}")
    for k in raw:
        if k not in known:
            raise error(f"{where}.{k}", f"unknown field (value {shown_value(k, raw[k])}); known: {', '.join(known)}")
    return raw


def _text(raw: dict[str, Any], key: str, where: str, error: Error, default: str | None,
          pattern: re.Pattern[str] | None = None) -> str | None:
    if key not in raw or raw[key] is None:
        return default
    v = raw[key]
    if not isinstance(v, str) or not v.strip():  # a URI's value is never shown (it may hold a credential)
        raise error(f"{where}.{key}", f"expected a non-empty string, got "
                    f"{'a ' + type(v).__name__ if key == 'uri' else repr(v)}")
    if pattern is not None and not pattern.match(v):
        raise error(f"{where}.{key}", f"{v!r}: use letters, digits and . _ - (at most 128 characters)")
    return v


def check_mlflow_uri(uri: str, where: str, error: Error, stored: bool) -> None:
    """A URI MLflow accepts; a stored one (the experiment file's) must not carry a password."""
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme not in ("http", "https", "file", "sqlite", "postgresql", "mysql", "databricks") and \
            not scheme.startswith(("postgresql+", "mysql+")):
        raise error(where, f"{redact_uri(uri)!r}: expected an http(s)://, file:, sqlite:///, postgresql:// or "
                    "databricks tracking URI")
    if stored and uri_secrets(uri):
        raise error(where, f"{redact_uri(uri)!r} holds a credential (a password or token in its userinfo or "
                    "query), which would be stored in the study; put it in an environment variable instead "
                    "(MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD), or pass the URI "
                    "with --tracking mlflow=URI, which is never stored")


def parse_tracking(raw: Any, error: Error) -> TrackingSpec:
    """The ``tracking:`` section (None or missing: no tracking)."""
    top = _mapping(raw, "tracking", ("mlflow", "wandb", "flush_s"), error)
    mlflow = wandb = None
    if "mlflow" in top:
        ml = _mapping(top["mlflow"], "tracking.mlflow", ("uri", "experiment"), error)
        uri = _text(ml, "uri", "tracking.mlflow", error, None)
        if uri is not None:
            check_mlflow_uri(uri, "tracking.mlflow.uri", error, stored=True)
        name = _text(ml, "experiment", "tracking.mlflow", error, "verl-hpo", _NAME_RE)
        assert name is not None
        mlflow = MlflowSpec(uri=uri, experiment=name)
    if "wandb" in top:
        wb = _mapping(top["wandb"], "tracking.wandb", ("project", "entity", "mode", "dir"), error)
        project = _text(wb, "project", "tracking.wandb", error, "verl-hpo", _WANDB_NAME_RE)
        entity = _text(wb, "entity", "tracking.wandb", error, None, _WANDB_NAME_RE)
        mode = _text(wb, "mode", "tracking.wandb", error, "online")
        if mode not in WANDB_MODES:
            raise error("tracking.wandb.mode", f"{mode!r} is not one of {', '.join(WANDB_MODES)}")
        assert project is not None and mode is not None
        directory = _text(wb, "dir", "tracking.wandb", error, None)
        wandb = WandbSpec(project=project, entity=entity, mode=mode, dir=directory)
    flush = top.get("flush_s", 60.0)
    if isinstance(flush, bool) or not isinstance(flush, (int, float)) or not 0 <= flush <= 86400:
        raise error("tracking.flush_s", f"expected seconds in 0..86400, got {flush!r}")
    return TrackingSpec(mlflow=mlflow, wandb=wandb, flush_s=float(flush))


# ----------------------------------------------------------------------------- --tracking
TRACKING_FLAG_HELP = ("mlflow[=URI] (default URI: the experiment file's, else $MLFLOW_TRACKING_URI), "
                      "wandb[=online|offline], or off; repeatable; replaces the experiment file's tracking section "
                      "for that tracker (a URI given here is never stored)")


def apply_flags(spec: TrackingSpec, flags: Sequence[str], error: Callable[[str], Exception]) -> TrackingSpec:
    """``--tracking`` texts applied to the experiment's section (``error(msg)`` for a bad one)."""
    for text in flags:
        name, sep, value = text.partition("=")
        name = name.strip().lower()
        shown = f"--tracking '{name}{sep}{redact_uri(value)}'"
        if name in ("off", "none") and not sep:
            spec = TrackingSpec(flush_s=spec.flush_s)
        elif name == "mlflow":
            ml = spec.mlflow or MlflowSpec()
            if sep:
                if not value:
                    raise error(f"{shown}: expected mlflow=URI")
                check_mlflow_uri(value, shown, lambda w, m: error(f"{w}: {m}"), stored=False)
                ml = dataclasses.replace(ml, uri=value)
            spec = dataclasses.replace(spec, mlflow=ml)
        elif name == "wandb":
            wb = spec.wandb or WandbSpec()
            if sep:
                if value not in WANDB_MODES:
                    raise error(f"{shown}: expected wandb, wandb=online or wandb=offline")
                wb = dataclasses.replace(wb, mode=value)
            spec = dataclasses.replace(spec, wandb=wb)
        else:
            raise error(f"{shown}: expected mlflow[=URI], wandb[=online|offline] or off")
    return spec
