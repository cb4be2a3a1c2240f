"""The package's layers import only downward (issue 23): a module of ``hpo/<pkg>/`` imports ``hpo.<other>`` only when
``<other>`` is below ``<pkg>``, and never a top-level module (``hpo._cli``). Lazy imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HPO = Path(__file__).resolve().parents[2] / "hpo"
# rank of each subpackage: a module may import its own subpackage and lower ranks only; equal ranks are peers that
# do not import each other
LAYERS = {"analysis": 0, "experiment": 1, "execution": 1, "backends": 2, "study": 3, "reporting": 4, "tracking": 5}
TOP = 6  # hpo/_cli.py, hpo/__init__.py, hpo/__main__.py


def _package(module: str) -> str | None:
    """``hpo.study._driver`` -> ``study``; ``hpo._cli`` / ``hpo`` -> None (the top)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _rank(module: str) -> int:
    pkg = _package(module)
    return TOP if pkg is None else LAYERS[pkg]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "hpo"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "hpo":
            if node.module == "hpo":  # from hpo import x: x is a subpackage or a top-level name
                out += [(node.lineno, f"hpo.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in HPO.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    rel = path.relative_to(HPO.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def upward_imports() -> list[str]:
    bad = []
    for path in _modules():
        me = _name(path)
        my_pkg, my_rank = _package(me), _rank(me)
        for line, target in _imports(path):
            pkg = _package(target)
            if pkg == my_pkg:
                continue
            if _rank(target) >= my_rank:
                bad.append(f"{path.relative_to(HPO.parent)}:{line} imports {target}")
    return bad


def test_every_module_sits_in_a_layer() -> None:
    loose = [p.name for p in HPO.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "_cli.py")]
    assert loose == [], "flat modules outside the subpackages"
    assert {p.name for p in HPO.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS)


def test_imports_only_go_downward() -> None:
    assert upward_imports() == []


def test_the_check_catches_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk itself works: an import of the study loop from the experiment schema is reported."""
    victim = HPO / "experiment" / "_objective.py"
    text = victim.read_text()
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text + "\nfrom hpo.study import _driver\n"
                        if self == victim else Path.read_bytes(self).decode())
    assert any("experiment/_objective.py" in b and "hpo.study" in b for b in upward_imports())


def test_each_subpackage_says_what_it_owns() -> None:
    for pkg in LAYERS:
        doc = ast.get_docstring(ast.parse((HPO / pkg / "__init__.py").read_text()))
        assert doc and "may import:" in doc.lower(), pkg
