"""make test-slow's two heavy runs share the ``cpu_heavy_late`` tests through claims (``tests/conftest.py``): the first
run takes them last, the run that reaches one first runs it, the other skips it; without the claims directory every
test runs where it stands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import HEAVY_CLAIMS, REPO

TESTS = '''
import pytest

@pytest.mark.cpu_heavy_late
def test_late_one():
    print("RAN late_one")

def test_plain():
    print("RAN plain")

@pytest.mark.cpu_heavy_late
def test_late_two():
    print("RAN late_two")
'''


def run(folder: Path, claims: Path | None, *args: str) -> list[str]:
    """The tests' ``RAN`` lines in the order they ran, then each test's outcome."""
    env = {k: v for k, v in os.environ.items() if k != HEAVY_CLAIMS}
    if claims is not None:
        env[HEAVY_CLAIMS] = str(claims)
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-s",
                          "-rs", "-v", "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(folder),
                          *args, str(folder / "test_x.py")], cwd=folder, capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(REPO), "COLUMNS": "300"})
    assert res.returncode == 0, res.stdout + res.stderr
    return [line.split("RAN ", 1)[1].split()[0] for line in res.stdout.splitlines() if "RAN " in line] + [
        line.split("::")[1].split(" [")[0] for line in res.stdout.splitlines() if " SKIPPED" in line and "::" in line]


def test_the_first_heavy_run_takes_the_late_tests_last_and_the_second_only_those_it_has_not_begun(
        tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(TESTS)
    claims = tmp_path / "claims"
    claims.mkdir()
    # the second run (-m cpu_heavy_late) reaches test_late_one first: the first run then skips it, runs the other
    assert run(tmp_path, claims, "-m", "cpu_heavy_late", "-k", "late_one") == ["late_one"]
    assert run(tmp_path, claims) == ["plain", "late_two", "test_late_one SKIPPED (the other heavy run of make "
                                                          "test-slow took it)"]
    assert run(tmp_path, claims, "-m", "cpu_heavy_late") == [
        "test_late_one SKIPPED (the other heavy run of make test-slow took it)",
        "test_late_two SKIPPED (the other heavy run of make test-slow took it)"]
    assert len(list(claims.iterdir())) == 2


def test_without_claims_every_test_runs_where_it_stands(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(TESTS)
    assert run(tmp_path, None) == ["late_one", "plain", "late_two"]
    assert run(tmp_path, None) == ["late_one", "plain", "late_two"]  # nothing kept between runs
