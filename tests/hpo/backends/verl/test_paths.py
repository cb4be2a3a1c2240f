"""A verl experiment's relative paths are resolved once, the same from any working directory (issue 43 item 3):
the file's own against the file's directory, ``--override`` ones against the current directory; hub ids,
``${oc.env:...}`` and absolute paths stay as they are; a leading ``~`` is the user's home (issue 53 item 11)
(``hpo/backends/verl/_paths.py``); a user's experiment with its data and reward beside it validates from any
directory with real verl's interpreter; ``worker``/``resume --space`` compare that file with the stored study's
experiment with its relative paths read beside it too, from any directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from hpo.backends import load_space
from hpo.record import ATTR_DIGEST, ATTR_SPACE
from hpo.study._optuna import open_study
from tests.hpo.backends.verl.conftest import ARITH, CPU_SPACE, arith_experiment, arith_rows, needs_verl
from tests.hpo.conftest import ROOT, cli_env


def _experiment(tmp_path: Path) -> Path:
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_cpu.yaml").read_text())
    mine = tmp_path / "proj" / "exp"
    (mine / "model").mkdir(parents=True)
    raw["overrides"].update({"data.train_files": "data/train.parquet", "data.val_files": "[a.parquet, ../b.parquet]",
                             "reward.custom_reward_function.path": "./reward.py",
                             "actor_rollout_ref.model.path": "model"})
    raw["trial"]["python"] = "../venv/bin/python"
    raw["study"].setdefault("confirm", {})["test_files"] = "held/test.parquet"
    path = mine / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("where", ["experiment", "parent", "elsewhere"])
def test_the_file_s_paths_are_relative_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   where: str) -> None:
    path = _experiment(tmp_path)
    cwd = {"experiment": path.parent, "parent": tmp_path / "proj", "elsewhere": tmp_path}[where]
    monkeypatch.chdir(cwd)
    space = load_space(str(path.relative_to(cwd)) if where != "elsewhere" else str(path))
    exp = path.parent
    assert space.overrides["data.train_files"] == str(exp / "data" / "train.parquet")
    assert space.overrides["data.val_files"] == [str(exp / "a.parquet"), str(exp.parent / "b.parquet")]
    assert space.overrides["reward.custom_reward_function.path"] == str(exp / "reward.py")
    assert space.overrides["actor_rollout_ref.model.path"] == str(exp / "model")  # a directory there
    assert space.trial.python == str(exp.parent / "venv" / "bin" / "python")
    assert space.study.confirm.test_files == str(exp / "held" / "test.parquet")
    # what is stored with the study (resume reads it, from anywhere) holds the same absolute paths
    assert space.raw["overrides"]["data.train_files"] == str(exp / "data" / "train.parquet")
    assert space.raw["trial"]["python"] == space.trial.python


def test_command_line_paths_are_relative_to_the_current_directory_and_others_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _experiment(tmp_path)
    monkeypatch.chdir(tmp_path)
    space = load_space(str(path), ["data.train_files=mine.parquet", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B",
                                   "critic.model.path=${oc.env:HOME}/m", "trial.python=~/venv/bin/python"])
    assert space.overrides["data.train_files"] == str(tmp_path / "mine.parquet")
    assert space.overrides["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-0.5B"  # a hub id, not a directory here
    assert space.overrides["critic.model.path"] == "${oc.env:HOME}/m"
    # a subprocess does not expand ~ as the shell would: the interpreter is the user's home's
    assert space.trial.python == str(Path.home() / "venv" / "bin" / "python") == space.raw["trial"]["python"]


def test_a_leading_tilde_is_the_user_s_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 53 item 11: ``data.train_files: ~/x.parquet`` reached hydra as it was, whose override syntax reads a
    leading ``~`` as a deletion (a 2 KB lexer error headed "memory estimate"), and verl expands none: the user meant
    their home, so it is expanded when the experiment is loaded, in the file, on the command line and in lists."""
    path = _experiment(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["overrides"].update({"data.train_files": "~/data/train.parquet", "data.val_files": "[~/a.parquet, b.parquet]",
                             "actor_rollout_ref.model.path": "~/models/qwen"})
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    space = load_space(str(path), ["reward.custom_reward_function.path=~/reward.py", "trial.python=~/v/bin/python"])
    assert space.trial.python == str(home / "v" / "bin" / "python")
    assert space.overrides["data.train_files"] == str(home / "data" / "train.parquet")
    assert space.overrides["data.val_files"] == [str(home / "a.parquet"), str(path.parent / "b.parquet")]
    assert space.overrides["actor_rollout_ref.model.path"] == str(home / "models" / "qwen")
    assert space.overrides["reward.custom_reward_function.path"] == str(home / "reward.py")
    assert space.raw["overrides"]["data.train_files"] == str(home / "data" / "train.parquet")  # what is stored


def test_a_tilde_of_no_user_is_one_line_naming_the_key(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.hpo.conftest import cli_env

    proc = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", str(_experiment(tmp_path)),
                           "--override", "data.train_files=~no-such-user-h6/x.parquet"], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --override 'data.train_files=~no-such-user-h6/x.parquet': overrides.data.train_files: "
        "'~no-such-user-h6' is no user's home directory on this host (hydra reads a leading ~ as a deletion): write "
        "the full path"], proc.stderr


def test_the_memory_estimate_quotes_what_hydra_cannot_read_bare(tmp_path: Path) -> None:
    """The estimate's corners are a trial's overrides (a value with a space or a ``~`` inside quoted, as the trial
    gets it), and verl's reason for rejecting one is a line of its own, not every override of the corner."""
    from hpo.backends.verl._memory import corner_overrides_of, verl_memory_inputs
    from hpo.experiment import SpaceError

    space = load_space(str(_experiment(tmp_path)), ["+trainer.note=a b", "+trainer.odd=/x/~y"])
    overrides = corner_overrides_of(space, {"actor_lr": 1e-6, "kl_coef": 0.001})
    assert "+trainer.note='a b'" in overrides and "+trainer.odd='/x/~y'" in overrides
    assert "actor_rollout_ref.actor.optim.lr=1e-06" in overrides
    reject = tmp_path / "reject-python"  # an interpreter whose verl rejects the corner, as hydra's lexer did
    reject.write_text("#!/bin/sh\ncat > /dev/null\necho '{\"status\": \"ok\", \"results\": [{\"ok\": false, "
                      "\"message\": \"override x: not hydra override syntax\"}]}'\n")
    reject.chmod(0o755)
    with pytest.raises(SpaceError) as err:
        verl_memory_inputs(space, [overrides], 1, str(reject))
    assert str(err.value) == f"{space.source}: memory estimate: override x: not hydra override syntax"


@needs_verl
def test_relative_paths_of_the_experiment_are_read_from_any_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 43 item 3: data and reward beside the experiment file, named relative to it. The loader resolves them
    the same from the experiment's directory, its parent and an unrelated one (absolute paths, stored so); real
    verl's validate passes once, from the parent with the file named relatively (neither cwd nor the file's name
    there is the experiment's directory: a path read against the cwd would miss). One validate, not three: what
    validate gets from any directory is the loaded experiment compared here."""
    space = arith_experiment(tmp_path, arith_rows(64, None))
    raw = yaml.safe_load(space.read_text())
    raw["overrides"]["data.train_files"] = "train.parquet"
    raw["overrides"]["data.val_files"] = "./val.parquet"
    (space.parent / "reward.py").write_text((ARITH / "reward.py").read_text())
    raw["overrides"]["reward.custom_reward_function.path"] = "reward.py"
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exp = space.parent
    wanted = {"data.train_files": str(exp / "train.parquet"), "data.val_files": str(exp / "val.parquet"),
              "reward.custom_reward_function.path": str(exp / "reward.py")}
    for cwd, name in ((exp, "experiment.yaml"), (tmp_path, "mine/experiment.yaml"), (elsewhere, str(space))):
        monkeypatch.chdir(cwd)
        loaded = load_space(name)
        for key, value in wanted.items():
            assert loaded.overrides[key] == value and loaded.raw["overrides"][key] == value, (cwd, key)
    res = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", "mine/experiment.yaml"], cwd=tmp_path,
                         env=cli_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "All checks passed" in res.stdout, (res.stdout, res.stderr)


@needs_verl  # worker checks verl's interpreter before it looks at the study's progress
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # open_study: set_metric_names
def test_a_worker_compares_its_space_file_s_relative_paths_beside_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The study as ``search --space exp/exp.yaml`` stores it from user/ (``reward.custom_reward_function.path:
    ./my_reward.py`` stored absolute, beside the file). ``worker`` and ``resume`` given that file, from another
    directory holding a decoy my_reward.py and from beside the file, read its relative path beside it and
    run the stored experiment (before: the path as written was compared with the stored absolute one, and every one
    was refused as a different experiment); a copy of the file elsewhere, whose ./my_reward.py is the decoy, is still
    refused. The study is at its target, so no trial runs: the check is what is tested."""
    user, elsewhere, studies = tmp_path / "user", tmp_path / "elsewhere", tmp_path / "studies"
    exp = user / "exp"
    exp.mkdir(parents=True)
    elsewhere.mkdir()
    raw = yaml.safe_load(CPU_SPACE.read_text())
    raw["overrides"]["reward.custom_reward_function.path"] = "./my_reward.py"
    raw["study"]["n_trials"] = 1
    (exp / "exp.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (exp / "my_reward.py").write_text("def compute_score(*args, **kwargs):\n    return 0.0\n")
    (elsewhere / "my_reward.py").write_text("raise SystemExit('the decoy')\n")
    (elsewhere / "exp.yaml").write_text((exp / "exp.yaml").read_text())  # the same text, beside the decoy
    monkeypatch.chdir(user)
    study = open_study(load_space("exp/exp.yaml"), "exp", f"sqlite:///{studies / 'exp.db'}")  # what search stores
    assert study.user_attrs[ATTR_SPACE]["overrides"]["reward.custom_reward_function.path"] == str(exp / "my_reward.py")
    dists: dict[str, optuna.distributions.BaseDistribution] = {
        "actor_lr": optuna.distributions.FloatDistribution(1e-5, 3e-3, log=True),
        "kl_coef": optuna.distributions.FloatDistribution(0.0, 0.5)}
    study.add_trial(optuna.trial.create_trial(params={"actor_lr": 1e-4, "kl_coef": 0.1}, distributions=dists,
                                              value=0.5))  # the study at its target: an accepted worker stops
    for cwd, command, given in ((elsewhere, "worker", str(exp / "exp.yaml")), (exp, "resume", "exp.yaml")):
        res = subprocess.run([sys.executable, "-m", "hpo", command, "--study", "exp", "--space", given,
                              "--studies-dir", str(studies)], cwd=cwd, env=cli_env(), capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0 and "already has 1 finished trials" in res.stdout, (cwd, given, res.stderr)
    res = subprocess.run([sys.executable, "-m", "hpo", "worker", "--study", "exp", "--space", "exp.yaml",
                          "--studies-dir", str(studies)], cwd=elsewhere, env=cli_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"error: study 'exp': its stored experiment (sha256 {study.user_attrs[ATTR_DIGEST][:12]}) sets "
        "trial.backend, trial.prepare_command, code keys, which run code on this host, and exp.yaml differs; pass "
        "--space FILE with the same experiment, or --trust-stored-experiment to run it anyway"], res.stderr
