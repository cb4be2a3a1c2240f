"""Secrets (issue 44 item 5): a fixed override or ``trial.env`` variable named for a token, password, secret or API key
reaches the trial through its environment, never its argv, and is in none of: the driver's output, ``command.json``,
``config.yaml``, the study's storage, the dashboard, ``best --format command``. A resume reads it from the driver's
environment, and says so in one line when it is not there. A secret is never tuned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpo.experiment._secrets import is_secret_key, masked_raw, secret_env_name
from tests.hpo.conftest import fake_space, run_cli

TOKEN, KEY = "hf_s3cr3tT0ken-XYZ", "k3y-4BC-secret-value"


@pytest.mark.parametrize("key, secret", [
    ("hub_token", True), ("HF_TOKEN", True), ("wandb.api_key", True), ("db_password", True), ("x.secret", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("pad_token", False), ("eos_token", False), ("max_num_batched_tokens", False),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", False), ("tokenizer", False), ("use_token_level", False)])
def test_which_keys_name_a_secret(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_the_stored_experiment_holds_references_not_values() -> None:
    raw = {"overrides": {"hub_token": TOKEN, "data.seed": 1, "api_token": "${oc.env:MINE}"},
           "trial": {"env": {"MY_API_KEY": KEY, "OMP_NUM_THREADS": "1"}}}
    stored = masked_raw(raw)
    assert stored["overrides"] == {"hub_token": "${oc.env:VERL_HPO_SECRET_HUB_TOKEN}", "data.seed": 1,
                                   "api_token": "${oc.env:MINE}"}
    assert stored["trial"]["env"] == {"MY_API_KEY": "***", "OMP_NUM_THREADS": "1"}
    assert raw["overrides"]["hub_token"] == TOKEN  # a copy
    assert secret_env_name("+a.hub-token") == "VERL_HPO_SECRET_A_HUB_TOKEN"


def test_a_secret_reaches_the_trial_and_nothing_else(tmp_path: Path) -> None:
    studies, dump = tmp_path / "studies", tmp_path / "env.json"
    space = fake_space(tmp_path, name="sec", overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2,
                                                        "fake.step_s": 0.01, "fake.hub_token": TOKEN,
                                                        "fake.env_file": str(dump)},
                       study={"n_trials": 1, "pruner": {"type": "none"}}, trial={"env": {"MY_API_KEY": KEY}})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    seen = json.loads(dump.read_text())
    assert "fake.hub_token=${oc.env:VERL_HPO_SECRET_FAKE_HUB_TOKEN}" in seen["argv"]
    assert seen["env"]["VERL_HPO_SECRET_FAKE_HUB_TOKEN"] == TOKEN and seen["env"]["MY_API_KEY"] == KEY
    best = run_cli(["best", "--study", "sec", "--format", "command"], studies)
    assert best.returncode == 0
    assert run_cli(["dashboard", "--study", "sec"], studies).returncode == 0
    for text in (res.stdout, res.stderr, best.stdout, best.stderr):
        assert TOKEN not in text and KEY not in text
    for path in studies.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and KEY.encode() not in data, path  # db, command.json, config.yaml, html

    resumed = run_cli(["resume", "--study", "sec", "--n-trials", "2"], studies)  # not exported here: one line
    assert resumed.returncode == 2 and len(resumed.stderr.strip().splitlines()) == 1, resumed.stderr
    assert "VERL_HPO_SECRET_FAKE_HUB_TOKEN (overrides.fake.hub_token)" in resumed.stderr
    assert "MY_API_KEY (trial.env.MY_API_KEY)" in resumed.stderr
    resumed = run_cli(["resume", "--study", "sec", "--n-trials", "2"], studies,
                      VERL_HPO_SECRET_FAKE_HUB_TOKEN=TOKEN, MY_API_KEY=KEY)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(dump.read_text())["env"]["VERL_HPO_SECRET_FAKE_HUB_TOKEN"] == TOKEN


def test_a_secret_is_never_tuned(tmp_path: Path) -> None:
    space = fake_space(tmp_path, params={"t": {"key": "fake.api_token", "type": "categorical", "choices": ["a", "b"]}})
    res = run_cli(["search", "--space", str(space)], tmp_path / "studies")
    assert res.returncode == 2 and "params.t.key" in res.stderr and "names a secret" in res.stderr
