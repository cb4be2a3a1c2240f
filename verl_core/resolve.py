"""Local paths for a config's model and data: ``builtin:`` models are built and ``builtin:`` tasks written once, in the
cache. Torch-free, so ``python -m verl_core prepare`` on a ready cache returns in well under a second (the driver
runs it before a study's first trial)."""

from __future__ import annotations

from pathlib import Path

from verl_core.config import ConfigError


def builtin_models() -> tuple[str, ...]:
    """The names ``builtin:<name>`` accepts as a model: the tiny_arith family (``verl_core.tiny_model.FAMILY``) and
    ``smollm2``."""
    from verl_core.tiny_model import FAMILY

    return (*FAMILY, "smollm2")


def builtin_model_facts() -> dict[str, tuple[str, int | None]]:
    """Each built-in model (:func:`builtin_models`) -> (its tokenizer's family, its hidden size), without torch or a
    build: the tiny_arith family (``verl_core.tiny_model.FAMILY``) shares one tokenizer, built byte-identical at every
    size; ``smollm2`` has its own."""
    from verl_core.pretrained import smollm2_config
    from verl_core.tiny_model import FAMILY

    facts: dict[str, tuple[str, int | None]] = {name: ("tiny_arith", shape.get("hidden_size"))
                                                for name, shape in FAMILY.items()}
    hidden = smollm2_config().get("hidden_size")
    facts["smollm2"] = ("smollm2", hidden if isinstance(hidden, int) else None)
    return facts


def resolve_model_path(path: str, key: str) -> str:
    """A local HF directory for ``path``; ``builtin:<name>`` (:func:`builtin_models`: ``tiny_arith``, its sizes
    ``tiny_arith_s`` / ``tiny_arith_l``, ``smollm2``) is built (once, cached)."""
    from verl_core.tiny_model import FAMILY

    name = path.removeprefix("builtin:") if path.startswith("builtin:") else None
    if name in FAMILY:
        from verl_core.tiny_model import ensure_tiny_arith

        return str(ensure_tiny_arith(name=name))
    if name == "smollm2":
        from verl_core.pretrained import ensure_smollm2

        return str(ensure_smollm2())
    if name is not None:
        known = ", ".join(f"builtin:{n}" for n in builtin_models())
        raise ConfigError(f"{key}={path!r}: unknown built-in model (known: {known})")
    if not (Path(path).expanduser() / "config.json").is_file():
        raise ConfigError(f"{key}={path!r}: not a local Hugging Face model directory (no config.json)")
    return str(Path(path).expanduser())


def resolve_data_path(path: str, key: str, split: str) -> str:
    """A parquet path for ``path``; ``builtin:<task>`` (see ``verl_core.tasks.BUILTIN``) is written once and names
    the task's ``split`` (train, val or test)."""
    if path.startswith("builtin:"):
        from verl_core.tasks import builtin_split_path
        from verl_core.tiny_model import cache_root

        return str(builtin_split_path(path.removeprefix("builtin:"), cache_root(), split, key))
    return path
