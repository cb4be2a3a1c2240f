"""Where the driver writes, as a user would meet it from outside the repository (issue 53, items 2, 3, 11):
an output path that exists and is not a regular file is refused (never replaced), a studies directory or a
dashboard directory that cannot be made is one line about that directory (not blamed on the storage), study
names that are the tool's own directories are refused, and a shipped space name works from any directory."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpo.experiment._space import SpaceError
from hpo.storages._storage import check_study_name
from tests.hpo.conftest import PY, ROOT, cli_env, fake_space

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def cli(args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m hpo ARGS`` started in ``cwd`` (outside the repository), as a user would."""
    return subprocess.run([PY, "-m", "hpo", *args], cwd=cwd, env=cli_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(res: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(cwd, studies dir) holding study ``fake``: one finished trial of the fake trainer (the page has content)."""
    cwd = tmp_path_factory.mktemp("user")
    studies = cwd / "studies"
    res = cli(["search", "--space", str(fake_space(cwd, study={"n_trials": 1})), "--studies-dir", str(studies)], cwd)
    assert res.returncode == 0, res.stderr
    return cwd, studies


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _char_device(path: Path) -> Path:
    """A character device of our own (a copy of /dev/null's numbers, in the test's directory): harmless if hit."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as err:
        pytest.skip(f"cannot make a device node here: {err}")
    return path


# ----------------------------------------------------------------------------- item 2: --out never replaces
@pytest.mark.parametrize(("make", "kind"), [
    (lambda d: _fifo(d / "page.html"), "FIFO"),
    (lambda d: _link(d / "page.html", _fifo(d / "pipe")), "symbolic link"),
    (lambda d: _link(d / "page.html", Path("/dev/full")), "symbolic link"),  # the link is what would be replaced
    (lambda d: _char_device(d / "page.html"), "character device"),
], ids=["fifo", "link-to-fifo", "link-to-dev-full", "char-device"])
def test_dashboard_out_that_is_not_a_regular_file_is_refused(study: tuple[Path, Path], tmp_path: Path,
                                                             make: object, kind: str) -> None:
    cwd, studies = study
    out = make(tmp_path)  # type: ignore[operator]
    before = sorted(p.name for p in tmp_path.iterdir())
    mode = os.lstat(out).st_mode
    line = one_error_line(cli(["dashboard", "--study", "fake", "--out", str(out), "--studies-dir", str(studies)], cwd))
    assert f"--out {out}" in line and kind in line and "not a regular file" in line
    assert os.lstat(out).st_mode == mode  # still the FIFO, the link, the device
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no page, no temporary file beside it
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_the_default_page_path_is_never_replaced_either(study: tuple[Path, Path]) -> None:
    cwd, studies = study
    page = studies / "fake" / "dashboard.html"
    page.unlink(missing_ok=True)
    _fifo(page)
    try:
        line = one_error_line(cli(["dashboard", "--study", "fake", "--studies-dir", str(studies)], cwd))
        assert str(page) in line and "FIFO" in line
        assert stat.S_ISFIFO(os.lstat(page).st_mode)
    finally:
        page.unlink()


def test_check_output_path_accepts_a_new_or_regular_file(tmp_path: Path) -> None:
    from hpo.analysis._outputs import OutputRefused, check_output_path

    assert check_output_path(tmp_path / "new.html", "--out") == tmp_path / "new.html"
    (tmp_path / "old.html").write_text("x")
    assert check_output_path(tmp_path / "old.html", "--out") == tmp_path / "old.html"
    with pytest.raises(OutputRefused, match="character device"):
        check_output_path(Path("/dev/full"), "--out")


# ----------------------------------------------------------------------------- item 11: directories not made
def test_a_studies_dir_that_is_a_regular_file_is_one_line_about_it(tmp_path: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for storage in ([], ["--storage", PG_URL]):  # whichever the storage, the directory is what is wrong
        line = one_error_line(cli(["search", "--space", str(space), "--studies-dir", str(afile), *storage], tmp_path))
        assert f"--studies-dir {afile}" in line and "a regular file, not a directory" in line
        assert "storage" not in line
    from hpo.commands import check_studies_dir

    with pytest.raises(SpaceError, match=f"{afile} is a regular file, not a directory"):
        check_studies_dir(afile / "sub")
    assert afile.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "fake.yaml"]


def test_a_dashboard_directory_under_a_regular_file_is_one_line_about_it(study: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    cwd, studies = study
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    out = afile / "sub" / "page.html"
    line = one_error_line(cli(["dashboard", "--study", "fake", "--out", str(out), "--studies-dir", str(studies)], cwd))
    assert f"--out {out}" in line and str(afile) in line and "not a directory" in line and "storage" not in line
    assert afile.read_text() == "mine\n"


# ----------------------------------------------------------------------------- item 3: the tool's own names
def test_a_study_named_rehearsals_is_refused(tmp_path: Path) -> None:
    """``<studies>/rehearsals/`` is the home of every rehearsal, which the next one of its experiment empties."""
    studies = tmp_path / "studies"
    space = fake_space(tmp_path, study={"n_trials": 1})
    line = one_error_line(cli(["search", "--space", str(space), "--study", "rehearsals", "--studies-dir",
                               str(studies)], tmp_path))
    assert "--study 'rehearsals'" in line and "verl-hpo's own" in line
    assert not studies.exists()


def test_an_experiment_named_rehearsals_needs_another_study_name(tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    space = fake_space(tmp_path, name="rehearsals", study={"n_trials": 1})
    line = one_error_line(cli(["search", "--space", str(space), "--studies-dir", str(studies)], tmp_path))
    assert "space name 'rehearsals'" in line and "--study" in line
    assert not studies.exists()


def test_every_name_of_the_studies_dir_is_refused_by_check_study_name() -> None:
    from hpo.analysis._outputs import STUDIES_DIR_NAMES

    for name in STUDIES_DIR_NAMES:  # (.baselines: no study name starts with a dot)
        with pytest.raises(SpaceError):
            check_study_name(name)
    for name in ["rehearsals", "Rehearsals", "MLflow-Artifacts", "other.db", "x.db.lock", "x.DB-wal"]:
        with pytest.raises(SpaceError, match="verl-hpo's own"):
            check_study_name(name)
    for name in ("kl_lr", "rehearsal", "trials", "dbx", "a.dbx", "db"):
        assert check_study_name(name) == name


# ----------------------------------------------------------------------------- item 11: shipped space names
def test_a_shipped_space_name_resolves_from_any_directory(tmp_path: Path) -> None:
    res = cli(["validate", "--space", "kl_lr"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "All checks passed" in res.stdout


def test_a_space_name_is_looked_up_locally_first_then_among_the_shipped(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo.experiment._space import SHIPPED_SPACES_DIR, resolve_space_path

    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "my_spaces"
    mine.mkdir()
    assert resolve_space_path("kl_lr", mine) == SHIPPED_SPACES_DIR / "kl_lr.yaml" == ROOT / "search_spaces/kl_lr.yaml"
    (mine / "kl_lr.yaml").write_text("config: tiny_arith\n")
    assert resolve_space_path("kl_lr", mine) == mine / "kl_lr.yaml"
    assert resolve_space_path("sub/kl_lr") == Path("sub/kl_lr")  # a path stays a path


def test_an_unknown_space_name_says_where_it_looked(tmp_path: Path) -> None:
    line = one_error_line(cli(["validate", "--space", "no_such_space"], tmp_path))
    assert "no_such_space.yaml" in line and f"search_spaces/ (in {tmp_path})" in line
    assert str(ROOT / "search_spaces") in line
