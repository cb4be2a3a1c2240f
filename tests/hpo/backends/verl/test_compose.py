"""The script that composes and validates verl configs in verl's own interpreter (``hpo/backends/verl/_compose.py``,
``<verl's python> _compose.py < request.json``): its reply is the one line on stdout whatever verl prints, an
interpreter without verl says so, anything unexpected is still one line, and with real verl 0.9.1 each corner is
composed (the selected keys' values, or the override verl's config refuses named). What the driver makes of the
replies: ``test_check.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpo.backends.verl import COMPOSE_SCRIPT
from hpo.backends.verl._compose import _culprit
from tests.hpo.backends.verl.conftest import VERL_PY, needs_verl


def compose(python: str | Path, request: str | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The script's reply to ``request`` (its only stdout line) and its stderr."""
    text = request if isinstance(request, str) else json.dumps(request)
    res = subprocess.run([str(python), str(COMPOSE_SCRIPT)], input=text, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (line,) = res.stdout.splitlines()
    return json.loads(line), res.stderr


def test_an_interpreter_without_verl_says_so_and_tells_what_it_has() -> None:
    reply, _ = compose(sys.executable, {"config_dir": None, "config_name": "ppo_trainer", "corners": [[]]})
    assert reply == {"status": "missing", "message": "verl is not installed in this interpreter"}
    reply, _ = compose(sys.executable, {"probe_only": True})
    probe = reply["interpreter"]
    assert reply["status"] == "ok" and probe["python"] == sys.executable and probe["verl"] is False
    import torch  # the test's interpreter has the trainer's torch (the driver itself never imports it)

    assert probe["torch"] == torch.__version__.split("+")[0] or probe["torch"] == torch.__version__


def test_anything_unexpected_is_still_one_line() -> None:
    reply, _ = compose(sys.executable, "not json")
    assert reply["status"] == "error" and reply["message"].startswith("JSONDecodeError: ")


def test_the_override_a_hydra_message_names_is_the_culprit() -> None:
    overrides = ["data.train_batch_size=8", "+ray_kwargs.ray_init.num_cpus=4", "actor_rollout_ref.actor.optim.lr=1"]
    assert _culprit("Key 'num_cpus' ... 'ray_kwargs.ray_init.num_cpus' is not in struct", overrides) == (
        "ray_kwargs.ray_init.num_cpus", "4")
    assert _culprit("Could not override 'actor_rollout_ref.actor.optim.lr'", overrides) == (
        "actor_rollout_ref.actor.optim.lr", "1")
    assert _culprit("something else went wrong", overrides) == (None, None)


@needs_verl
def test_real_verl_composes_each_corner_and_names_the_override_it_refuses() -> None:
    good = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=1",
            "trainer.nnodes=1"]
    reply, _ = compose(VERL_PY, {"config_dir": None, "config_name": "ppo_trainer",
                                 "corners": [good, [*good, "actor_rollout_ref.actor.no_such_key=1"]],
                                 "select": ["data.train_batch_size", "no.such.key"]})
    assert reply["status"] == "ok" and reply["interpreter"]["verl"] is True
    ok, refused = reply["results"]
    assert ok["ok"] and ok["selected"] == {"data.train_batch_size": 8, "no.such.key": None}
    assert ok["info"]["adv_estimator"] == "grpo" and ok["info"]["n_gpus"] == 1
    assert refused == {"ok": False, "key": "actor_rollout_ref.actor.no_such_key", "value": "1", "seconds":
                       refused["seconds"], "message": "override 'actor_rollout_ref.actor.no_such_key=1': "
                                                      "actor_rollout_ref.actor.no_such_key is not a key of verl's "
                                                      "config (add a new key with "
                                                      "+actor_rollout_ref.actor.no_such_key=1)"}
    reply, _ = compose(VERL_PY, {"config_dir": None, "config_name": "nope", "corners": [[]]})
    assert reply["status"] == "error" and reply["message"].startswith("config 'nope': not found in ")
