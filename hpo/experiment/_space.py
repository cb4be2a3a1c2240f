"""An experiment file read: ``search_spaces/<name>.yaml`` (or a path) found, read, changed by ``--override`` and
parsed into a typed, validated :class:`Space` (:func:`read_space`, the schema's part of a load; a study's stored
experiment is parsed by :func:`parse_space` alone); and the names the other packages import from here, which live
in the modules that hold each concept:

* ``_schema``: the frozen dataclasses (:class:`Space`, :class:`StudySpec`, :class:`TrialSpec`, :class:`Param`, ...),
  their defaults and field metadata, :func:`format_value`;
* ``_errors``: :class:`SpaceError`, one line naming the file (or the ``--override``), the field and the value;
* ``_yaml``: the hardened YAML reader (:func:`read_yaml`, :func:`load_yaml_text`);
* ``_overrides``: ``--override`` applied to the raw mapping (:func:`apply_overrides`);
* ``_parse`` (with ``_fields``): the raw mapping validated into a :class:`Space` (:func:`parse_space`);
* ``_limits``: what keeps every trial launchable (:data:`MAX_PARAMS`, argv sizes, regular code files).

Nothing here touches a study or the disk beyond reading the file; what a trainer accepts and refuses is its
backend's: :func:`hpo.backends.load_space`, the one loader of an experiment the driver runs, reads it through
:func:`read_space`.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

from hpo.analysis import DiagnosisSpec
from hpo.experiment._errors import MAX_SHOWN_OVERRIDE, ErrorContext, SpaceError, shown_override
from hpo.experiment._limits import MAX_ARG_BYTES, MAX_ARGV_BYTES, MAX_PARAMS
from hpo.experiment._objective import Objective
from hpo.experiment._overrides import apply_overrides
from hpo.experiment._parse import parse_rollback_rule, parse_space
from hpo.experiment._ray_spec import RaySpec
from hpo.experiment._schema import (
    ROLLBACK_LABELS,
    ConfirmSpec,
    EarlyStopping,
    Param,
    PbtSpec,
    PrunerSpec,
    SamplerSpec,
    Space,
    StudySpec,
    TrialSpec,
    format_value,
)
from hpo.experiment._throughput import ThroughputSpec
from hpo.experiment._tracking import TrackingSpec
from hpo.experiment._yaml import MAX_YAML_NODES, YamlTooComplex, load_yaml_text, read_yaml

__all__ = [
    "MAX_ARGV_BYTES", "MAX_ARG_BYTES", "MAX_PARAMS",
    "MAX_SHOWN_OVERRIDE", "MAX_YAML_NODES", "ROLLBACK_LABELS", "SPACES_DIR", "ConfirmSpec", "DiagnosisSpec",
    "EarlyStopping", "Objective", "Param", "PbtSpec", "PrunerSpec", "RaySpec", "SamplerSpec", "Space", "SpaceError",
    "StudySpec", "ThroughputSpec", "TrackingSpec", "TrialSpec", "YamlTooComplex", "apply_overrides", "format_value",
    "load_yaml_text", "located_error", "parse_rollback_rule", "parse_space", "read_space", "read_yaml",
    "resolve_space_path", "shown_override",
]

SPACES_DIR = Path("search_spaces")
# the experiments shipped with verl-hpo: ``search_spaces/`` beside the ``hpo`` package (a source checkout or an
# editable install); a bare name not found in ``spaces_dir`` is looked up there, from whatever directory
SHIPPED_SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"


def resolve_space_path(name_or_path: str, spaces_dir: Path = SPACES_DIR) -> Path:
    """``kl_lr`` -> ``search_spaces/kl_lr.yaml`` (``spaces_dir``), else the shipped ``kl_lr.yaml``
    (:data:`SHIPPED_SPACES_DIR`); anything with a suffix or a slash is a path. SpaceError naming every place
    looked in when a bare name is in none."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return p
    file = f"{name_or_path}.yaml"
    places = [spaces_dir] + ([SHIPPED_SPACES_DIR] if SHIPPED_SPACES_DIR != _absolute(spaces_dir) else [])
    for place in places:
        if os.path.lexists(place / file):  # there, whatever it is: read_yaml refuses what is not a regular file
            return place / file
    looked = " or ".join(_shown_dir(place) for place in places)
    raise SpaceError(f"--space {name_or_path}: no experiment file {file} in {looked}; give a path to a .yaml "
                     "file, or a name from one of these")


def _absolute(place: Path) -> Path:
    try:
        return place.absolute()
    except OSError:  # the working directory was removed
        return place


def _shown_dir(place: Path) -> str:
    """``search_spaces/ (in /home/me)``: a relative directory with the one it was looked up from."""
    if place.is_absolute():
        return f"{place}/"
    try:
        return f"{place}/ (in {os.getcwd()})"
    except OSError:  # the working directory was removed
        return f"{place}/"


def read_space(name_or_path: str, overrides: typing.Sequence[str] = (), spaces_dir: Path = SPACES_DIR
               ) -> tuple[Space, dict[str, str]]:
    """Find, read, override and parse an experiment file against the schema: the space, and which fields the
    ``--override`` texts set (for errors that name them). What its trainer gives it and refuses is its backend's:
    :func:`hpo.backends.load_space` (what the driver runs)."""
    path = resolve_space_path(name_or_path, spaces_dir)
    raw = read_yaml(path)
    origin = apply_overrides(raw, overrides)
    return parse_space(raw, str(path), path.stem, origin), origin


def located_error(space: Space, origin: dict[str, str], where: str, msg: str) -> SpaceError:
    """A one-line error about field ``where`` of ``space``, naming the ``--override`` that set it if one did."""
    return ErrorContext(space.source, origin).error(where, msg)

