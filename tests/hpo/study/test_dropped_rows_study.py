"""A study that sees the rows its trainer dropped (issue 52, item 1) and logs that cannot fill the disk (item 8), run
as a user runs it: ``verl-hpo search`` and ``best`` from a directory of their own, with an installed trainer plugin
whose trainer runs verl's agent loop (it reuses verl's patterns, ``VerlBackend.dropped_row_patterns``) and prints what
verl 0.9.1 prints when a reward raises on some rows, in the middle of a chatty log."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, cli_env, load
from tests.hpo.execution.test_dropped_rows import VERL_ROWS

TRAINER = VERL_ROWS + textwrap.dedent('''
    import json, sys
    args = sys.argv[1:]
    metrics = args[args.index("--metrics-file") + 1]
    values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    x, bad, chatter_mb = float(values["toy.x"]), int(values["toy.bad"]), int(values["toy.chatter_mb"])
    chatter = "(TaskRunner pid=11) reward called " + "." * 65 + "\\n"  # 100 bytes
    sys.stderr.write(chatter * (chatter_mb * 10000))
    sys.stderr.write(dropped(bad, 2, 4242))  # rollout.n = 2: two lines per prompt
    sys.stderr.write(chatter * (chatter_mb * 10000))
    with open(metrics, "w") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "data": {"toy/quality": round(1 - (x - 0.3) ** 2, 6)}}) + "\\n")
''')

BACKEND = '''
from pathlib import Path

from hpo.analysis import MetricNames
from hpo.backends import CommandBackend
from hpo.backends.verl._backend import VerlBackend


class RowLoss(CommandBackend):
    """A trainer built on verl's agent loop, with an entry point and metric names of its own."""

    name = "rowloss"
    default_command = ("python", str(Path(__file__).with_name("rowloss_trainer.py")))
    metrics = MetricNames(objective="toy/quality")
    dropped_row_patterns = VerlBackend.dropped_row_patterns
'''


@pytest.fixture
def user(tmp_path: Path) -> Path:
    """The user's directory: the plugin installed (a ``*.dist-info`` on the path, as pip leaves it), an experiment
    whose trainer drops 3 prompts (6 lines) in 6 MB of stderr."""
    site = tmp_path / "site"
    info = site / "rowloss-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rowloss\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl_hpo.backends]\nrowloss = rowloss_hpo:RowLoss\n")
    (site / "rowloss_hpo.py").write_text(BACKEND)
    (site / "rowloss_trainer.py").write_text(TRAINER)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({
        "config": "toy.yaml",
        "overrides": {"toy.bad": 3, "toy.chatter_mb": 3},
        "params": {"x": {"key": "toy.x", "type": "float", "low": 0.0, "high": 1.0}},
        "study": {"n_trials": 1, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3},
        "trial": {"backend": "rowloss"},
    }, sort_keys=False))
    return tmp_path


def cli(user: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(user / "studies")], cwd=user,
                          env=cli_env(**{"PYTHONPATH": f"{ROOT}:{user / 'site'}", "VERL_HPO_LOG_CAP_MIB": "1", **env}),
                          capture_output=True, text=True, timeout=120)


def test_the_summary_the_trial_table_and_best_say_how_many_rows_a_trial_lost(user: Path) -> None:
    res = cli(user, "search", "--space", "exp.yaml")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert ("trial 0: the trainer dropped 3 row(s) of its data and went on without them; the first: ValueError: "
            "invalid literal for int() with base 10: 'NA' (after: ") in out
    assert "trial 0: stderr.log went over its cap of 1 MiB ($VERL_HPO_LOG_CAP_MIB): " in out  # the driver's line
    assert str(user / "studies" / "exp" / "trials") in out.split("trial 0: stderr.log went over", 1)[1].splitlines()[0]
    table = out[out.index("trial  toy/quality"):].splitlines()
    head = table[0].split()
    assert "dropped_rows" in head and table[1].split()[head.index("dropped_rows")] == "3"
    assert "dropped rows: the trainer went on without rows of its data" in out and "trial(s) 0 (3)" in out
    assert "logs cut at their cap" in out and "0 (stderr.log)" in out
    trial = load(user / "studies", "exp").get_trials(deepcopy=False)[0]
    assert trial.state == TrialState.COMPLETE and "fail_reason" not in trial.user_attrs
    assert trial.user_attrs["dropped_rows"] == 3
    log = Path(trial.user_attrs["trial_dir"], "stderr.log")
    assert log.stat().st_size <= 1 << 20 and "cut here" in log.read_text()
    best = cli(user, "best", "--study", "exp")
    assert best.returncode == 0, best.stderr
    assert ("# trial 0 lost 3 row(s) of its data: its trainer went on without them and its value was computed "
            "without them (first: ValueError: invalid literal for int() with base 10: 'NA'") in best.stderr


def test_a_trial_that_lost_more_rows_than_the_limit_fails_with_the_first_exception(user: Path) -> None:
    res = cli(user, "search", "--space", "exp.yaml", VERL_HPO_MAX_DROPPED_ROWS="2")
    assert res.returncode == 0, res.stderr
    trial = load(user / "studies", "exp").get_trials(deepcopy=False)[0]
    assert trial.user_attrs["fail_reason"] == "dropped_rows" and trial.user_attrs["dropped_rows"] == 3
    assert trial.user_attrs["error"].startswith(
        "the trainer dropped 3 rows of its data (more than 2, $VERL_HPO_MAX_DROPPED_ROWS): ValueError: invalid "
        "literal for int() with base 10: 'NA'")
    assert "1 dropped_rows" in res.stdout and "1 failed for dropping more than $VERL_HPO_MAX_DROPPED_ROWS" in res.stdout
    best = cli(user, "best", "--study", "exp")
    assert best.returncode == 1 and "no feasible completed trial" in best.stderr


def test_a_bad_knob_is_one_line_naming_it_before_any_trial_runs(user: Path) -> None:
    """(``$VERL_HPO_LOG_CAP_MIB`` is refused on the same path: ``hpo.execution._logs.knob_problem``.)"""
    res = cli(user, "search", "--space", "exp.yaml", VERL_HPO_MAX_DROPPED_ROWS="many")
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: VERL_HPO_MAX_DROPPED_ROWS='many': expected "), res.stderr
    assert "Traceback" not in res.stderr and not list((user / "studies").glob("*"))  # no study, no database
