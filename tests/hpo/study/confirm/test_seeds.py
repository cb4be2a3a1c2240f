"""Which seeds a confirmation run takes and what it sets (``hpo/study/_confirm/_seeds.py``): never a seed a tuning
trial ran or could have run with (a fixed seed, the trainer's default, every value of a tuned seed), from
``study.confirm.seed_base`` on; every seed key of the trainer's run set to it (verl has several), or the one
``study.confirm.seed_key`` names."""

from __future__ import annotations

from pathlib import Path

from hpo.backends import load_space
from hpo.study._confirm import confirm_seeds, seed_key, seed_keys, seed_overrides, tuning_seeds
from tests.hpo.backends.verl.conftest import SPACE_FILE, load_verl_space
from tests.hpo.conftest import fake_space


def test_confirmation_seeds_never_overlap_tuning_seeds(tmp_path: Path) -> None:
    fixed = load_space(str(fake_space(tmp_path, overrides={"trainer.seed": 1001})), check=False)
    assert tuning_seeds(fixed) == {1001}
    assert confirm_seeds(fixed, 3) == [1000, 1002, 1003]
    tuned = load_space(str(fake_space(tmp_path, name="tuned", params={
        "x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0},
        "seed": {"key": "trainer.seed", "type": "int", "low": 998, "high": 1004}})), check=False)
    assert confirm_seeds(tuned, 2) == [1005, 1006]
    other = load_space(str(fake_space(tmp_path, name="other", overrides={"run.seed": 1000},
                                      study={"confirm": {"seed_key": "run.seed", "seed_base": 7}})), check=False)
    assert confirm_seeds(other, 2) == [7, 8]


def test_a_verl_confirmation_run_varies_every_seed_of_the_run() -> None:
    """verl has several seeds (data sampler, vLLM, actor/critic mini-batch shuffling); confirm sets them all, and
    skips every seed a tuning run used, verl's defaults (42) included."""
    space = load_verl_space(SPACE_FILE)
    assert space.overrides["data.seed"] == 42  # the shipped space pins the sampler (verl's default: unseeded)
    keys = ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed",
            "critic.data_loader_seed")
    assert seed_keys(space) == keys and seed_key(space) == "data.seed"
    assert seed_overrides(space, 1003) == dict.fromkeys(keys, 1003)
    assert tuning_seeds(space) == {42}
    unpinned = load_verl_space(SPACE_FILE, overrides={k: v for k, v in space.overrides.items() if k != "data.seed"},
                               study={**space.raw["study"], "confirm": {"seed_base": 41}})
    assert tuning_seeds(unpinned) == {42} and confirm_seeds(unpinned, 2) == [41, 43]  # rollout.seed's default
    one = load_verl_space(SPACE_FILE, study={**space.raw["study"], "confirm": {"seed_key": "data.seed"}})
    assert seed_overrides(one, 7) == {"data.seed": 7}
