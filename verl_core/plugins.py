"""Loading user code named in config: a function from a ``.py`` file or an importable module.

Shared by ``custom_reward_function.path/name`` and ``evaluation.custom``; every failure is a one-line
:class:`ConfigError` prefixed with the config key that named the code.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_core.config import ConfigError


def load_function(where: str, name: str, key: str, as_file: bool | None = None) -> Callable[..., Any]:
    """``where``: a file path (``as_file``, default: it ends in ``.py``) or a module name; ``name``: the
    function in it; ``key``: the error prefix."""
    try:
        if where.endswith(".py") if as_file is None else as_file:
            path = Path(where).expanduser()
            if not path.is_file():
                raise ConfigError(f"{key}: no such file {where}")
            spec = importlib.util.spec_from_file_location(f"user_code_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"{key}: cannot import {where} ({type(err).__name__}: {err})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{key}: {name!r} is not a function in {where}")
    return fn  # type: ignore[no-any-return]
