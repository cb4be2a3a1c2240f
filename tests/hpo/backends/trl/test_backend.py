"""trial.backend: trl, the driver's side (``hpo/backends/trl/_backend.py``): keys and their checks, one attempt's
overrides, argv and files, confirmation seeds and the held-out split, and a user's mistakes named by their real cause
from a directory of their own. Real experiment files, the real launcher for GRPOConfig's own checks (TRL's
interpreter: the driver's .venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpo.backends import Attempt, backend_of, load_space
from hpo.backends.trl import LAUNCHER, TrlBackend
from hpo.experiment import Space, SpaceError
from tests.hpo.conftest import ROOT, cli_env

SPACE = "trl_grpo_arith"
SHIPPED = ROOT / "search_spaces" / "trl_grpo_arith.yaml"
VALUES = {"learning_rate": 1e-05, "beta": 0.05, "temperature": 1.0, "num_generations": 8}


def _space(*overrides: str) -> Space:
    return load_space(SPACE, list(overrides), ROOT / "search_spaces")


def _error(*overrides: str, thorough: bool = False) -> str:
    with pytest.raises(SpaceError) as err:
        load_space(SPACE, list(overrides), ROOT / "search_spaces", thorough=thorough)
    return str(err.value)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the experiment names its config relative to the repo


def test_the_registry_gives_the_trl_backend() -> None:
    assert isinstance(backend_of(_space()), TrlBackend)


def test_configure_merges_config_fixed_and_tuned_keys(tmp_path: Path) -> None:
    cfg = TrlBackend().configure(Attempt(space=_space(), values=VALUES, trial_dir=tmp_path / "3"))
    assert cfg.overrides[:3] == ["max_steps=12", "eval_steps=3", "seed=1"]
    assert "learning_rate=1e-05" in cfg.overrides and cfg.overrides[-1] == "data.test_files=null"  # never the test
    assert cfg.total_steps == 12
    text = yaml.safe_load(cfg.config_text)
    assert text["learning_rate"] == pytest.approx(1e-05) and text["num_generations"] == 8
    assert text["model.path"] == "builtin:tiny_arith" and text["data.test_files"] is None
    assert text["output_dir"] == str((tmp_path / "3").absolute() / "checkpoints")
    low = TrlBackend().configure(Attempt(space=_space(), values={**VALUES, "learning_rate": 1e-06},
                                         trial_dir=tmp_path / "4"))
    assert "learning_rate=1e-06" in low.overrides and low.loaded["learning_rate"] == 1e-06  # a float, not a str


def test_a_confirmation_run_replaces_the_seed_and_scores_the_test_split(tmp_path: Path) -> None:
    from hpo.study._confirm import seed_keys

    backend, space = TrlBackend(), _space()
    confirmation = backend.confirmation
    assert confirmation is not None
    extra = {"seed": 1000, **confirmation.heldout_overrides(space)}
    cfg = backend.configure(Attempt(space=space, values=VALUES, trial_dir=tmp_path, extra=extra))
    assert "seed=1" not in cfg.overrides and "seed=1000" in cfg.overrides
    assert "data.test_files=builtin:arith" in cfg.overrides and "data.test_files=null" not in cfg.overrides
    assert confirmation.seed_keys == ("seed",) and seed_keys(space) == ("seed",)
    assert confirmation.default_seed(space, "seed") == 1  # the experiment's fixed seed
    assert confirmation.default_seed(_space("overrides.seed=null"), "seed") is None
    assert confirmation.heldout_metric(space) == "test/reward_mean"
    assert seed_keys(_space("study.confirm.seed_key=data_seed")) == ("data_seed",)


def test_launch_runs_the_launcher_in_trls_interpreter(tmp_path: Path) -> None:
    backend, space = TrlBackend(), _space()
    cfg = backend.configure(Attempt(space=space, values=VALUES, trial_dir=tmp_path))
    # a retry (attempt 1) whose chain left no checkpoint, started from a given checkpoint: plan's one call
    launch = backend.plan(Attempt(space=space, study="s", trial_dir=tmp_path, trials_dir=tmp_path / "trials",
                                  history=(3,), values=VALUES, cwd=str(ROOT), env={"CUDA_VISIBLE_DEVICES": ""},
                                  start=tmp_path / "checkpoints" / "checkpoint-6"))
    assert launch.resume is None and launch.metrics == tmp_path / "metrics.attempt1.jsonl"
    assert launch.config.overrides == cfg.overrides and launch.config.config_text == cfg.config_text
    assert launch.argv[:6] == [sys.executable, str(LAUNCHER), "--config", space.config, "--metrics-file",
                               str(tmp_path / "metrics.attempt1.jsonl")]
    assert launch.argv[6:-2] == cfg.overrides
    assert launch.argv[-2:] == [f"output_dir={tmp_path.absolute() / 'checkpoints'}",
                                f"resume_from_checkpoint={tmp_path.absolute() / 'checkpoints' / 'checkpoint-6'}"]
    assert launch.env["HF_HUB_OFFLINE"] == "1" and launch.env["CUDA_VISIBLE_DEVICES"] == ""
    assert backend.metrics_path(tmp_path, 0) == tmp_path / "metrics.jsonl"
    prepare = backend.prepare_argv(space)
    assert prepare is not None and prepare[:3] == [sys.executable, str(LAUNCHER), "--prepare"]


@pytest.mark.parametrize(("override", "message"), [
    ("learning_rat=0.1", "overrides.learning_rat: unknown GRPOConfig field (trl 1.16.0) 'learning_rat'; did you mean "
                         "'learning_rate'?"),
    ("data.val_file=x", "unknown launcher key (model.*, data.*, reward.*, eval.*, runtime.*) 'data.val_file'; did you "
                        "mean 'data.val_files'?"),
    ("params.learning_rate.key=lr", "params.learning_rate.key: unknown GRPOConfig field"),
    ("output_dir=/tmp/x", "overrides.output_dir: output_dir is set by the driver"),
    ("study.baseline.betta=0", "study.baseline.betta: unknown GRPOConfig field"),
    ("overrides.max_steps=null", "overrides.max_steps: a trial needs a positive max_steps"),
    ("objective.metric=eval/rewrd_mean", "objective.metric: unknown metric 'eval/rewrd_mean'"),
    ("data.test_files=builtin:arith", "the held-out test split is for verl-hpo confirm only"),
    ("trial.command=[python, train.py]", "trial.command: not used with trial.backend: trl"),
    ("config=search_spaces/trl_configs/missing.yaml", "config: cannot read"),
])
def test_check_refuses_in_one_line(override: str, message: str) -> None:
    text = _error(override)
    assert message in text and "\n" not in text
    assert text.startswith(f"--override '{override}'")


def test_check_names_a_bad_key_of_the_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "search_spaces/trl_configs/grpo_arith.yaml").read_text() + "num_generation: 4\n")
    assert f"config: {bad}: unknown GRPOConfig field (trl 1.16.0) 'num_generation'; did you mean " \
           "'num_generations'?" in _error(f"config={bad}")


def test_verify_builds_each_corner_with_trls_own_checks() -> None:
    text = _error("params.num_generations.choices=[3,4]", thorough=True)
    assert "params.num_generations: rejected by TRL with num_generations=3" in text
    assert "must be divisible by num_generations (3)" in text
    # that the shipped experiment passes the same check (thorough: its corners through TRL's interpreter, one TRL
    # import of ~20 s) is test_the_experiment_finds_its_own_config_from_another_directory's `validate`


# ----------------------------------------------------------------------------- from a directory of the user's own
# A TRL experiment's mistakes named by their real cause (issue 44 item 10): an interpreter that is not one, a key whose
# value breaks GRPOConfig, a model path that is not a model, and the experiment's own config file found beside it when
# the experiment is given by its absolute path. One line, exit 2, no study.
def _search(cwd: Path, *override: str) -> subprocess.CompletedProcess[str]:
    args = [a for o in override for a in ("--override", o)]
    return subprocess.run([sys.executable, "-m", "hpo", "search", "--space", str(SHIPPED), *args, "--studies-dir",
                           str(cwd / "studies")], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=300)


def _one_line(proc: subprocess.CompletedProcess[str], cwd: Path, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr
    assert not (cwd / "studies").exists()


def test_the_experiment_finds_its_own_config_from_another_directory(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", str(SHIPPED)], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("python, needle", [("/etc/passwd", "cannot run /etc/passwd (Permission denied)"),
                                            ("/bin/true", "/bin/true is not a Python interpreter")])
def test_an_interpreter_that_is_not_one_is_named(tmp_path: Path, python: str, needle: str) -> None:
    _one_line(_search(tmp_path, f"trial.python={python}"), tmp_path, "trial.python", needle)


def test_a_value_that_breaks_grpoconfig_names_its_key(tmp_path: Path) -> None:
    _one_line(_search(tmp_path, "deepspeed=/etc/passwd"), tmp_path, "overrides.deepspeed", "rejected by TRL")


def test_a_model_path_that_is_not_a_model_is_refused_before_the_study(tmp_path: Path) -> None:
    """It was found by the prepare step, after the study existed (issue 44 item 6)."""
    _one_line(_search(tmp_path, f"model.path={tmp_path}"), tmp_path, "overrides.model.path",
              "not a local Hugging Face model directory (no config.json)")
