"""``verl-hpo best --format command`` prints what the best trial ran, so that it runs when pasted (issue 52 item 9):
the trial's interpreter, every override (verl's CPU platform's included), the environment the trial needed (the CPU
plugin's, ``trial.env``), and no secret (a secret is ``NAME="${NAME:?}"``: the user's shell supplies it, or stops
naming it). Checked against what the driver's own code planned for the trial, by pasting the line into ``bash -c``
from a directory of the user's, and (real verl installed) by verl starting on the CPU platform from it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from optuna.trial import create_trial

from hpo.backends import Attempt, backend_of, load_space
from hpo.backends.verl._cpu import CPU_ENV, CPU_OVERRIDES, PLUGIN_MODULE
from hpo.backends.verl._launch import override_key
from hpo.study._optuna import open_study
from hpo.study._trial_files import trial_env, write_trial_files
from tests.hpo.conftest import FAKE_TRAINER, PY, ROOT, cli_env, fake_space, load

VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
TOKEN, KEY = "hf_T0ken-best-cmd-77", "k3y-best-cmd-secret-41"
SECRET_VAR = "VERL_HPO_SECRET_FAKE_HUB_TOKEN"
# what the driver names and places for its own trial: not in a command a user runs elsewhere
PLACES = ("trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir", "trainer.resume_mode",
          "trainer.resume_from_path", "hydra.run.dir")


def hpo(args: list[str], cwd: Path, studies: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m hpo ARGS`` as a user runs it: from ``cwd``, outside the repository."""
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(studies)], cwd=cwd, env=cli_env(**env),
                          capture_output=True, text=True, timeout=300)


def user_shell(**extra: str) -> dict[str, str]:
    """A user's shell: no secret exported, no PYTHONPATH of the tests', nothing of a trial's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MY_API_KEY", SECRET_VAR) and not k.startswith("VERL_")}
    return {**env, **extra}


def paste(line: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=user_shell(**env), capture_output=True, text=True,
                          timeout=120)


def words(line: str) -> tuple[list[str], dict[str, str], list[str]]:
    """(unset, assignments, command) of ``env -u A NAME=value ... command``."""
    argv = shlex.split(line)
    assert argv[0] == "env", line
    unset, assigned, i = [], {}, 1
    while argv[i] == "-u" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[i]):
        if argv[i] == "-u":
            unset.append(argv[i + 1])
            i += 2
        else:
            name, _, value = argv[i].partition("=")
            assigned[name] = value
            i += 1
    return unset, assigned, argv[i:]


# ----------------------------------------------------------------------------- verl on the CPU
def cpu_verl_study(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A user's own verl experiment whose trials run on the CPU (``gpus_per_trial: 0``), with a ``trial.env`` of
    its own (a plain value, a module for verl's hook, a secret) and a secret override; its study holds one finished
    trial, planned and recorded by the driver's own code (``Backend.plan``, ``command.json``). Returns the studies
    directory, the user's directory and the trial's launch (argv, env)."""
    home = tmp_path / "user"
    (home / "data").mkdir(parents=True)
    raw = {
        "config": "ppo_trainer",
        "overrides": {
            "algorithm.adv_estimator": "grpo", "data.train_files": str(home / "data" / "train.parquet"),
            "data.val_files": str(home / "data" / "val.parquet"), "data.train_batch_size": 4,
            "data.max_prompt_length": 32, "data.max_response_length": 16,
            "actor_rollout_ref.model.path": str(home / "model"), "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.n": 2,
            "trainer.total_training_steps": 2, "trainer.logger": ["console", "tensorboard"],
            "+fake.hub_token": TOKEN},
        "params": {"actor_lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float", "low": 1e-5,
                                "high": 1e-3, "log": True}},
        "objective": {"metric": "val-core/mine/acc/mean@1", "direction": "maximize"},
        "study": {"n_trials": 1},
        "trial": {"backend": "verl", "python": str(VERL_PY), "gpus_per_trial": 0,
                  "env": {"MY_FLAG": "two words", "VERL_USE_EXTERNAL_MODULES": "json", "MY_API_KEY": KEY}},
    }
    path = home / "mine.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    space = load_space(str(path), check=False)
    studies = tmp_path / "studies"
    trials_dir = studies / "mine" / "trials"
    trial_dir = trials_dir / "0"
    trial_dir.mkdir(parents=True)
    values = {"actor_lr": 3.0e-4}
    launch = backend_of(space).plan(Attempt(space=space, study="mine", trial_dir=trial_dir, trials_dir=trials_dir,
                                            values=values, cwd=str(home), env=trial_env(space, "mine", 0, {}, [])))
    write_trial_files(space, str(home), trial_dir, launch.argv, launch.env, launch.config, values)
    study = open_study(space, "mine", f"sqlite:///{studies / 'mine.db'}")
    study.add_trial(create_trial(params=values, distributions={"actor_lr": space.params[0].distribution()},
                                 value=0.5, user_attrs={"trial_dir": str(trial_dir)}))
    return studies, home, {"argv": launch.argv, "env": launch.env}


def test_the_command_of_a_cpu_verl_trial_is_what_it_ran_and_shows_no_secret(tmp_path: Path) -> None:
    studies, home, trial = cpu_verl_study(tmp_path)
    res = hpo(["best", "--study", "mine", "--format", "command"], home, studies)
    assert res.returncode == 0, res.stderr
    assert TOKEN not in res.stdout + res.stderr and KEY not in res.stdout + res.stderr
    line = res.stdout.strip().splitlines()[-1]
    unset, env, cmd = words(line)
    # the interpreter with verl, and verl's own entry point (pasted as `python -m ...`: "No module named 'verl'")
    assert cmd[:3] == [str(VERL_PY), "-m", "verl.trainer.main_ppo"] == trial["argv"][:3]
    # every override the trial ran, the CPU platform's and its devices included, but the driver's own places and names
    ran = [a for a in trial["argv"][3:] if override_key(a) not in (*PLACES, "trainer.logger")]
    assert [a for a in cmd[3:] if override_key(a) != "trainer.logger"] == ran
    for key, value in CPU_OVERRIDES.items():
        assert f"{key}={value}" in cmd, key
    assert "trainer.n_gpus_per_node=1" in cmd and "actor_rollout_ref.actor.optim.lr=0.0003" in cmd
    assert "trainer.logger=[console,tensorboard]" in cmd  # the user's loggers; not the file that fed the driver
    assert f"+fake.hub_token='${{oc.env:{SECRET_VAR}}}'" in cmd  # the secret override: a reference, as in the trial
    # the environment the trial had beyond the user's shell: the plugin (after the user's own module), the platform,
    # trial.env; CUDA_VISIBLE_DEVICES gone (Ray refuses its logical GPU under an empty one)
    for name in (*CPU_ENV, "VERL_USE_EXTERNAL_MODULES", "MY_FLAG"):
        assert env[name] == trial["env"][name], name
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"json,{PLUGIN_MODULE}" and env["MY_FLAG"] == "two words"
    assert "CUDA_VISIBLE_DEVICES" in unset and "CUDA_VISIBLE_DEVICES" not in trial["env"]
    # the secrets: the user's shell supplies them, by name
    assert 'MY_API_KEY="${MY_API_KEY:?}"' in line and f'{SECRET_VAR}="${{{SECRET_VAR}:?}}"' in line
    assert not {"VERL_FILE_LOGGER_PATH", "RAY_AUTH_TOKEN", "TMPDIR", "RAY_TMPDIR"} & set(env)  # the trial's places
    # pasted without the secrets: the shell stops, naming one, before anything runs
    stopped = paste(line, home)
    assert stopped.returncode != 0 and "parameter null or not set" in stopped.stderr, stopped.stderr
    assert "MY_API_KEY" in stopped.stderr and "ray init" not in stopped.stdout


@pytest.mark.slow  # verl's import and hydra's composition in verl's interpreter: ~15-30 s on 2 cores
@pytest.mark.skipif(not VERL_PY.exists(), reason="real verl is not installed: run `make install-verl`")
def test_the_pasted_command_starts_real_verl_on_the_cpu_platform(tmp_path: Path) -> None:
    """The line pasted into a user's shell (from the user's own directory, the secrets exported) runs verl 0.9.1's
    ``main_ppo``: the plugin loads (its platform line), hydra composes every override, verl's ``validate_config``
    passes and verl asks Ray for the one logical GPU of the CPU platform. It is stopped there: no Ray is started."""
    studies, home, _ = cpu_verl_study(tmp_path)
    res = hpo(["best", "--study", "mine", "--format", "command"], home, studies)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    scratch = tempfile.mkdtemp(prefix="vhb", dir="/tmp")  # short: Ray's socket paths
    env = user_shell(MY_API_KEY=KEY, **{SECRET_VAR: TOKEN}, PYTHONUNBUFFERED="1", TMPDIR=scratch, RAY_TMPDIR=scratch)
    proc = subprocess.Popen(["bash", "-c", line], cwd=home, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    started = time.monotonic()
    try:
        assert proc.stdout is not None
        for text in proc.stdout:  # ends when verl exits (a failure) or is stopped below
            out.append(text)
            if text.startswith("ray init kwargs:"):
                os.killpg(proc.pid, signal.SIGKILL)  # verl would start Ray and train from here
                break
            if time.monotonic() - started > 240:
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for p in psutil.process_iter(["pid", "cmdline"]):  # anything of Ray's that got started under our scratch
            if any(scratch in part for part in p.info["cmdline"] or []):
                p.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    text = "".join(out)
    assert "No module named" not in text, text[-3000:]
    assert "Platform override from VERL_PLATFORM: cpu" in text, text[-3000:]  # the plugin, through verl's hook
    kwargs = next((t for t in out if t.startswith("ray init kwargs:")), "")
    assert "'num_gpus': 1" in kwargs and "'num_cpus': 16" in kwargs, text[-3000:]


# ----------------------------------------------------------------------------- a custom command
def test_the_command_of_a_custom_trainer_runs_when_pasted(tmp_path: Path) -> None:
    """``trial.command: [python, ...]``: the trial ran the driver's interpreter with ``trial.env``; the printed line
    does the same, pasted in the user's directory, and takes the secrets from the user's shell."""
    dump = tmp_path / "seen.json"
    space = fake_space(tmp_path, name="own", overrides={"trainer.total_training_steps": 2, "trainer.test_freq": 1,
                                                        "fake.step_s": 0.0, "fake.hub_token": TOKEN,
                                                        "fake.env_file": str(dump)},
                       study={"n_trials": 1, "pruner": {"type": "none"}},
                       trial={"command": ["python", str(FAKE_TRAINER), "train"],
                              "env": {"FAKE_KEY": "plain value", "MY_API_KEY": KEY}})
    studies = tmp_path / "studies"
    assert hpo(["search", "--space", str(space)], tmp_path, studies).returncode == 0
    trial_saw = json.loads(dump.read_text())["env"]
    dump.unlink()
    res = hpo(["best", "--study", "own", "--format", "command"], tmp_path, studies)
    assert res.returncode == 0, res.stderr
    assert TOKEN not in res.stdout + res.stderr and KEY not in res.stdout + res.stderr
    line = res.stdout.strip().splitlines()[-1]
    _, env, cmd = words(line)
    assert cmd[0] == PY and env["FAKE_KEY"] == "plain value"  # `python` was the driver's interpreter
    x = load(studies, "own").best_trial.params["x"]
    pasted = paste(line, tmp_path, MY_API_KEY=KEY, **{SECRET_VAR: TOKEN})
    assert pasted.returncode == 0, pasted.stderr
    seen = json.loads(dump.read_text())
    assert seen["env"] == trial_saw  # FAKE_KEY from the line, the secrets from the shell, as the trial had them
    assert f"fake.x={x!r}" in seen["argv"] and f"fake.hub_token=${{oc.env:{SECRET_VAR}}}" in seen["argv"]


def test_a_trial_that_ran_on_gpus_gets_verl_s_gpu_command(tmp_path: Path) -> None:
    """The same experiment's trial handed a GPU (its ``command.json``: ``CUDA_VISIBLE_DEVICES=3``): no CPU platform,
    whatever this host has."""
    from hpo.reporting._command_line import command_for

    studies, home, _ = cpu_verl_study(tmp_path)
    space = load_space(str(home / "mine.yaml"), check=False)
    trial_dir = studies / "mine" / "trials" / "0"
    record = json.loads((trial_dir / "command.json").read_text())
    (trial_dir / "command.json").write_text(json.dumps({**record, "env": {"CUDA_VISIBLE_DEVICES": "3"}}))
    line = command_for(space, ["trainer.total_training_steps=2"], trial_dir)
    assert "trainer.device=cpu" not in line and "VERL_PLATFORM" not in line and "trainer.n_gpus_per_node=1" in line
    # a command.json that is not the driver's form is passed over: the trial's experiment says CPU
    (trial_dir / "command.json").write_text(json.dumps({**record, "env": {"CUDA_VISIBLE_DEVICES": "$(reboot)"}}))
    assert "trainer.device=cpu" in command_for(space, [], trial_dir)
