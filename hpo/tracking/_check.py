"""Before a study starts: is each tracker of the experiment usable here? Its package installed (found without
importing it: the driver never loads mlflow or wandb), the MLflow server answering ``/health``, a W&B key for
online mode, and every local destination writable: an MLflow ``file:`` store or ``sqlite:`` database, W&B's
``tracking.wandb.dir`` (a file is made there and removed; directories made for it are removed again). Each problem
is one line; ``--tracking-optional`` turns them into warnings and drops that tracker."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import netrc
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from hpo.analysis import ARTIFACTS_DIR
from hpo.experiment import SpaceError, TrackingSpec, redact_uri

HEALTH_TIMEOUT_S = 5.0
INSTALL = "pip install -e '.[tracking]'"


def mlflow_uri(spec: TrackingSpec) -> str | None:
    """The MLflow tracking URI in use: the experiment's / ``--tracking``'s, else ``$MLFLOW_TRACKING_URI``."""
    if spec.mlflow is None:
        return None
    return spec.mlflow.uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def _health(uri: str) -> str | None:
    """None when ``<uri>/health`` answers 200; else why not (no secret in it)."""
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    url = urlunsplit(parts._replace(netloc=host, path=parts.path.rstrip("/") + "/health", query="", fragment=""))
    req = urllib.request.Request(url)
    user = parts.username or os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = parts.password or os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=HEALTH_TIMEOUT_S) as resp:  # noqa: S310 - the user's own server
            return None if resp.status == 200 else f"{url} answered HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        return f"{url} answered HTTP {err.code}"
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        return f"{url} is unreachable ({reason})"


def local_path(uri: str) -> Path | None:
    """The path an MLflow ``file:`` store or ``sqlite:`` database lives at (None: another kind of URI, or
    SQLite in memory)."""
    low = uri.lower()
    if low.startswith("file:"):
        return Path(unquote(urlsplit(uri).path) or ".")
    if low.startswith("sqlite:///"):
        rest = uri[len("sqlite:///"):].split("?", 1)[0]
        return None if rest in ("", ":memory:") else Path(unquote(rest))
    return None




def artifact_root(uri: str, studies_dir: Path) -> Path | None:
    """Where an MLflow experiment the tracker creates keeps its artifacts (the study's dashboard page):
    ``<studies-dir>/mlflow-artifacts`` on a database backend (``sqlite:``, ``postgresql:``, ``mysql:``, whose
    default is ``./mlruns`` of whatever directory the driver was started in); None where the store decides (a
    server's artifact root, a ``file:`` store's own directory)."""
    scheme = uri.split(":", 1)[0].lower()
    if scheme.split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        return (studies_dir / ARTIFACTS_DIR).resolve()
    return None


def unwritable(directory: Path) -> str | None:
    """None when a file can be made in ``directory`` (made if missing, as the tracker would); else why not.
    Leaves nothing behind: the probe file and the directories made for it are removed."""
    missing, at = [], directory
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    if not at.is_dir():
        return f"{at} is not a directory"
    made: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            made.append(d)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".verl-hpo-probe-")
        os.close(fd)
        os.unlink(probe)
        return None
    except OSError as err:
        return f"{directory} cannot be written ({err.strerror or err})"
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass


def _file_store_refused() -> bool:
    """MLflow 3 raises on its filesystem backend (``FileStore``: "in maintenance mode") unless the user opted out with
    ``MLFLOW_ALLOW_FILE_STORE`` (read as MLflow does)."""
    return os.environ.get("MLFLOW_ALLOW_FILE_STORE", "false").strip().lower() not in ("true", "1")


def _store_problem(uri: str) -> str | None:
    """Why an MLflow ``file:`` store or ``sqlite:`` database cannot be written here (None: it can, or remote)."""
    low = uri.lower()
    if (low.startswith("file:") or "://" not in low and not low.startswith("sqlite:")) and _file_store_refused():
        return (f"MLflow store {redact_uri(uri)}: MLflow refuses new runs in its filesystem backend (maintenance "
                "mode): use a database (sqlite:///path/mlflow.db) or a tracking server, or set "
                "MLFLOW_ALLOW_FILE_STORE=true")
    path = local_path(uri)
    if path is None:
        return None
    if uri.lower().startswith("file:"):
        why = unwritable(path)
    elif path.exists() and not path.is_file():
        why = f"{path} is not a regular file"
    else:
        why = unwritable(path.parent)
    return None if why is None else f"MLflow store {redact_uri(uri)}: {why}"


def _wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def tracker_problems(spec: TrackingSpec) -> dict[str, str]:
    """``{"mlflow" | "wandb": one-line problem}`` for each tracker of ``spec`` that cannot be used here."""
    out: dict[str, str] = {}
    if spec.mlflow is not None:
        uri = mlflow_uri(spec)
        if importlib.util.find_spec("mlflow") is None:
            out["mlflow"] = f"the mlflow package is not installed ({INSTALL})"
        elif uri is None:
            out["mlflow"] = "no tracking URI: set tracking.mlflow.uri, $MLFLOW_TRACKING_URI or --tracking mlflow=URI"
        elif uri.lower().startswith(("http://", "https://")):
            why = _health(uri)
            if why is not None:
                out["mlflow"] = f"MLflow server {redact_uri(uri)}: {why}"
        else:
            why = _store_problem(uri)
            if why is not None:
                out["mlflow"] = why
    if spec.wandb is not None:
        if importlib.util.find_spec("wandb") is None:
            out["wandb"] = f"the wandb package is not installed ({INSTALL})"
        elif spec.wandb.mode == "online" and not _wandb_key():
            out["wandb"] = ("W&B online needs an API key (WANDB_API_KEY or wandb login); or use tracking.wandb.mode: "
                            "offline / --tracking wandb=offline")
        elif spec.wandb.dir is not None:
            why = unwritable(Path(spec.wandb.dir))
            if why is not None:
                out["wandb"] = f"dir {spec.wandb.dir!r}: {why}"
    return out


def checked_tracking(spec: TrackingSpec, source: str, optional: bool,
                     warn: Callable[[str], None]) -> TrackingSpec:
    """``spec`` when every tracker is usable; else SpaceError with one line (``optional``: a warning, and the
    tracker is dropped)."""
    problems = tracker_problems(spec)
    for name, why in problems.items():
        line = f"{source}: tracking.{name}: {why}"
        if not optional:
            raise SpaceError(line + " (or run without it: --tracking off, or --tracking-optional)")
        warn(f"warning: {line}; the study runs without {name} tracking")
        spec = dataclasses.replace(spec, mlflow=None) if name == "mlflow" else dataclasses.replace(spec, wandb=None)
    return spec
