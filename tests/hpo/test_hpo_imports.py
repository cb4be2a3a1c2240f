"""The design rule: the driver never imports torch (nor transformers), even while validating a space."""

from __future__ import annotations

import subprocess
import textwrap

import hpo
from tests.hpo.conftest import PY, ROOT, cli_env

CHECK = textwrap.dedent("""
    import sys
    import hpo
    from hpo._cli import main
    from hpo.backends import load_space
    assert main(["search", "--space", "/nonexistent/space.yaml", "--studies-dir", sys.argv[1]]) == 2
    load_space("kl_lr")  # validates trainer keys and corners with verl_core.config
    heavy = sorted(m for m in ("torch", "transformers", "verl_core.trainer") if m in sys.modules)
    print("HEAVY", heavy)
""")


def test_hpo_and_its_cli_do_not_import_torch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = subprocess.run([PY, "-c", CHECK, str(tmp_path / "studies")], cwd=ROOT, env=cli_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout


def test_public_names() -> None:
    for name in hpo.__all__:
        assert hasattr(hpo, name), name
    assert sorted(hpo._HOME) == sorted(hpo.__all__)  # each name imported lazily from its layer, and no other


LOADED = textwrap.dedent("""
    import sys
    from hpo._cli import main
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
    print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] in ("optuna", "sqlalchemy") and "." not in m
                           or m in ("hpo.study", "hpo.reporting", "hpo.storages", "hpo.tracking", "hpo.backends",
                                    "hpo.backends.verl", "hpo.backends.trl")))
""")


def _loaded(*argv: str) -> str:
    res = subprocess.run([PY, "-c", LOADED, *argv], cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return next(line for line in res.stdout.splitlines() if line.startswith("LOADED "))


def test_the_cli_loads_only_what_its_subcommand_uses() -> None:
    """``hpo`` re-exports its layers lazily and the CLI imports a subcommand's module (and its flags) only when that
    subcommand runs: ``--help`` loads no layer above the experiment, and ``validate`` of a verl_core experiment no
    Optuna, storage, study loop, report or other trainer's backend (``make test`` starts the CLI hundreds of times)."""
    assert _loaded("--help") == "LOADED []"
    assert _loaded("validate", "--space", "kl_lr") == "LOADED ['hpo.backends']"
