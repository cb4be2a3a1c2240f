"""The ``verl_core`` trainer as the study loop meets it (``hpo/backends/verl_core/_backend.py``), through the names its
callers use: the seed a search trial runs with (fixed, else its config's), the host's kept baseline runs keyed by the
trainer's code and the experiment's config file, and the study's one-off prepare step, verl_core's own with the
experiment's fixed overrides."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import yaml

from hpo.backends import load_space
from hpo.study._confirm import baseline_key, confirm_seeds, tuning_seeds
from hpo.study._trial_files import prepare
from tests.hpo.conftest import ROOT
from tests.hpo.study.test_trial import Recorded
from verl_core.config import load_config

KL_LR = ROOT / "search_spaces" / "kl_lr.yaml"


def kl_lr_variant(tmp_path: Path, **changes: object) -> Path:
    """search_spaces/kl_lr.yaml with top-level sections replaced, in ``tmp_path``."""
    raw = yaml.safe_load(KL_LR.read_text())
    raw.update(changes)
    path = tmp_path / "kl_lr.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_search_trial_s_seed_is_the_fixed_one_else_its_config_s(tmp_path: Path) -> None:
    assert tuning_seeds(load_space("kl_lr")) == {1}  # trainer.seed: 1
    raw = yaml.safe_load(KL_LR.read_text())
    unfixed = {k: v for k, v in raw["overrides"].items() if k != "trainer.seed"}
    space = load_space(str(kl_lr_variant(tmp_path, overrides=unfixed)))
    default = load_config("tiny_arith", []).trainer.seed
    assert tuning_seeds(space) == {default} and default not in confirm_seeds(space, 3)


def test_a_kept_baseline_run_is_keyed_by_the_experiment_s_config_file(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "verl_core" / "configs" / "tiny_arith.yaml", config)
    raw = yaml.safe_load(KL_LR.read_text())
    space_file = kl_lr_variant(tmp_path, config=str(config), study={**raw["study"], "baseline": {
        "algorithm.kl_ctrl.kl_coef": 0.05, "actor_rollout_ref.actor.optim.lr": 1e-5}})
    key = baseline_key(load_space(str(space_file)))
    assert key is not None and key == baseline_key(load_space(str(space_file)))
    config.write_text(config.read_text() + "\n# edited\n")  # the same keys: a different file, maybe other code
    assert baseline_key(load_space(str(space_file))) not in (None, key)


def test_the_prepare_step_is_verl_core_s_with_the_fixed_overrides(tmp_path: Path, tiny_model_dir: Path) -> None:
    progress = Recorded()
    prepare(load_space("kl_lr"), tmp_path / "study", str(ROOT), progress, threading.Event())
    ((call, line),) = progress.calls
    assert call == "note" and line.startswith("preparing model and data: -m verl_core prepare --config tiny_arith "
                                              "trainer.total_training_steps=60 "), line
    assert (tmp_path / "study" / "prepare" / "stdout.log").read_text().strip().endswith("ready")
