"""``study.fidelity.proxy`` against the trainer (``hpo/backends/_fidelity.py``), on the shipped
``search_spaces/kl_lr_proxy.yaml`` (a search on the small tiny_arith model for the large one): the proxy sets a key
that names the model, names one that exists and shares the target's tokenizer, keeps off the held-out split, and
names the critic's model where the target does (each refusal one line naming the key); a proxy run is the experiment
with the proxy's overrides after the fixed ones and each tuned value divided by its transfer factor."""

from __future__ import annotations

import pytest

from hpo.backends import backend_of, load_space, proxy_space, transfer_factors
from hpo.experiment import SpaceError

MODEL = "actor_rollout_ref.model.path"
PROXY = "study.fidelity.proxy"


@pytest.mark.parametrize(("proxy", "where", "said"), [
    ("{trainer.seed: 3}", "overrides", f"sets none of the keys that name the model ({MODEL}, critic.model.path): a "
                                       "proxy runs a smaller model of the target's family"),
    (f'{{{MODEL}: "builtin:nope"}}', f"overrides.{MODEL}", "'builtin:nope' is not a built-in model (known: "),
    (f'{{{MODEL}: "builtin:smollm2"}}', f"overrides.{MODEL}", "the proxy's tokenizer (builtin:smollm2) is not the "
                                                              "target's (builtin:tiny_arith_l): token ids would not "
                                                              "mean the same on both"),
    (f'{{{MODEL}: "builtin:tiny_arith_s", data.test_files: x}}', "overrides.data.test_files",
     "the held-out test split is for verl-hpo confirm only"),
])
def test_a_proxy_that_cannot_stand_for_the_target_is_one_line_naming_the_key(proxy: str, where: str,
                                                                             said: str) -> None:
    with pytest.raises(SpaceError) as err:
        load_space("kl_lr_proxy", [f"{PROXY}.overrides={proxy}"])
    assert f": {PROXY}.{where}: {said}" in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_target_critic_of_its_own_needs_the_proxy_s() -> None:
    with pytest.raises(SpaceError) as err:
        load_space("kl_lr_proxy", ["overrides.critic.model.path=builtin:tiny_arith_l"])
    assert str(err.value).endswith(f"{PROXY}.overrides: the target sets critic.model.path=builtin:tiny_arith_l; a "
                                   "proxy must set it too (its own model of the family, or null: the policy's)")
    both = f"{{{MODEL}: builtin:tiny_arith_s, critic.model.path: builtin:tiny_arith_s}}"
    load_space("kl_lr_proxy", ["overrides.critic.model.path=builtin:tiny_arith_l", f"{PROXY}.overrides={both}"])


@pytest.mark.parametrize(("rule", "factor"), [("{multiply: 2.0}", 2.0), ("{scale_by: hidden_ratio}", 64 / 256)])
def test_a_proxy_run_gets_the_proxy_s_model_and_each_value_over_its_factor(rule: str, factor: float) -> None:
    space = load_space("kl_lr_proxy", [f"{PROXY}.transfer={{actor_lr: {rule}}}"])
    factors = transfer_factors(space, backend_of(space))
    assert factors == {"actor_lr": pytest.approx(factor)}  # hidden_ratio: the proxy's hidden size over the target's
    run = proxy_space(space, factors)
    assert space.overrides[MODEL] == "builtin:tiny_arith_l" and run.overrides[MODEL] == "builtin:tiny_arith_s"
    assert space.study.fidelity.proxy is not None
    assert run.overrides == {**space.overrides, **space.study.fidelity.proxy.overrides}  # the proxy's after the fixed
    lr = next(o for o in run.trainer_overrides({"kl_coef": 0.1, "actor_lr": 1e-4})
              if o.startswith("actor_rollout_ref.actor.optim.lr="))
    assert float(lr.partition("=")[2]) == pytest.approx(1e-4 / factor)
