"""What the ``verl_core`` trainer calls things (``hpo/backends/verl_core/_names.py``): the user-code files its keys
name, the facts of its built-in models (the tiny_arith family's one tokenizer and its hidden sizes) asked without
torch, and its held-out split's metric names as a confirmation scores them."""

from __future__ import annotations

from hpo.backends import load_space
from hpo.backends._code_files import code_files
from hpo.backends.verl_core._names import CODE_ENTRY_KEYS, CODE_PATH_KEYS, builtin_facts
from hpo.study._confirm import heldout_metric_of, heldout_overrides, seed_keys


def test_the_user_code_files_its_keys_name() -> None:
    def files(key: str, value: object) -> list[str]:
        return code_files(key, value, CODE_PATH_KEYS, CODE_ENTRY_KEYS)  # verl_core's keys, as its backend passes them

    assert files("reward.custom_reward_function.path", "my/reward.py") == ["my/reward.py"]
    assert files("custom_reward_function.path", "r.py") == ["r.py"]
    assert files("evaluation.custom", ["tox=evals/tox.py:score", "len=/abs/len.py:fn"]) == ["evals/tox.py",
                                                                                           "/abs/len.py"]
    assert files("actor_rollout_ref.model.path", "m") == [] and files("evaluation.custom", "x") == []


def test_a_built_in_model_s_facts_come_from_verl_core_without_torch() -> None:
    small, large = builtin_facts("builtin:tiny_arith_s"), builtin_facts("builtin:tiny_arith_l")
    assert small is not None and large is not None and not small.missing
    assert small.tokenizer == large.tokenizer == ("family", "tiny_arith")  # one tokenizer at every size
    assert isinstance(small.hidden, int) and isinstance(large.hidden, int) and small.hidden < large.hidden
    smol = builtin_facts("builtin:smollm2")
    assert smol is not None and smol.tokenizer == ("family", "smollm2") and smol.hidden == 576
    unknown = builtin_facts("builtin:nope")
    assert unknown is not None and unknown.missing.startswith("'builtin:nope' is not a built-in model (known: ")
    assert builtin_facts("/models/mine") is None  # a directory: not verl_core's to say


def test_a_confirmation_scores_the_built_in_task_s_test_split_under_its_own_names() -> None:
    space = load_space("kl_lr")
    assert seed_keys(space) == ("trainer.seed",)
    assert heldout_overrides(space) == {"data.test_files": "builtin:arith"}
    assert heldout_metric_of(space) == "test/reward_mean"  # eval/ -> test/
