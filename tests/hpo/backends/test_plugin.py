"""An out-of-tree trainer: a package installed with pip (entry point group ``verl_hpo.backends``) runs a study through
the ``verl-hpo`` command line, in a process of its own, with no file of ``hpo/`` changed and no ``register`` call. Its
trainer logs its own metric names (not verl's) and the experiment names neither a command nor an objective: both are
the plugin's. A plugin that does not load is one line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, load, run_cli

# the plugin's trainer: --config FILE --metrics-file PATH key=value ...; quality peaks at x = 0.3
TRAINER = '''
import json, sys
args = sys.argv[1:]
metrics = args[args.index("--metrics-file") + 1]
values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
x, steps = float(values["toy.x"]), int(values.get("toy.steps", 4))
with open(metrics, "w") as f:
    for step in range(1, steps + 1):
        data = {"toy/loss": 1.0 / step, "toy/seconds": 0.01}
        if step % 2 == 0:
            data["toy/quality"] = round(1.0 - (x - 0.3) ** 2, 6) * step / steps
        f.write(json.dumps({"step": step, "data": data}) + "\\n")
'''

BACKEND = '''
import sys
from pathlib import Path

from hpo.analysis import MetricNames
from hpo.backends import Backend


class ToyBackend(Backend):
    """A trainer the driver has never heard of: its own command and its own metric names."""

    name = "toy"
    default_command = ("python", str(Path(__file__).with_name("trainer.py")))
    metrics = MetricNames(objective="toy/quality", step_time="toy/seconds")
'''


def _install_plugin(tmp_path: Path) -> Path:
    """``toy_hpo`` (a backend and its trainer) and a broken plugin, pip-installed into a directory of their own."""
    src = tmp_path / "src"
    pkg = src / "toy_hpo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(BACKEND))
    (pkg / "trainer.py").write_text(textwrap.dedent(TRAINER))
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "toy-hpo"
        version = "0.1"

        [project.entry-points."verl_hpo.backends"]
        toy = "toy_hpo:ToyBackend"
        broken = "toy_hpo_missing:Backend"

        [tool.setuptools]
        packages = ["toy_hpo"]
        '''))
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
    assert "'openrlhf' is not one of verl_core, trl, verl, broken, toy" in unknown.stderr
    broken = run_cli(["search", "--space", str(_experiment(tmp_path, backend="broken"))], studies, timeout=60,
                     **_env(plugin_site))
    assert broken.returncode == 2, broken.stderr
    line = broken.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "trial.backend broken" in line and "toy_hpo_missing" in line and "ModuleNotFoundError" in line
