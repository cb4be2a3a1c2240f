"""``study.fidelity.proxy`` refused before any study (issue 51): each bad proxy is one line naming the key, exit 2, and
no study is made. Run as a user runs ``search``, from a directory of their own: proxy overrides that set a tuned key,
a proxy model that does not exist (a local path, a built-in name the trainer does not know), a proxy whose tokenizer
is not the target's, and a proxy on a trainer whose backend names no model keys (an installed plugin)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.hpo.conftest import FAKE_TRAINER, PY, ROOT, cli_env

PLUGIN = '''
from hpo.backends import CommandBackend


class NoModelBackend(CommandBackend):
    """A trainer plugin that does not say which of its keys name the model."""

    name = "nomodel"
'''


def _model(tmp_path: Path, name: str, tokenizer: str = '{"model": {"vocab": {"a": 0}}}') -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text(tokenizer)
    (d / "config.json").write_text(json.dumps({"hidden_size": 64}))
    return d


def _search(tmp_path: Path, proxy: dict[str, Any], trial: dict[str, Any] | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    large = _model(tmp_path, "large")
    space = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 4, "actor_rollout_ref.model.path": str(large)},
        "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "study": {"n_trials": 4, "fidelity": {"proxy": proxy}},
        "trial": trial or {"backend": "verl_core", "command": [PY, str(FAKE_TRAINER), "train"]},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    return subprocess.run([PY, "-m", "hpo", "search", "--space", "exp.yaml", "--studies-dir", "studies"],
                          cwd=tmp_path, env=cli_env(**(env or {})), capture_output=True, text=True, timeout=120)


def _refused(res: subprocess.CompletedProcess[str], tmp_path: Path, *words: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "studies" / "exp.db").exists()  # no study


def test_proxy_overrides_that_set_a_tuned_key_are_refused(tmp_path: Path) -> None:
    res = _search(tmp_path, {"overrides": {"actor_rollout_ref.model.path": "builtin:tiny_arith_s", "fake.x": 0.5}})
    _refused(res, tmp_path, "exp.yaml: study.fidelity.proxy.overrides.fake.x:", "is tuned by parameter 'x'")


@pytest.mark.parametrize("path, says", [("./no/such/model", "'./no/such/model' does not exist"),
                                        ("builtin:tiny_arith_xl", "'builtin:tiny_arith_xl' is not a built-in model")])
def test_a_proxy_model_that_does_not_exist_is_refused(tmp_path: Path, path: str, says: str) -> None:
    res = _search(tmp_path, {"overrides": {"actor_rollout_ref.model.path": path}})
    _refused(res, tmp_path, "study.fidelity.proxy.overrides.actor_rollout_ref.model.path:", says,
             "the proxy's model must exist")


def test_a_proxy_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    other = _model(tmp_path, "other", '{"model": {"vocab": {"b": 0}}}')
    res = _search(tmp_path, {"overrides": {"actor_rollout_ref.model.path": str(other)}})
    _refused(res, tmp_path, "study.fidelity.proxy.overrides.actor_rollout_ref.model.path:",
             f"the proxy's tokenizer ({other}) is not the target's", "token ids would not mean the same")


def test_a_proxy_on_a_backend_that_names_no_model_keys_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"  # an installed plugin: its module and its distribution's entry point
    (site / "nomodel-0.1.dist-info").mkdir(parents=True)
    (site / "nomodel_hpo.py").write_text(PLUGIN)
    (site / "nomodel-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: nomodel\nVersion: 0.1\n")
    (site / "nomodel-0.1.dist-info" / "entry_points.txt").write_text(
        "[verl_hpo.backends]\nnomodel = nomodel_hpo:NoModelBackend\n")
    res = _search(tmp_path, {"overrides": {"model": "small"}},
                  {"backend": "nomodel", "command": [PY, str(FAKE_TRAINER), "train"]},
                  {"PYTHONPATH": f"{ROOT}:{site}"})
    _refused(res, tmp_path, "study.fidelity.proxy:", "trial.backend nomodel names no model keys")
