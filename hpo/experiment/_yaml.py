"""The hardened YAML reader of experiment files and ``--override`` values.

:class:`_StrictLoader` is PyYAML's SafeLoader (no object is constructed from a tag) that also refuses a duplicate
mapping key, an alias inside the value its anchor names (a cycle) and a document that expands past
:data:`MAX_YAML_NODES` values through its aliases (a "billion laughs" bomb). :func:`read_yaml` reads an experiment
file with it: a regular file of at most ``MAX_FILE_BYTES`` (never a FIFO or a device, even through a symlink), UTF-8,
a mapping at the top; every problem is one :class:`SpaceError` line naming the file (and the line, for bad YAML).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpo.analysis import MAX_FILE_BYTES, FileRefused, read_bounded
from hpo.experiment._errors import SpaceError

MAX_YAML_NODES = 100_000  # scalars, sequences and mappings once every alias is expanded ("billion laughs")


class YamlTooComplex(yaml.composer.ComposerError):
    """A document refused by :class:`_StrictLoader` before anything is built from it: too large once its aliases
    are expanded, or an alias inside the value it names (a cycle)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader (no object construction) that rejects duplicate mapping keys, an alias inside the value its
    anchor names (``&a [*a]``: a cycle that every later walk of the value would follow for ever), and a document
    that expands past :data:`MAX_YAML_NODES` nodes through its aliases (each alias counts its whole subtree)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded = 0
        self._sizes: dict[int, int] = {}
        self._open: list[str] = []  # anchors of the collections being composed (the current node's ancestors)

    def _size(self, node: yaml.Node) -> int:
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(self._size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(self._size(k) + self._size(v) for k, v in node.value)
        self._sizes[id(node)] = n
        return n

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()
        anchor: str | None = getattr(event, "anchor", None)
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent) and anchor in self._open:
            raise YamlTooComplex(None, None, f"alias *{anchor} inside the value of &{anchor} (a cycle)", mark)
        if isinstance(event, yaml.AliasEvent) and anchor in self.anchors:
            self._expanded += self._size(self.anchors[anchor])
        else:
            self._expanded += 1
        if self._expanded > MAX_YAML_NODES:
            raise YamlTooComplex(
                None, None, f"more than {MAX_YAML_NODES} values once its aliases are expanded", mark)
        opened = anchor is not None and isinstance(event, yaml.CollectionStartEvent)
        if anchor is not None and opened:
            self._open.append(anchor)
        node = super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        if opened:
            self._open.pop()
        assert node is not None
        return node


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.2's floats: ``1e-6`` (how a learning rate is written) is a number, not the string YAML 1.1 makes of a float
# without a dot (``low: 1e-6`` would be refused as "expected a number")
_StrictLoader.add_implicit_resolver(  # type: ignore[no-untyped-call]
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load_yaml_text(text: str) -> Any:
    """Parse YAML with :class:`_StrictLoader`: yaml.YAMLError, :class:`YamlTooComplex` for a bomb or a cycle."""
    return yaml.load(text, Loader=_StrictLoader)


def yaml_problem(err: yaml.YAMLError) -> str:
    """What an error line says of a YAML problem after the file or the override: ``" line N: invalid YAML (...)"``."""
    mark = getattr(err, "problem_mark", None)
    where = f" line {mark.line + 1}:" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where} invalid YAML ({problem})"


def read_yaml(path: Path) -> dict[str, Any]:
    """An experiment file as a mapping: a regular file of at most :data:`MAX_FILE_BYTES` (never a FIFO or a device,
    even through a symlink), strict YAML (:class:`_StrictLoader`); SpaceError otherwise."""
    try:
        data = read_bounded(path, str(path), MAX_FILE_BYTES)
    except FileNotFoundError:
        raise SpaceError(f"{path}: no such experiment file") from None
    except FileRefused as err:
        raise SpaceError(f"{err}; an experiment file must be a regular file of at most {MAX_FILE_BYTES} bytes") \
            from None
    except OSError as err:
        raise SpaceError(f"{path}: cannot read ({err.strerror})") from None
    try:
        raw = load_yaml_text(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SpaceError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        raise SpaceError(f"{path}:{yaml_problem(err)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpaceError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
    return raw
