"""A trial that fails because the host could not start its trainer in time (``Backend.host_failure_lines``: verl's
Ray node timing out during startup on a busy host) is the host's failure, not the setting's: FAIL, retried, never
the worst value, while retries last. Run as a user runs it: ``verl-hpo search`` from a directory of their own, with an
installed trainer plugin that reuses verl's lines and a trainer that raises Ray's own exception on its first runs."""

from __future__ import annotations

import math
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, cli_env, load

# Ray 2.x's exception (ray/_private/node.py), raised in verl's driver process by ray.init; the trainer raises it on
# its first `fails` runs (a counter file beside it), then trains
TRAINER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    args = sys.argv[1:]
    metrics = args[args.index("--metrics-file") + 1]
    values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    x, fails, error = float(values["toy.x"]), int(values["toy.fails"]), values["toy.error"]
    runs = Path(__file__).with_name("runs.txt")
    n = int(runs.read_text()) if runs.exists() else 0
    runs.write_text(str(n + 1))
    if n < fails:
        print("(raylet) starting ...", file=sys.stderr)
        if error == "ray":
            raise Exception("The current node timed out during startup. This could happen because some of the "
                            "raylet failed to startup or the GCS has become overloaded.")
        raise ValueError("reward function failed on row 3")
    with open(metrics, "w") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "data": {"toy/quality": round(1 - (x - 0.3) ** 2, 6)}}) + "\\n")
''')

BACKEND = '''
from pathlib import Path

from hpo.analysis import MetricNames
from hpo.backends import CommandBackend
from hpo.backends.verl._backend import VerlBackend


class RayToy(CommandBackend):
    """A trainer that starts Ray as verl does, with verl's host failure lines."""

    name = "raytoy"
    default_command = ("python", str(Path(__file__).with_name("raytoy_trainer.py")))
    metrics = MetricNames(objective="toy/quality")
    host_failure_lines = VerlBackend.host_failure_lines
'''


def user_dir(tmp_path: Path, fails: int, error: str = "ray", max_retry: int | None = 3) -> Path:
    """The user's directory: the plugin installed (a ``*.dist-info`` on the path, as pip leaves it), an experiment of
    one trial whose trainer fails its first ``fails`` runs with ``error`` (ray: Ray's startup timeout)."""
    site = tmp_path / "site"
    info = site / "raytoy-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: raytoy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl_hpo.backends]\nraytoy = raytoy_hpo:RayToy\n")
    (site / "raytoy_hpo.py").write_text(BACKEND)
    (site / "raytoy_trainer.py").write_text(TRAINER)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({
        "config": "toy.yaml",
        "overrides": {"toy.fails": fails, "toy.error": error},
        "params": {"x": {"key": "toy.x", "type": "float", "low": 0.0, "high": 1.0}},
        "study": {"n_trials": 1, "pruner": {"type": "none"}, "max_retry": max_retry},
        "trial": {"backend": "raytoy"},
    }, sort_keys=False))
    return tmp_path


def search(user: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "hpo", "search", "--space", "exp.yaml", "--studies-dir", str(user / "studies")],
                          cwd=user, env=cli_env(PYTHONPATH=f"{ROOT}:{user / 'site'}"), capture_output=True, text=True,
                          timeout=120)


def test_a_trial_whose_host_could_not_start_ray_is_retried_and_its_retry_counts(tmp_path: Path) -> None:
    user = user_dir(tmp_path, fails=2)
    res = search(user)
    assert res.returncode == 0, res.stderr
    trials = load(user / "studies", "exp").get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    for t in trials[:2]:
        assert t.user_attrs["fail_reason"] == "host" and t.values is None
        assert t.user_attrs["error"].startswith("the host could not start the trainer in time: Exception: The "
                                                "current node timed out during startup.")
    done = trials[2]
    assert done.user_attrs["retry_of"] == 1 and done.params == trials[0].params
    assert done.value == pytest.approx(1 - (done.params["x"] - 0.3) ** 2)
    notes = [ln for ln in res.stdout.splitlines() if "could not start the trainer in time" in ln]
    assert len(notes) == 2 and notes[0].startswith("trial 0: ") and notes[0].endswith(
        "a busy host, not the setting: retry queued"), res.stdout


@pytest.mark.parametrize("max_retry", [1, 0])
def test_retries_end_at_max_retry_and_the_last_failure_is_a_crash(tmp_path: Path, max_retry: int) -> None:
    user = user_dir(tmp_path, fails=5, max_retry=max_retry)
    res = search(user)
    assert res.returncode == 0, res.stderr
    trials = load(user / "studies", "exp").get_trials(deepcopy=False)
    assert len(trials) == max_retry + 1 and (user / "site" / "runs.txt").read_text() == str(max_retry + 1)
    assert all(t.state == TrialState.FAIL and t.user_attrs["fail_reason"] == "host" for t in trials[:-1])
    last = trials[-1]
    assert last.state == TrialState.COMPLETE and last.value == -math.inf
    assert last.user_attrs["fail_reason"] == "crash" and "timed out during startup" in last.user_attrs["error"]
    assert "no retry left: study.max_retry" in last.user_attrs["error"]


def test_any_other_failure_is_the_setting_s_and_is_not_retried(tmp_path: Path) -> None:
    user = user_dir(tmp_path, fails=1, error="reward")
    res = search(user)
    assert res.returncode == 0, res.stderr
    trials = load(user / "studies", "exp").get_trials(deepcopy=False)
    assert len(trials) == 1 and trials[0].state == TrialState.COMPLETE and trials[0].value == -math.inf
    assert trials[0].user_attrs["fail_reason"] == "crash" and "retry" not in res.stdout
