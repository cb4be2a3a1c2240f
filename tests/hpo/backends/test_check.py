"""An experiment as the driver runs it (``hpo/backends/_check.py``, through :func:`hpo.backends.load_space` and
:func:`~hpo.backends.stored_space`): the trainer named in the registry (none named: the default), the trainer's
defaults filled in (its command, prepare step, objective), a search kept off the held-out split, a strategy or study
kind the trainer cannot run refused with the trainers that can, and a throughput study's keys and length checked.
Each refusal is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.backends import DEFAULT_BACKEND, known_backends, load_space, stored_space
from hpo.experiment import SpaceError
from tests.hpo.conftest import fake_space


def test_the_trainer_s_defaults_are_filled_in_and_a_stored_space_gets_them_again(tmp_path: Path) -> None:
    space = load_space("kl_lr", check=False)
    assert space.trial.backend == DEFAULT_BACKEND == "verl_core"  # kl_lr names no trainer
    assert space.trial.command == ("python", "-m", "verl_core", "train")
    assert space.trial.prepare_command == ("python", "-m", "verl_core", "prepare")
    stored = dict(space.raw)
    stored["trial"] = {k: v for k, v in (stored.get("trial") or {}).items() if k not in ("command", "backend")}
    again = stored_space(stored, "stored", "kl_lr")  # stored before the command moved into its backend
    assert again.trial.command == space.trial.command and again.trial.backend == "verl_core"
    custom = load_space(str(fake_space(tmp_path)), check=False)
    assert custom.trial.command[1].endswith("fake_trainer.py") and custom.objective.primary_metric == \
        "eval/reward_mean"


@pytest.mark.parametrize(("name", "override", "said"), [
    ("kl_lr", "trial.backend=nope", "trial.backend: 'nope' is not one of "),
    ("kl_lr", "overrides.data.test_files=builtin:arith", "overrides.data.test_files: the held-out test split is for "
                                                         "verl-hpo confirm only (a search never sees it); set "
                                                         "study.confirm.test_files instead"),
    ("kl_lr", "params.tf={key: data.test_files, type: categorical, choices: [a, b]}",
     "params.tf.key: data.test_files cannot be tuned: the test split is for verl-hpo confirm only"),
    ("fake", "study.strategy=pbt", "study.strategy: pbt needs a trainer that resumes its checkpoints (verl_core or "
                                   "verl); trial.backend is verl_core with a command of its own (trial.command)"),
    ("fake", "study.confirm.test_metric=test/reward_mean", "study.confirm.test_metric: 'test/reward_mean' needs "
                                                           "held-out data for confirmation runs "
                                                           "(study.confirm.test_files)"),
    ("throughput_cpu", "params.lr={key: actor_rollout_ref.actor.optim.lr, type: float, low: 1.0e-6, high: 1.0e-4}",
     "params.lr.key: 'actor_rollout_ref.actor.optim.lr' changes what the model learns, not only how fast; a "
     "throughput study tunes only verl_core's math-neutral keys"),
    ("throughput_cpu", "study.throughput.warmup_steps=100", "study.throughput.warmup_steps: 100: a trial runs 5 "
                                                            "step(s) (trainer.total_training_steps), so no step "
                                                            "would be measured; the warm-up must be shorter"),
])
def test_what_the_trainer_cannot_run_is_one_line_naming_the_field(tmp_path: Path, name: str, override: str,
                                                                  said: str) -> None:
    source = str(fake_space(tmp_path)) if name == "fake" else name
    with pytest.raises(SpaceError) as err:
        load_space(source, [override])
    text = str(err.value)
    assert "\n" not in text and f": {said}" in text, text
    if override == "trial.backend=nope":
        assert all(n in text for n in known_backends())
