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
