"""The package's layers import only downward (issue 23): a module of ``hpo/<pkg>/`` imports ``hpo.<other>`` only when
``<other>`` is below ``<pkg>``, and never a top-level module (``hpo._cli``). Lazy imports inside functions count too.

No two modules of ``hpo/``, ``verl_core/`` or ``benchmarks/`` import each other, directly or round a longer loop
(issue 34), counting imports inside functions and under ``if TYPE_CHECKING:``: a lazy import hides a cycle from
Python, not from a reader, and each such pair was one module's shared piece in the wrong place."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HPO = REPO / "hpo"
CYCLE_FREE = ("hpo", "verl_core", "benchmarks")
# rank of each subpackage: a module may import its own subpackage and lower ranks only; equal ranks are peers that
# do not import each other
LAYERS = {"analysis": 0, "record": 0, "experiment": 1, "execution": 1, "backends": 2, "storages": 2, "samplers": 2,
          "study": 3, "reporting": 4, "tracking": 5, "commands": 6}
TOP = 7  # hpo/_cli.py, hpo/__init__.py, hpo/__main__.py


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


# ----------------------------------------------------------------------------- no import cycles
def module_graph(root: Path, packages: Sequence[str]) -> dict[str, set[str]]:
    """Each module of ``packages`` (directories under ``root``), by dotted name, -> the modules of ``packages`` it
    imports anywhere: at the top, inside a function, under ``if TYPE_CHECKING:``. ``from p import x`` is an edge to
    ``p.x`` when that is a module, else to ``p`` (its ``__init__``); relative imports are resolved. Importing
    ``p.x`` also runs ``p/__init__.py``, but that implicit edge is not counted (every package that re-exports its
    modules would be a cycle)."""
    files = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                parts = list(path.relative_to(root).with_suffix("").parts)
                files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:  # the module itself, or the package it names a member of
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for me, path in files.items():
        here = me if path.name == "__init__.py" else me.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else known(base) for a in node.names}
        graph[me] = {t for t in targets if t is not None and t != me}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another (each reaches every other one), as their edges
    ``a -> b`` inside the group, sorted."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen
    groups = {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph if m in reach[m]}
    return sorted(sorted(f"{a} -> {b}" for a in g for b in graph[a] & g) for g in groups)


def test_no_two_modules_import_each_other() -> None:
    graph = module_graph(REPO, CYCLE_FREE)
    assert len(graph) == sum(1 for pkg in CYCLE_FREE for p in (REPO / pkg).rglob("*.py")
                             if "__pycache__" not in p.parts)
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n".join(", ".join(c) for c in cycles)


def test_the_cycle_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """A synthetic package: ``a`` imports ``b`` inside a function, ``c`` imports ``d`` (relatively) under ``if
    TYPE_CHECKING:``, and ``e`` -> ``f`` -> ``g`` -> ``e`` goes round three; ``h`` imports into them and is in none."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "", "sub/__init__.py": "",
             "a.py": "def load():\n    from pkg import b\n    return b\n",
             "b.py": "from pkg.a import load\n",
             "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.d import D\n",
             "sub/d.py": "from .. import c\nclass D: ...\n",
             "e.py": "import pkg.f\n", "f.py": "from pkg import g\n", "g.py": "def run():\n    import pkg.e\n",
             "h.py": "import os\nfrom pkg import a, c, e\nfrom pkg.sub import d\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert import_cycles(module_graph(tmp_path, ["pkg"])) == [
        ["pkg.a -> pkg.b", "pkg.b -> pkg.a"], ["pkg.c -> pkg.sub.d", "pkg.sub.d -> pkg.c"],
        ["pkg.e -> pkg.f", "pkg.f -> pkg.g", "pkg.g -> pkg.e"]]


# ----------------------------------------------------------------------------- one contract per trainer (issue 36)
_BACKEND_TEST = re.compile(r"is_verl|is_default_command|(==|!=|\bin)\s*\(?\s*[\"'](verl|verl_core|trl)[\"']"
                           r"|[\"'](verl|verl_core|trl)[\"']\s*(==|!=)")


def _in_a_backend(path: Path, root: Path) -> bool:
    """``hpo/backends/<name>/...``: one trainer's own package (not ``hpo/backends/_base.py``, ``_registry.py``, ...)."""
    parts = path.relative_to(root).parts
    return len(parts) > 2 and parts[0] == "backends"


def backend_name_tests(root: Path = HPO) -> list[str]:
    """Lines outside ``hpo/backends/<name>/`` that branch on a trainer's name instead of asking its backend."""
    return [f"{p.relative_to(root.parent)}:{n}: {line.strip()}" for p in sorted(root.rglob("*.py"))
            if not _in_a_backend(p, root)
            for n, line in enumerate(p.read_text().splitlines(), 1) if _BACKEND_TEST.search(line)]


def test_only_the_backends_know_a_trainer_by_name() -> None:
    assert backend_name_tests() == []


def test_the_backend_name_check_sees_a_name_test(tmp_path: Path) -> None:
    (tmp_path / "hpo" / "study").mkdir(parents=True)
    (tmp_path / "hpo" / "study" / "_x.py").write_text('if space.trial.backend == "verl":\n    pass\n')
    (tmp_path / "hpo" / "study" / "_y.py").write_text("if spec.is_verl:\n    pass\n")
    assert [line.split(":")[0] for line in backend_name_tests(tmp_path / "hpo")] == ["hpo/study/_x.py",
                                                                                      "hpo/study/_y.py"]


# ----------------------------------------------------------------------------- what a trainer knows (issue 46)
# A trainer's names, as a string literal: its backend's name, or one of the constants only a trainer knows (a
# metric, a config key, an environment variable, a held-out prefix); a literal that equals one, or starts with one of
# the constants, outside its own ``hpo/backends/<name>/`` is the driver knowing the trainer. Docstrings may mention
# them (they explain; they do not decide), and so may help texts that merely contain one.
TRAINER_NAMES = tuple(sorted(p.name for p in (HPO / "backends").iterdir()  # every shipped backend's name
                             if (p / "__init__.py").is_file()))
TRAINER_CONSTANTS = (
    "val-core/", "val-aux/", "test-core/", "data.test_files", "timing_s/", "VERL_FILE_LOGGER_PATH",
    "custom_reward_function", "evaluation.custom", "actor/", "critic/", "response_length/", "perf/gpu_util",
    "perf/mfu", "eval/reward_mean", "eval/reward_std", "train/entropy", "train/kl", "train/reward",
)
# The one deliberate exception: which trainer an experiment that names none runs (the registry's default; the schema
# only says "unset").
ALLOWED = {("hpo/backends/_registry.py", "verl_core")}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def trainer_literals(root: Path = HPO) -> list[str]:
    """String literals outside ``hpo/backends/<name>/`` that name a trainer or one of its constants (see above)."""
    out: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        if _in_a_backend(path, root):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docs, rel = _docstrings(tree), path.relative_to(root.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
                if (text in TRAINER_NAMES or text.startswith(TRAINER_CONSTANTS)) and (rel, text) not in ALLOWED:
                    out.append((rel, node.lineno, text))
    return [f"{rel}:{line}: {text!r}" for rel, line, text in sorted(out)]


def test_only_a_trainers_backend_names_what_it_knows() -> None:
    """Backend names, metric names, held-out keys, commands, code keys and the metrics variable are the backend's
    (``Backend.metrics``, ``heldout_keys``, ``default_command``, ``code_keys``, ``metrics_env``)."""
    assert {"verl", "verl_core", "trl"} <= set(TRAINER_NAMES)
    assert trainer_literals() == []


def test_the_trainer_literal_check_sees_one(tmp_path: Path) -> None:
    (tmp_path / "hpo" / "study").mkdir(parents=True)
    (tmp_path / "hpo" / "backends" / "toy").mkdir(parents=True)
    (tmp_path / "hpo" / "study" / "_x.py").write_text(
        '"""Reads timing_s/step (a docstring: allowed)."""\nt = data.get("timing_s/step")\nname = "trl"\n'
        'help = "the spread (verl_core: eval/reward_std)"\n')
    (tmp_path / "hpo" / "backends" / "_base.py").write_text('key = "data.test_files"\n')
    (tmp_path / "hpo" / "backends" / "toy" / "_names.py").write_text('key = "data.test_files"\n')
    assert trainer_literals(tmp_path / "hpo") == ["hpo/backends/_base.py:1: 'data.test_files'",
                                                  "hpo/study/_x.py:2: 'timing_s/step'", "hpo/study/_x.py:3: 'trl'"]


def test_the_study_loop_stays_small() -> None:
    """``study/`` holds the loop; storages, samplers and the stored record have rooms of their own."""
    modules = [p.name for p in (HPO / "study").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 14, sorted(modules)


# ----------------------------------------------------------------------------- small modules (issue 46)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def long_functions(path: Path) -> list[str]:
    """The functions and methods of the module ``path`` (decorators included) longer than
    :data:`MAX_FUNCTION_LINES`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                out.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - start + 1} lines")
    return out


def oversized(package: Path) -> list[str]:
    """The modules of ``package`` (its own ``*.py``) longer than :data:`MAX_MODULE_LINES` lines, and their functions
    and methods (decorators included) longer than :data:`MAX_FUNCTION_LINES`."""
    out = []
    for path in sorted(package.glob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{path.name}: {lines} lines")
        out += long_functions(path)
    return out


def test_the_experiment_package_comes_in_small_pieces() -> None:
    """``hpo/experiment`` holds one concept a module (schema, YAML reader, overrides, parsing, limits, ...): no module
    over 400 lines, no function over 80."""
    assert oversized(HPO / "experiment") == []


def test_the_size_check_sees_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long_function.py").write_text(f"def ok():\n    pass\n\n\n@staticmethod\ndef f():\n{body}")
    (tmp_path / "long_module.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    at_limit = "def g():\n" + "".join(f"    y{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))  # 80 lines
    (tmp_path / "fine.py").write_text("x = 1\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES) + at_limit)  # 400 lines
    assert oversized(tmp_path) == ["long_function.py:6 f: 82 lines", "long_module.py: 401 lines"]


MAX_CLI_LINES = 250


def test_no_function_in_hpo_is_over_80_lines() -> None:
    """Every function and method of every module under ``hpo/`` (subpackages included) fits in 80 lines: a longer one
    is split into named stages."""
    assert [f"{p.parent.relative_to(HPO.parent)}/{line}" for p in _modules() for line in long_functions(p)] == []


def test_the_cli_is_a_parser_and_a_dispatch_table() -> None:
    """``hpo/_cli.py`` holds the parser, the dispatch table and the error handling; each subcommand is a module of
    ``hpo/commands`` (no module there over 400 lines)."""
    assert len((HPO / "_cli.py").read_text().splitlines()) < MAX_CLI_LINES
    assert oversized(HPO / "commands") == []


# ----------------------------------------------------------------------------- each trainer in its own room (issue 55)
# The trainers this repository ships as packages of their own, beside ``hpo/``. A backend may import the one its
# name is (``hpo/backends/verl_core/`` runs ``verl_core``) and those its ``__init__`` states in ``USES``; the contract
# (the modules directly in ``hpo/backends/``) imports none of them, and no backend imports another backend.
TRAINER_PACKAGES = ("verl_core",)


def _imported(path: Path, me: str) -> list[tuple[int, str]]:
    """Every module ``path`` (the module ``me``) imports, by line and dotted name: at the top, inside a function,
    under ``if TYPE_CHECKING:``; ``from p import x`` counts as ``p.x`` (``x`` may be a module), relative imports
    resolved."""
    here = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def stated_uses(backend_dir: Path) -> tuple[str, ...]:
    """The trainer packages a backend says it imports: ``USES = (...)`` in its ``__init__.py`` (none when absent)."""
    for node in ast.parse((backend_dir / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "USES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def room_crossings(root: Path = HPO) -> list[str]:
    """Imports, lazy ones included, that take a trainer's code out of its room: a backend importing another backend,
    the contract importing a trainer package, a backend importing a trainer package it does not state."""
    backends_dir = root / "backends"
    rooms = {p.name for p in backends_dir.iterdir() if (p / "__init__.py").is_file()}
    out = []
    for path in sorted(backends_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root.parent)
        parts = list(rel.with_suffix("").parts)
        room = parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in rooms) else None
        me = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        allowed = (room, *stated_uses(backends_dir / room)) if room else ()
        for line, target in _imported(path, me):
            names = target.split(".")
            if names[:2] == ["hpo", "backends"] and len(names) > 2 and names[2] in rooms and names[2] != room \
                    and room is not None:
                out.append(f"{rel}:{line} imports the backend hpo.backends.{names[2]}")
            elif names[0] in TRAINER_PACKAGES and room is None:
                out.append(f"{rel}:{line} (the contract) imports {names[0]}")
            elif names[0] in TRAINER_PACKAGES and names[0] not in allowed:
                out.append(f"{rel}:{line} imports {names[0]}, not stated in hpo/backends/{room}/__init__.py's USES")
    return list(dict.fromkeys(out))  # one line per import statement


def test_each_trainer_stays_in_its_own_room() -> None:
    assert room_crossings() == []


def test_only_trl_states_that_it_uses_verl_core() -> None:
    """TRL's launcher builds verl_core's built-in models and data and scores with its rewards, and says so."""
    stated = {p.name: stated_uses(p) for p in (HPO / "backends").iterdir() if (p / "__init__.py").is_file()}
    assert {name: uses for name, uses in stated.items() if uses} == {"trl": ("verl_core",)}
    doc = ast.get_docstring(ast.parse((HPO / "backends" / "trl" / "__init__.py").read_text()))
    assert doc and "verl_core" in doc.split("May import:")[1]


def test_the_room_check_sees_each_crossing(tmp_path: Path) -> None:
    """A synthetic tree: a backend importing another backend (lazily, and relatively), the contract importing
    verl_core under ``TYPE_CHECKING``, a backend importing verl_core unstated; a stated use and a backend's own
    trainer pass."""
    files = {"backends/__init__.py": "", "backends/_base.py": "from typing import TYPE_CHECKING\n"
             "if TYPE_CHECKING:\n    from verl_core.memory import X\n",
             "backends/_ok.py": "from hpo.backends import _base\n",
             "backends/a/__init__.py": "", "backends/a/_x.py": "def f():\n    from hpo.backends.b._y import g\n",
             "backends/a/_z.py": "from .. import b\nimport verl_core.tasks\n",
             "backends/b/__init__.py": "USES = ('verl_core',)\n", "backends/b/_y.py": "from verl_core import rewards\n",
             "backends/verl_core/__init__.py": "", "backends/verl_core/_w.py": "import verl_core\n"}
    for name, text in files.items():
        (tmp_path / "hpo" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "hpo" / name).write_text(text)
    assert room_crossings(tmp_path / "hpo") == [
        "hpo/backends/_base.py:3 (the contract) imports verl_core",
        "hpo/backends/a/_x.py:2 imports the backend hpo.backends.b",
        "hpo/backends/a/_z.py:1 imports the backend hpo.backends.b",
        "hpo/backends/a/_z.py:2 imports verl_core, not stated in hpo/backends/a/__init__.py's USES"]


def test_no_module_reaches_into_another_package_s_private_module() -> None:
    """Issue 55 item 2: one face per package. A module of ``hpo/`` imports another package's names from that
    package (``from hpo.experiment import Space``), never from one of its ``_modules`` (``hpo.experiment._space``);
    a package's own modules and its subpackages' may. Lazy imports count too."""
    found = []
    for path in _modules():
        me = _name(path)
        home = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        for line, target in _imports(path):
            parts = target.split(".")
            private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            if private is None:
                continue
            owner = ".".join(parts[:private])
            if home != owner and not home.startswith(owner + "."):
                found.append(f"{path.relative_to(REPO)}:{line} imports {target} (use {owner})")
    assert found == [], "\n".join(found)
