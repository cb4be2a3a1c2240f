"""Two results transformers computes at every import, kept on disk between trials (a short trial's start-up).

Importing transformers' auto classes computes, from files that change only when packages are installed:

* ``importlib.metadata.packages_distributions()`` (``transformers.utils.import_utils`` at import): every installed
  distribution's top-level names, read from ~180 ``dist-info`` directories after ``make install`` (0.7-1.5 s on 2
  loaded cores);
* the lazy import structure of ``transformers.models`` (``create_import_structure_from_path``, twice: from
  ``transformers/__init__`` and ``transformers/models/__init__``): every file of its ~520 model directories read
  for its ``__all__`` and ``@requires`` (1.5-2 s).

:func:`cached_transformers_import` serves both from JSON files under ``$VERL_HPO_CACHE/startup/`` while transformers
imports, keyed by what they are computed from: the directories of ``sys.path`` and their modification times (an
install, an upgrade or a removal adds or removes a ``dist-info`` directory there) for the first, transformers'
version and the models directory's path and time for the second. A file that is missing, not a regular file, over
:data:`MAX_BYTES`, malformed or of another key is computed as transformers would and written again (atomically,
never over a path that is not a regular file; a read-only cache is only not written). Anything else transformers
asks is computed by transformers itself.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MAX_BYTES = 16 * 2**20
IMPORT_UTILS = "transformers.utils.import_utils"
VERSION = 1  # of the files' format


def cache_dir() -> Path:
    from verl_core.tiny_model import cache_root

    return cache_root() / "startup"


def _read(path: Path, key: Any) -> Any:
    """The value stored at ``path`` under ``key`` (None: no usable file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            found = json.loads(f.read(MAX_BYTES + 1))
        except (ValueError, OSError):
            return None
    if not isinstance(found, dict) or found.get("version") != VERSION or found.get("key") != key:
        return None
    return found.get("value")


def _write(path: Path, key: Any, value: Any) -> None:
    """Store ``value`` under ``key`` at ``path`` (atomically; nothing where the path is not a regular file or the
    directory cannot be written)."""
    try:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"version": VERSION, "key": key, "value": value}, f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass


def _cached(path: Path, key: Any, compute: Callable[[], Any], encode: Callable[[Any], Any],
            decode: Callable[[Any], Any]) -> Any:
    stored = _read(path, key)
    if stored is not None:
        try:
            return decode(stored)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass
    value = compute()
    _write(path, key, encode(value))
    return value


# ----------------------------------------------------------------------------- packages_distributions
def path_key() -> list[list[Any]]:
    """``sys.path``'s entries with their modification times (0: absent)."""
    out: list[list[Any]] = []
    for entry in sys.path:
        try:
            out.append([entry, os.stat(entry or ".").st_mtime_ns])
        except OSError:
            out.append([entry, 0])
    return out


def _decode_mapping(raw: Any) -> dict[str, list[str]]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, list) and
                                            all(isinstance(d, str) for d in v) for k, v in raw.items()):
        raise ValueError("not a mapping of names to distributions")
    return {k: list(v) for k, v in raw.items()}


def packages_distributions(original: Callable[[], Any]) -> Callable[[], Any]:
    def cached() -> dict[str, list[str]]:
        return _cached(cache_dir() / "packages_distributions.json", path_key(), lambda: dict(original()),
                       lambda v: v, _decode_mapping)
    return cached


# ----------------------------------------------------------------------------- transformers' import structure
def encode_structure(value: Any) -> Any:
    """An import structure (dicts keyed by a name or a frozenset of backends, sets of names) as JSON: a dict as
    ``{"d": [[key, value], ...]}`` (a frozenset key as a sorted list), a set as ``{"s": [...]}``."""
    if isinstance(value, dict):
        return {"d": [[sorted(k) if isinstance(k, frozenset) else k, encode_structure(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"s": sorted(value)}
    raise TypeError(f"unexpected {type(value).__name__} in an import structure")


def decode_structure(raw: Any) -> Any:
    if isinstance(raw, dict) and set(raw) == {"s"} and isinstance(raw["s"], list):
        if not all(isinstance(x, str) for x in raw["s"]):
            raise ValueError("a set of non-names")
        return set(raw["s"])
    if isinstance(raw, dict) and set(raw) == {"d"} and isinstance(raw["d"], list):
        out: dict[Any, Any] = {}
        for pair in raw["d"]:
            key, value = pair
            if isinstance(key, list) and all(isinstance(x, str) for x in key):
                out[frozenset(key)] = decode_structure(value)
            elif isinstance(key, str):
                out[key] = decode_structure(value)
            else:
                raise ValueError("a key that is neither a name nor backends")
        return out
    raise ValueError("not an import structure")


def structure_of(original: Callable[[Any], Any], models: str, version: str) -> Callable[[Any], Any]:
    """``create_import_structure_from_path`` that serves ``models`` (transformers' models directory) from the cache
    and anything else from ``original``."""
    memo: dict[str, Any] = {}

    def create(module_path: Any) -> Any:
        path = os.fspath(module_path)
        folder = os.path.dirname(path) if os.path.isfile(path) else path
        if os.path.realpath(folder) != models:
            return original(module_path)
        if "v" not in memo:
            key = [version, models, os.stat(models).st_mtime_ns]
            memo["v"] = _cached(cache_dir() / "transformers_models.json", key, lambda: original(module_path),
                                encode_structure, decode_structure)
        return memo["v"]
    return create


class _PatchImportUtils(importlib.abc.MetaPathFinder):
    """Finds ``transformers.utils.import_utils`` as the path finder does and, once it has run, replaces its
    ``create_import_structure_from_path`` (before ``transformers/__init__`` calls it)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != IMPORT_UTILS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader: Any = spec.loader if spec is not None else None
        if spec is None or spec.origin is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, origin = loader.exec_module, spec.origin

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            original = getattr(module, "create_import_structure_from_path", None)
            if callable(original):
                models = os.path.realpath(os.path.join(os.path.dirname(origin), "..", "models"))
                version = getattr(sys.modules.get("transformers"), "__version__", None)  # set before its imports
                if isinstance(version, str) and os.path.isdir(models):
                    module.create_import_structure_from_path = structure_of(original, models, version)

        loader.exec_module = exec_then_patch
        return spec


@contextlib.contextmanager
def cached_transformers_import() -> Iterator[None]:
    """While transformers is first imported, its two start-up computations come from the cache (see the module
    docstring); a no-op when transformers is already imported or ``VERL_CORE_IMPORT_CACHE=0``."""
    if IMPORT_UTILS in sys.modules or os.environ.get("VERL_CORE_IMPORT_CACHE") == "0":
        yield
        return
    finder = _PatchImportUtils()
    original = importlib.metadata.packages_distributions
    sys.meta_path.insert(0, finder)
    importlib.metadata.packages_distributions = packages_distributions(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        importlib.metadata.packages_distributions = original  # type: ignore[assignment]
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
