"""A verl experiment's own relative paths, made absolute once when it is loaded, so that ``validate``, ``search``,
``rehearse`` and every trial read the same files from any working directory.

* In the experiment file: relative to the **experiment file's directory** (``data.train_files: train.parquet``
  beside ``my_exp.yaml``), as a user reading the file would take them.
* Typed with ``--override`` on the command line: relative to the **current directory**, as any path typed there.
* ``trial.python: null`` needs nothing: the default interpreters are under the project root
  (:func:`hpo.backends.verl._launch.default_python`).

Which values are paths: the data files (``data.train_files``, ``data.val_files``, one path or a list),
``data.custom_cls.path``, the reward function's file (``reward.custom_reward_function.path``, and the older
``custom_reward_function.path``), a relative ``trial.python`` with a slash; model and tokenizer paths
(``*.model.path``, ``*.model.tokenizer_path``) only when they start with ``./`` or ``../`` or name a directory that
exists there, since ``Qwen/Qwen2.5-0.5B-Instruct`` is a hub id. A leading ``~`` or ``~user`` of any of these (and of
``trial.python``: a subprocess does not expand it as a shell would) is
expanded to that home directory here (hydra's override syntax reads a leading ``~`` as a deletion and verl expands none;
the user meant their home); a ``~user`` with no home on this host is refused, naming the key. ``${oc.env:...}`` and
absolute paths are left as they are. The stored experiment holds the absolute paths, so ``resume`` does not depend on
where it is run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._launch import override_key
from hpo.experiment import located_error

if TYPE_CHECKING:
    from hpo.experiment import Space

FILE_KEYS = ("data.train_files", "data.val_files", "data.custom_cls.path", "reward.custom_reward_function.path",
             "custom_reward_function.path")
MODEL_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "critic.model.path",
              "critic.model.tokenizer_path", "reward_model.model.path", "reward.reward_model.model_path")


def _relative(text: str) -> bool:
    t = text.strip().strip("'\"")
    return bool(t) and not (t.startswith(("/", "~", "$")) or "://" in t)


class NoHome(ValueError):
    """A ``~user/...`` path whose user has no home directory on this host."""


def _resolve(value: Any, base: Path, model: bool) -> Any:
    """``value`` with its relative path(s) made absolute against ``base`` and a leading ``~`` expanded (a list
    element by element); :class:`NoHome` for a ``~user`` that has none."""
    if isinstance(value, list):
        return [_resolve(v, base, model) for v in value]
    if isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]"):
        from hpo.backends.verl._data import split_list

        return [_resolve(v, base, model) for v in split_list(value)]
    if isinstance(value, str) and value.strip().strip("'\"").startswith("~"):
        text = value.strip().strip("'\"")
        home = os.path.expanduser(text)
        if home.startswith("~"):
            raise NoHome(f"{text.split('/', 1)[0]!r} is no user's home directory on this host (hydra reads a "
                         "leading ~ as a deletion): write the full path")
        return os.path.normpath(home)
    if not isinstance(value, str) or not _relative(value):
        return value
    text = value.strip().strip("'\"")
    if model and not (text.startswith(("./", "../")) or (base / text).is_dir()):
        return value  # a hub id
    return os.path.normpath(base / text)


def resolve_user_paths(space: Space, origin: Mapping[str, str]) -> Space:
    """``space`` with the relative paths of its overrides and ``trial.python`` made absolute (see the module
    docstring): the experiment file's directory for what the file sets, the current directory for ``--override``."""
    file_dir = Path(space.source).expanduser().resolve().parent
    cwd = Path.cwd()
    given = space.raw.get("overrides")
    raw_new: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    overrides = dict(space.overrides)
    changed = False
    for key, value in space.overrides.items():
        bare = override_key(key)
        if bare not in FILE_KEYS and bare not in MODEL_KEYS:
            continue
        base = cwd if f"overrides.{key}" in origin else file_dir
        try:
            new = _resolve(value, base, bare in MODEL_KEYS)
        except NoHome as err:
            raise located_error(space, dict(origin), f"overrides.{key}", str(err)) from None
        if new != value:
            overrides[key] = new
            if key in raw_new:
                raw_new[key] = new
            changed = True
    trial = space.trial
    python = trial.python
    if python and python.strip().startswith("~"):  # the shell would have expanded it; a subprocess does not
        try:
            python = _resolve(python, file_dir, False)
        except NoHome as err:
            raise located_error(space, dict(origin), "trial.python", str(err)) from None
    elif python and _relative(python) and "/" in python:
        base = cwd if "trial.python" in origin else file_dir
        python = os.path.normpath(base / python)
    confirm = space.study.confirm
    test_files = confirm.test_files
    if test_files:
        base = cwd if "study.confirm.test_files" in origin else file_dir
        try:
            resolved = _resolve(test_files, base, False)  # a str field: a list stays hydra's [a, b] text
        except NoHome as err:
            raise located_error(space, dict(origin), "study.confirm.test_files", str(err)) from None
        test_files = "[" + ", ".join(resolved) + "]" if isinstance(resolved, list) else resolved
    if not changed and python == trial.python and test_files == confirm.test_files:
        return space
    raw = dict(space.raw)
    raw["overrides"] = raw_new
    if python != trial.python:
        raw["trial"] = {**(raw.get("trial") or {}), "python": python}
    study = space.study
    if test_files != confirm.test_files:
        raw_study = dict(raw.get("study") or {})
        raw_study["confirm"] = {**(raw_study.get("confirm") or {}), "test_files": test_files}
        raw["study"] = raw_study
        study = dataclasses.replace(study, confirm=dataclasses.replace(confirm, test_files=test_files))
    return dataclasses.replace(space, overrides=overrides, raw=raw, study=study,
                               trial=dataclasses.replace(trial, python=python))
