"""An out-of-tree trainer: a package installed with pip (entry point group ``verl_hpo.backends``) runs a study through
the ``verl-hpo`` command line, in a process of its own, with no file of ``hpo/`` changed and no ``register`` call. Its
backend writes the required core only (``toy_plugin/toy_hpo``: ``ToyBackend``), its trainer logs its own metric names
(not verl's) and the experiment names neither a command nor an objective: both are the plugin's. A plugin that does
not load, or misses a member of the required core, is one line. (What the plugin's features do, confirm, a retry,
PBT and ``best``: the contract suite, ``test_testing.py``.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, load, run_cli

TOY = Path(__file__).with_name("toy_plugin")  # toy_hpo (ToyBackend: the required core only), its trainer, pyproject


def _install_plugin(tmp_path: Path) -> Path:
    """``toy_hpo`` (its backends and trainer; entry points toy, toy_full and a broken one), pip-installed into a
    directory of its own."""
    src = tmp_path / "src"
    shutil.copytree(TOY, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    target = tmp_path / "site"
    subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, capture_output=True, timeout=120)
    assert list(target.glob("toy_hpo-*.dist-info/entry_points.txt"))
    return target


def _experiment(tmp_path: Path, **trial: object) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({
        "config": "toy.yaml",
        "overrides": {"toy.steps": 4},
        "params": {"x": {"key": "toy.x", "type": "float", "low": 0.0, "high": 1.0}},
        "study": {"n_trials": 2, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3},
        "trial": {"backend": "toy", **trial},
    }, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _install_plugin(tmp_path_factory.mktemp("plugin"))


def _env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{ROOT}:{site}"}


def test_an_installed_backend_plugin_runs_a_study_by_its_own_names(tmp_path: Path, plugin_site: Path) -> None:
    studies = tmp_path / "studies"
    res = run_cli(["search", "--space", str(_experiment(tmp_path))], studies, timeout=120, **_env(plugin_site))
    assert res.returncode == 0, res.stderr
    trials = load(studies, "toy").get_trials(deepcopy=False)
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:  # the value is the plugin's objective, toy/quality, at the last evaluation
        assert t.value == pytest.approx(round(1.0 - (t.params["x"] - 0.3) ** 2, 6))
        argv = json.loads((Path(t.user_attrs["trial_dir"]) / "command.json").read_text())["argv"]
        assert argv[:2] == [sys.executable, str(plugin_site / "toy_hpo" / "trainer.py")]  # the plugin's command


def test_a_plugin_name_is_listed_and_a_broken_plugin_is_one_line(tmp_path: Path, plugin_site: Path) -> None:
    studies = tmp_path / "studies"
    unknown = run_cli(["search", "--space", str(_experiment(tmp_path, backend="openrlhf"))], studies, timeout=60,
                      **_env(plugin_site))
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    assert "'openrlhf' is not one of verl_core, trl, verl, broken, toy, toy_full" in unknown.stderr
    broken = run_cli(["search", "--space", str(_experiment(tmp_path, backend="broken"))], studies, timeout=60,
                     **_env(plugin_site))
    assert broken.returncode == 2, broken.stderr
    line = broken.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "trial.backend broken" in line and "toy_hpo_missing" in line and "ModuleNotFoundError" in line


# Hostile plugins (issue 53, item 7). Each is a module beside a ``*.dist-info`` directory on PYTHONPATH (what pip
# installs, without pip): its import first leaves a marker file, then does what the plugin does.
HOSTILE = {
    "exit": "import sys; sys.exit(0)",
    "exit_message": "raise SystemExit('bye')",
    "interrupt": "raise KeyboardInterrupt",
    "sleep": "import time; time.sleep(5)",
}


def _distribution(site: Path, dist: str, entry_points: dict[str, str]) -> None:
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl_hpo.backends]\n" + "".join(f"{n} = {v}\n"
                                                                           for n, v in entry_points.items()))


def _module(site: Path, module: str, then: str) -> Path:
    """``module`` on ``site``: its import writes ``<module>.imported`` beside the site, then runs ``then``."""
    marker = site.parent / f"{module}.imported"
    (site / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\n{then}\n")
    return marker


def _cli(tmp_path: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m hpo ARGS`` as a user runs it, from a directory outside the repository, the plugins installed."""
    return subprocess.run([PY, "-m", "hpo", *args], cwd=tmp_path, env=cli_env(PYTHONPATH=f"{ROOT}:{site}"),
                          capture_output=True, text=True, timeout=60)


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2 and res.stdout == "", (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture
def hostile_site(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Two installed plugins nobody's experiment names: one exits at import, one sleeps 5 s."""
    site = tmp_path / "site"
    _distribution(site, "hostile", {"quitter": "hostile_exit:Backend", "sleeper": "hostile_sleep:Backend"})
    return site, [_module(site, "hostile_exit", HOSTILE["exit"]), _module(site, "hostile_sleep", HOSTILE["sleep"])]


def test_refusals_and_other_experiments_never_import_an_installed_plugin(
        tmp_path: Path, hostile_site: tuple[Path, list[Path]]) -> None:
    """A refusal that lists the trainers that can (pbt, rehearse) asks the shipped ones and names the plugins it did
    not ask: a plugin that exits at import cannot turn it into a silent exit 0, one that sleeps cannot delay it."""
    site, markers = hostile_site
    studies = tmp_path / "studies"
    pbt = fake_space(tmp_path, study={"strategy": "pbt"})
    not_asked = "installed plugins not asked: quitter, sleeper"
    for command in (["validate", "--space", str(pbt)], ["search", "--space", str(pbt), "--studies-dir", str(studies)]):
        line = _one_line(_cli(tmp_path, site, *command))
        assert line == (f"error: {pbt}: study.strategy: pbt needs a trainer that resumes its checkpoints (verl_core "
                        f"or verl; {not_asked}); trial.backend is verl_core with a command of its own (trial.command)")
    kl_lr = ROOT / "search_spaces" / "kl_lr.yaml"
    assert _one_line(_cli(tmp_path, site, "rehearse", "--space", str(kl_lr))) == (
        f"error: {kl_lr}: trial.backend is 'verl_core': rehearse runs verl experiments (trial.backend: verl; "
        f"{not_asked})")
    unknown = _one_line(_cli(tmp_path, site, "validate", "--space", str(fake_space(tmp_path, "unknown", trial={
        "backend": "openrlhf"}))))
    assert "'openrlhf' is not one of verl_core, trl, verl, quitter, sleeper" in unknown
    plain = _cli(tmp_path, site, "validate", "--space", str(fake_space(tmp_path, "plain")))
    assert plain.returncode == 0 and "All checks passed" in plain.stdout, plain.stderr
    assert not studies.exists() and [m for m in markers if m.exists()] == []


@pytest.mark.parametrize("does", ["exit", "exit_message", "interrupt"])
def test_a_plugin_that_ends_its_import_is_one_line_naming_it(tmp_path: Path, does: str) -> None:
    """The experiment names the plugin: whatever its import raises (SystemExit, its own KeyboardInterrupt) is one
    line naming the entry point, its module and what it raised, exit 2, no study."""
    site = tmp_path / "site"
    _distribution(site, "hostile", {"quitter": "hostile_exit:Backend"})
    marker = _module(site, "hostile_exit", HOSTILE[does])
    raised = {"exit": "SystemExit: 0", "exit_message": "SystemExit: bye", "interrupt": "KeyboardInterrupt"}[does]
    path = fake_space(tmp_path, trial={"backend": "quitter"})
    studies = tmp_path / "studies"
    commands = [["validate", "--space", str(path)], ["search", "--space", str(path), "--studies-dir", str(studies)]]
    for command in commands if does == "exit" else commands[:1]:
        line = _one_line(_cli(tmp_path, site, *command))
        assert line.startswith(f"error: {path}: trial.backend quitter: ") and marker.exists()
        assert "entry point quitter = hostile_exit:Backend" in line and "distribution hostile" in line, line
        assert line.endswith(f"does not load: {raised}"), line
    assert not studies.exists()


DUPLICATE = '''
from hpo.backends import Backend


class Dup(Backend):
    name = "dup"
'''


def test_two_plugins_of_one_name_are_refused_when_that_name_is_used(tmp_path: Path) -> None:
    """Two distributions give the trainer ``dup``: an experiment naming it is refused (both named, neither imported),
    an experiment of another trainer runs, and the list of trainers says ``dup`` is claimed twice."""
    site = tmp_path / "site"
    _distribution(site, "dup-one", {"dup": "dup_one:Dup"})
    _distribution(site, "dup-two", {"dup": "dup_two:Dup"})
    markers = [_module(site, m, DUPLICATE) for m in ("dup_one", "dup_two")]
    path = fake_space(tmp_path, trial={"backend": "dup"})
    line = _one_line(_cli(tmp_path, site, "validate", "--space", str(path)))
    assert line.startswith(f"error: {path}: trial.backend dup: 2 installed plugins give this name: "), line
    for module, dist in (("dup_one:Dup", "dup-one"), ("dup_two:Dup", "dup-two")):
        assert f"{module} (distribution {dist}, {site})" in line, line
    assert line.endswith("uninstall all but one"), line
    plain = _cli(tmp_path, site, "validate", "--space", str(fake_space(tmp_path, "plain")))
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    unknown = _one_line(_cli(tmp_path, site, "validate", "--space", str(fake_space(tmp_path, "unknown", trial={
        "backend": "openrlhf"}))))
    assert "'openrlhf' is not one of verl_core, trl, verl, dup (2 plugins: dup-one, dup-two)" in unknown
    assert [m for m in markers if m.exists()] == []


HALF = '''
from hpo.analysis import MetricNames
from hpo.backends import Backend, TrialConfig


class Half(Backend):
    name = "half"
    metrics = MetricNames(objective="score")

    def configure(self, attempt):
        return TrialConfig([], None, "")
'''


def test_an_installed_plugin_that_misses_a_required_member_is_one_line(tmp_path: Path) -> None:
    """A plugin class that writes ``name``, ``metrics`` and ``configure`` but no ``command``: an experiment naming it
    is refused as the registry loads it, one line naming the entry point and what is missing, exit 2, no study."""
    site = tmp_path / "site"
    _distribution(site, "half-hpo", {"half": "half_hpo:Half"})
    _module(site, "half_hpo", HALF)
    path = fake_space(tmp_path, trial={"backend": "half"})
    studies = tmp_path / "studies"
    search = ["search", "--space", str(path), "--studies-dir", str(studies)]
    for command in (["validate", "--space", str(path)], search):
        line = _one_line(_cli(tmp_path, site, *command))
        assert line == (f"error: {path}: trial.backend half: the backend from entry point half = half_hpo:Half "
                        "(verl_hpo.backends, distribution half-hpo) does not write command (every trainer writes "
                        "name, metrics, configure, command: hpo.backends.Backend)"), line
    assert not studies.exists()
