"""STAND-IN for ``python -m verl.trainer.main_ppo`` (verl 0.9.1): no Ray, no model, no training, but verl's own
code wherever the driver sees the result. It runs in verl's interpreter (``.venv-verl``), found before the real
entry point through a ``sys.meta_path`` finder (``tests/hpo/backends/verl/conftest.py``'s ``fake_verl`` fixture), so
that the exact argv of ``hpo.backends.verl._launch.verl_argv`` runs on a CPU where real verl cannot train:

* argv: ``[--config-path DIR --config-name NAME] key=value ...`` in hydra's override syntax: ``+key=`` adds a key
  (an error when it exists), ``++key=`` adds or sets, a plain ``key=`` must exist (hydra's "Could not override"
  error otherwise, exit 1, before anything of verl is imported; with ``FAKE_VERL_ALL_KEYS=1`` every plain key is
  taken as one of verl's, for spaces that real verl composed first); values ``null``, ``true``, numbers,
  ``[a,b]`` lists and quoted strings.
* metrics: verl's ``verl.utils.tracking.Tracking`` with ``trainer.logger`` (``FileLogger``: ``"wb"``, orjson, so
  NaN and inf are ``null``; the console logger), one ``log`` per step as verl's ``fit`` does. Validation at step 0
  of a run (``val_before_train``), every ``test_freq`` steps and at the last step: the stand-in's answers to the
  validation problems (``data.val_files`` when it exists, else 100 GSM8K-format rows; the first
  ``round(score x n)`` answered right) are scored by verl's ``NaiveRewardManager`` with the configured reward
  function (``reward.custom_reward_function``, loaded by verl's ``get_custom_reward_fn``; else verl's GSM8K rule)
  and named by verl's ``PPOTrainer._val_metrics_update``: ``val-core/openai/gsm8k/acc/mean@<val_kwargs.n>``.
* checkpoints: verl's ``_save_checkpoint`` order: ``global_step_N/actor/`` (FSDP shard files
  ``{model,optim,extra_state}_world_size_W_rank_r.pt`` for W = n_gpus_per_node x nnodes, ``huggingface/``), with
  verl's own ``BaseCheckpointManager`` retention (``max_actor_ckpt_to_keep``: the previous ``actor/`` goes right
  after the new one is saved), ``critic/`` likewise when ``algorithm.adv_estimator=gae``, then ``data.pt``, then
  the tracker file (verl's ``get_checkpoint_tracker_filename``). Resume as verl's ``_load_checkpoint``:
  ``resume_mode=auto`` through verl's ``find_latest_ckpt_path``, ``resume_path`` with ``resume_from_path``; the
  shards are opened with ``torch.load`` as ``FSDPCheckpointManager.load_checkpoint`` opens them (a missing one is
  the same ``FileNotFoundError``), only the parts ``*.checkpoint.load_contents`` names, ``data.pt`` when it is
  there; a resumed run's ``val_before_train`` logs at that step. ``actor/lr`` is logged as verl does: the config's,
  unless the actor's optimizer or extra state was loaded (then the checkpoint's, as ``FSDPCheckpointManager``
  restores the optimizer's param_groups and the scheduler's base_lrs).
* Ray: writes ``$RAY_TMPDIR/ray/session_latest/logs/raylet.out`` (where Ray keeps its logs) and, with
  ``+fake.ray_child=true``, starts a sleeping "raylet" in its own session, as Ray's processes are.
* hydra: writes ``<hydra.run.dir>/.hydra/overrides.yaml``.

Behaviour keys (added with ``+``): ``fake.x`` (final score ``1 - (x - 0.3)^2``, default 0.3), ``fake.step_s``
(seconds per step, 0.02), ``fake.sigkill_at`` / ``fake.crash_at`` / ``fake.hang_at`` (at that step, after its
checkpoint), ``fake.kill_after_actor_save`` (SIGKILL at that step's save right after ``actor/``: the previous
step's ``actor/`` is gone, the tracker still names it), ``fake.nan_at`` (``actor/pg_loss`` NaN and
``actor/grad_norm`` inf at that step), ``fake.ray_child``, ``fake.env_file`` (dump the environment as JSON there).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from typing import Any

# The verl keys this stand-in knows (a subset of verl's ppo_trainer config, with verl's defaults).
DEFAULTS: dict[str, Any] = {
    "trainer.total_training_steps": 10, "trainer.total_epochs": 30, "trainer.test_freq": -1,
    "trainer.save_freq": -1, "trainer.val_before_train": True, "trainer.logger": ["console", "wandb"],
    "trainer.project_name": "verl_examples", "trainer.experiment_name": "gsm8k",
    "trainer.default_local_dir": "checkpoints/verl_examples/gsm8k", "trainer.resume_mode": "auto",
    "trainer.resume_from_path": None, "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1,
    "trainer.max_actor_ckpt_to_keep": None, "trainer.max_critic_ckpt_to_keep": None,
    "hydra.run.dir": "outputs", "algorithm.adv_estimator": "gae", "data.train_batch_size": 1024,
    "data.train_files": "~/data/rlhf/gsm8k/train.parquet", "data.val_files": "~/data/rlhf/gsm8k/test.parquet",
    "data.seed": None, "actor_rollout_ref.actor.optim.lr": 1e-6, "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001, "actor_rollout_ref.actor.data_loader_seed": 42,
    "actor_rollout_ref.rollout.temperature": 1.0, "actor_rollout_ref.rollout.seed": 42,
    "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.model.path": "~/models/deepseek-llm-7b-chat", "critic.data_loader_seed": 42,
    "reward.custom_reward_function.path": None, "reward.custom_reward_function.name": "compute_score",
    "actor_rollout_ref.actor.checkpoint.load_contents": ["model", "optimizer", "extra"],
    "critic.checkpoint.load_contents": ["model", "optimizer", "extra"],
}
N_VAL = 100  # built-in validation problems when data.val_files does not exist


def parse_value(text: str) -> Any:
    """A hydra override value: quoted string, [list], null, bool, int, float, else the bare string."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        body, out, i = text[1:-1], [], 0
        while i < len(body):  # hydra: backslashes are escapes only before a quote (or the end)
            if body[i] == "\\" and i + 1 < len(body) and body[i + 1] in "'\"\\":
                out.append(body[i + 1])
                i += 2
                continue
            out.append(body[i])
            i += 1
        return "".join(out)
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        items, depth, quote, cur = [], 0, "", ""
        for ch in inner:
            if quote:
                quote = "" if ch == quote and not cur.endswith("\\") else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(cur)
                cur = ""
                continue
            cur += ch
        if inner:
            items.append(cur)
        return [parse_value(i) for i in items]
    low = text.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text.replace("_", ""))
        except ValueError:
            pass
    return text


def parse_argv(argv: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(config, hydra flags); SystemExit(1) with hydra's message for a bad override."""
    cfg, flags, i = dict(DEFAULTS), {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--config-path", "--config-name", "-cp", "-cn"):
            flags[arg.lstrip("-")] = argv[i + 1]
            i += 2
            continue
        key, sep, value = arg.partition("=")
        if not sep:
            sys.exit(f"hydra.errors.OverrideParseException: Error parsing override '{arg}'")
        bare = key.lstrip("+~")
        if key.startswith("++"):
            cfg[bare] = parse_value(value)
        elif key.startswith("+"):
            if bare in cfg:
                sys.exit(f"hydra.errors.ConfigCompositionException: Could not append to config. An item is already "
                         f"at '{bare}'.")
            cfg[bare] = parse_value(value)
        elif bare not in cfg and not os.environ.get("FAKE_VERL_ALL_KEYS"):  # 1: verl's full key set assumed
            sys.exit(f"hydra.errors.ConfigCompositionException: Could not override '{bare}'. To append to your "
                     f"config use +{arg}")
        else:
            cfg[bare] = parse_value(value)
        i += 1
    return cfg, flags


def score(cfg: dict[str, Any], step: int, total: int) -> float:
    """Deterministic in (config, step), so that a resumed run logs what an uninterrupted one would."""
    x = float(cfg.get("fake.x", 0.3))
    return round((1.0 - (x - 0.3) ** 2) * step / max(1, total), 6)


# ----------------------------------------------------------------------------- validation, scored and named by verl
class _Tokenizer:
    """What the reward manager asks of a tokenizer: decode a response (here: the index of a prepared text)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return self.texts[int(ids[0])]


class Validator:
    def __init__(self, cfg: dict[str, Any]) -> None:
        from omegaconf import OmegaConf
        from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
        from verl.trainer.ppo.reward import get_custom_reward_fn

        reward_cfg = OmegaConf.create({"reward": {"custom_reward_function": {
            "path": cfg["reward.custom_reward_function.path"], "name": cfg["reward.custom_reward_function.name"]}}})
        self.tokenizer = _Tokenizer()
        self.manager = NaiveRewardManager(None, self.tokenizer, get_custom_reward_fn(reward_cfg))
        self.rows = self._rows(str(cfg["data.val_files"]))
        self.n = int(cfg["actor_rollout_ref.rollout.val_kwargs.n"])

    @staticmethod
    def _rows(val_files: str) -> list[dict[str, Any]]:
        path = os.path.expanduser(val_files.strip("[]").split(",")[0].strip().strip("'\""))
        if os.path.isfile(path):
            import pyarrow.parquet as pq

            return pq.read_table(path, columns=["data_source", "reward_model", "extra_info"]).to_pylist()
        return [{"data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
                 "extra_info": {"index": i}} for i in range(N_VAL)]

    def _score_one(self, row: dict[str, Any], text: str) -> dict[str, Any]:
        import numpy as np
        import torch
        from verl import DataProto

        self.tokenizer.texts = [text]
        data = DataProto.from_dict(
            tensors={"responses": torch.tensor([[0]]), "attention_mask": torch.tensor([[1, 1]])},
            non_tensors={k: np.array([row.get(k) or {}] if k != "data_source" else [row[k]], dtype=object)
                         for k in ("data_source", "reward_model", "extra_info")})
        return self.manager.loop.run_until_complete(self.manager.run_single(data))

    def metrics(self, value: float) -> dict[str, Any]:
        """verl's validation metrics of a policy that answers the first ``round(value x problems)`` right."""
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        right = round(value * len(self.rows))
        sources, uids, infos = [], [], {"reward": []}  # as _validate collects them
        for i, row in enumerate(self.rows):
            truth = str(row["reward_model"]["ground_truth"])
            for _ in range(self.n):
                out = self._score_one(row, f"#### {truth}" if i < right else "#### -1")
                sources.append(row["data_source"])
                uids.append(f"u{i}")
                infos["reward"].append(out["reward_score"])
                for key, v in out["reward_extra_info"].items():
                    infos.setdefault(key, []).append(v)
        return PPOTrainer._val_metrics_update(None, sources, uids, infos, [])


# ----------------------------------------------------------------------------- checkpoints in verl's order
def world_size(cfg: dict[str, Any]) -> int:
    return int(cfg["trainer.n_gpus_per_node"]) * int(cfg["trainer.nnodes"])


def make_role_saver(max_keep: Any) -> Any:
    """verl's ``BaseCheckpointManager`` retention (``ensure_checkpoint_capacity`` / ``register_checkpoint``),
    around shard files written as ``FSDPCheckpointManager.save_checkpoint`` names them."""
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    class RoleSaver(BaseCheckpointManager):
        def __init__(self) -> None:  # no model, no process group: only the bookkeeping of the base class
            self.previous_saved_paths: list[str] = []
            self.previous_global_step = None

        def save(self, local_path: str, step: int, world: int, lr: float = 0.0) -> None:
            import torch

            self.previous_global_step = step
            self.ensure_checkpoint_capacity(max_keep)
            os.makedirs(os.path.join(local_path, "huggingface"), exist_ok=True)
            for rank in range(world):
                for kind in ("model", "optim", "extra_state"):  # the optimizer's and scheduler's learning rate
                    torch.save({"step": step, "rank": rank, "lr": lr},
                               os.path.join(local_path, f"{kind}_world_size_{world}_rank_{rank}.pt"))
            self.register_checkpoint(local_path, max_keep)

    return RoleSaver()


def save_checkpoint(cfg: dict[str, Any], savers: dict[str, Any], step: int) -> None:
    """verl's ``_save_checkpoint`` (trainer/ppo/v1/trainer_base.py): actor, critic, data.pt, then the tracker."""
    import torch
    from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

    root = str(cfg["trainer.default_local_dir"])
    folder = os.path.join(root, f"global_step_{step}")
    savers["actor"].save(os.path.join(folder, "actor"), step, world_size(cfg), float(cfg["actor/lr"]))
    if str(step) == str(cfg.get("fake.kill_after_actor_save")):
        os.kill(os.getpid(), signal.SIGKILL)
    if "critic" in savers:
        savers["critic"].save(os.path.join(folder, "critic"), step, world_size(cfg))
    torch.save({"dataloader_step": step}, os.path.join(folder, "data.pt"))
    with open(get_checkpoint_tracker_filename(root), "w") as fh:
        fh.write(str(step))


def load_checkpoint(cfg: dict[str, Any], use_critic: bool) -> int:
    """verl's ``_load_checkpoint``: the step to continue after (0: from scratch)."""
    import torch
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = cfg["trainer.resume_mode"]
    if mode == "disable":
        return 0
    if mode == "auto":
        folder = os.path.abspath(str(cfg["trainer.default_local_dir"]))
        step_folder = find_latest_ckpt_path(folder)
        if step_folder is None:
            print("Training from scratch")
            return 0
    elif mode == "resume_path":
        step_folder = cfg["trainer.resume_from_path"]
        assert isinstance(step_folder, str), "resume ckpt must be str type"
        assert "global_step_" in step_folder, "resume ckpt must specify the global_steps"
    else:
        raise ValueError(f"Unknown resume mode {mode}")
    step = int(step_folder.split("global_step_")[-1])
    print(f"Resuming from {step_folder}, setting global step to {step}")
    for role in ["actor"] + (["critic"] if use_critic else []):
        contents = cfg[f"{'actor_rollout_ref.actor' if role == 'actor' else 'critic'}.checkpoint.load_contents"]
        kinds = {"model": "model", "optim": "optimizer", "extra_state": "extra"}
        for kind, part in kinds.items():  # rank 0's shards, as FSDPCheckpointManager opens them (load_contents)
            if part not in contents:
                continue
            shard = torch.load(os.path.join(step_folder, role, f"{kind}_world_size_{world_size(cfg)}_rank_0.pt"))
            if role == "actor" and kind in ("optim", "extra_state") and "lr" in shard:
                cfg["actor/lr"] = shard["lr"]  # the optimizer's param_groups / the scheduler's base_lrs: it wins
    data = os.path.join(step_folder, "data.pt")
    if os.path.exists(data):
        torch.load(data)
    else:
        print(f"Warning: No dataloader state found at {data}, will start from scratch")
    return step


def main(argv: list[str]) -> int:
    cfg, flags = parse_argv(argv)  # hydra's errors come before anything of verl is imported
    if "fake.env_file" in cfg:
        with open(cfg["fake.env_file"], "w") as fh:
            json.dump({"env": dict(os.environ), "argv": argv, "cfg": cfg, "flags": flags}, fh)
    run_dir = str(cfg["hydra.run.dir"])
    os.makedirs(os.path.join(run_dir, ".hydra"), exist_ok=True)
    with open(os.path.join(run_dir, ".hydra", "overrides.yaml"), "w") as fh:
        fh.write("".join(f"- {a}\n" for a in argv if "=" in a))
    ray_tmp = os.environ.get("RAY_TMPDIR")
    if ray_tmp:  # where Ray would keep this run's session: sockets, logs
        logs = os.path.join(ray_tmp, "ray", "session_latest", "logs")
        os.makedirs(logs, exist_ok=True)
        with open(os.path.join(logs, "raylet.out"), "a") as fh:
            fh.write(f"stand-in raylet of pid {os.getpid()}\n")
    if cfg.get("fake.ray_child"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)

    from verl.utils.tracking import Tracking

    loggers = cfg["trainer.logger"] if isinstance(cfg["trainer.logger"], list) else [cfg["trainer.logger"]]
    tracker = Tracking(project_name=str(cfg["trainer.project_name"]),
                       experiment_name=str(cfg["trainer.experiment_name"]), default_backend=loggers)
    use_critic = cfg["algorithm.adv_estimator"] == "gae"
    savers = {"actor": make_role_saver(cfg["trainer.max_actor_ckpt_to_keep"])}
    if use_critic:
        savers["critic"] = make_role_saver(cfg["trainer.max_critic_ckpt_to_keep"])
    validator = Validator(cfg)
    total = int(cfg["trainer.total_training_steps"])
    test_freq, save_freq = int(cfg["trainer.test_freq"]), int(cfg["trainer.save_freq"])
    cfg["actor/lr"] = float(cfg["actor_rollout_ref.actor.optim.lr"])  # the config's, unless a checkpoint's wins
    global_steps = load_checkpoint(cfg, use_critic)
    if cfg["trainer.val_before_train"]:
        tracker.log(data=validator.metrics(score(cfg, global_steps, total)), step=global_steps)
    step_s = float(cfg.get("fake.step_s", 0.02))
    for step in range(global_steps + 1, total + 1):
        time.sleep(step_s)
        last = step == total
        if save_freq > 0 and (last or step % save_freq == 0):
            save_checkpoint(cfg, savers, step)
        if str(step) == str(cfg.get("fake.sigkill_at")):
            os.kill(os.getpid(), signal.SIGKILL)
        if str(step) == str(cfg.get("fake.crash_at")):
            raise RuntimeError(f"stand-in crash at step {step}")
        if str(step) == str(cfg.get("fake.hang_at")):
            time.sleep(3600)
        nan = str(step) == str(cfg.get("fake.nan_at"))
        data: dict[str, Any] = {"critic/score/mean": score(cfg, step, total),
                                "actor/pg_loss": math.nan if nan else -0.01,
                                "actor/grad_norm": math.inf if nan else 0.5, "actor/entropy": 0.5,
                                "actor/lr": float(cfg["actor/lr"]),
                                "response_length/mean": 100.0, "timing_s/step": step_s,
                                "training/global_step": step, "training/epoch": 0}
        if test_freq > 0 and (last or step % test_freq == 0):
            data.update(validator.metrics(score(cfg, step, total)))
        tracker.log(data=data, step=step)
    tracker.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
