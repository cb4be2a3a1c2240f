"""STAND-IN for ``python -m verl.trainer.main_ppo`` (verl 0.9.1): not verl, no torch, no Ray, no training.

It behaves like verl's entry point toward the driver, so the verl backend's launch, metrics and resume path can
be tested on a CPU where real verl cannot train:

* argv: ``[--config-path DIR --config-name NAME] key=value ...`` in hydra's override syntax: ``+key=`` adds a key
  (an error when it exists), ``++key=`` adds or sets, a plain ``key=`` must exist (hydra's "Could not override"
  error otherwise, exit 1; with ``FAKE_VERL_ALL_KEYS=1`` every plain key is taken as one of verl's, for spaces
  that real verl composed first); values ``null``, ``true``, numbers, ``[a,b]`` lists and quoted strings.
* metrics: verl's ``FileLogger``: ``$VERL_FILE_LOGGER_PATH`` (else ``$VERL_FILE_LOGGER_ROOT/<project>/
  <experiment>.jsonl``) opened with ``"wb"`` when ``file`` is in ``trainer.logger``, one ``{"step": N, "data":
  {...}}`` line per step; validation ``val-core/openai/gsm8k/reward/mean@<val_kwargs.n>`` at step 0 of a run
  (``val_before_train``), every ``test_freq`` steps and at the last step, as verl's ``fit`` does.
* checkpoints: every ``save_freq`` steps (and the last) ``<default_local_dir>/global_step_N/actor/state.json``,
  then ``latest_checkpointed_iteration.txt``; ``trainer.resume_mode=auto`` continues after the step it names, and
  a resumed run's ``val_before_train`` logs at that step, as verl does.
* Ray: writes ``$RAY_TMPDIR/ray/session_latest/logs/raylet.out`` (where Ray keeps its logs) and, with
  ``+fake.ray_child=true``, starts a sleeping "raylet" in its own session, as Ray's processes are.
* hydra: writes ``<hydra.run.dir>/.hydra/overrides.yaml``.

Behaviour keys (added with ``+``): ``fake.x`` (final score ``1 - (x - lr_scale)^2``, default 0.3),
``fake.step_s`` (seconds per step, 0.02), ``fake.sigkill_at`` / ``fake.crash_at`` / ``fake.hang_at`` (at that
step, after its checkpoint), ``fake.ray_child``, ``fake.env_file`` (dump the environment as JSON there).
"""

from __future__ import annotations

import json
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
    "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "trainer.max_actor_ckpt_to_keep": None,
    "hydra.run.dir": "outputs", "algorithm.adv_estimator": "gae", "data.train_batch_size": 1024,
    "data.train_files": "~/data/rlhf/gsm8k/train.parquet", "data.val_files": "~/data/rlhf/gsm8k/test.parquet",
    "actor_rollout_ref.actor.optim.lr": 1e-6, "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001, "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.model.path": "~/models/deepseek-llm-7b-chat",
}


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


def save_checkpoint(root: str, step: int) -> None:
    folder = os.path.join(root, f"global_step_{step}", "actor")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "state.json"), "w") as fh:
        json.dump({"global_step": step}, fh)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as fh:  # verl writes it last
        fh.write(str(step))


def latest_checkpoint(root: str) -> int | None:
    try:
        with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as fh:
            step = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return step if os.path.isdir(os.path.join(root, f"global_step_{step}")) else None


def main(argv: list[str]) -> int:
    cfg, flags = parse_argv(argv)
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
    loggers = cfg["trainer.logger"] if isinstance(cfg["trainer.logger"], list) else [cfg["trainer.logger"]]
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    if path is None:
        root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
        os.makedirs(os.path.join(root, str(cfg["trainer.project_name"])), exist_ok=True)
        path = os.path.join(root, str(cfg["trainer.project_name"]), f"{cfg['trainer.experiment_name']}.jsonl")
    fp = open(path, "wb", buffering=0) if "file" in loggers else None  # verl's FileLogger: "wb"

    def log(step: int, data: dict[str, Any]) -> None:
        if "console" in loggers:
            print(f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in data.items()), flush=True)
        if fp is not None:
            fp.write(json.dumps({"step": step, "data": data}).encode() + b"\n")

    total = int(cfg["trainer.total_training_steps"])
    ckpt_dir = str(cfg["trainer.default_local_dir"])
    test_freq, save_freq = int(cfg["trainer.test_freq"]), int(cfg["trainer.save_freq"])
    n = int(cfg["actor_rollout_ref.rollout.val_kwargs.n"])
    val_key = f"val-core/openai/gsm8k/reward/mean@{n}"
    global_steps = 0
    if cfg["trainer.resume_mode"] == "auto":
        global_steps = latest_checkpoint(ckpt_dir) or 0
        if global_steps:
            print(f"Resuming from {ckpt_dir}/global_step_{global_steps}, setting global step to {global_steps}")
    if cfg["trainer.val_before_train"]:
        log(global_steps, {val_key: score(cfg, global_steps, total)})
    step_s = float(cfg.get("fake.step_s", 0.02))
    for step in range(global_steps + 1, total + 1):
        time.sleep(step_s)
        last = step == total
        if save_freq > 0 and (last or step % save_freq == 0):
            save_checkpoint(ckpt_dir, step)
        if str(step) == str(cfg.get("fake.sigkill_at")):
            os.kill(os.getpid(), signal.SIGKILL)
        if str(step) == str(cfg.get("fake.crash_at")):
            raise RuntimeError(f"stand-in crash at step {step}")
        if str(step) == str(cfg.get("fake.hang_at")):
            time.sleep(3600)
        data: dict[str, Any] = {"critic/score/mean": score(cfg, step, total), "actor/pg_loss": -0.01,
                                "actor/entropy": 0.5, "response_length/mean": 100.0, "timing_s/step": step_s,
                                "training/global_step": step, "training/epoch": 0}
        if test_freq > 0 and (last or step % test_freq == 0):
            data[val_key] = score(cfg, step, total)
        log(step, data)
    if fp is not None:
        fp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
