"""A verl experiment's relative paths are resolved once, the same from any working directory (issue 43 item 3):
the file's own against the file's directory, ``--override`` ones against the current directory; hub ids, ``~``,
``${oc.env:...}`` and absolute paths stay as they are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpo.backends import load_space

ROOT = Path(__file__).resolve().parents[3]


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
    assert space.overrides["critic.model.path"] == "${oc.env:HOME}/m" and space.trial.python == "~/venv/bin/python"
