"""Checkpoints in verl's layout: ``<default_local_dir>/global_step_<N>/`` plus a tracker file.

A checkpoint holds the actor and critic weights, their optimizer and scheduler states,
the KL controller, the data position and every RNG state, so a run restarted from its
directory continues exactly where it stopped. The actor is also saved as a Hugging
Face model (``actor/huggingface``) that ``actor_rollout_ref.model.path`` can load.
Writes go to a temporary directory renamed into place: a crash never leaves a
half-written checkpoint that resume would pick up.

Two ways to resume (``trainer.resume_mode``):

* ``auto``: the run's own newest checkpoint in ``default_local_dir``, restored exactly (the same run, continued).
* ``resume_path``: the checkpoint ``trainer.resume_from_path`` (any run's, e.g. another population member's in
  population-based training), with **this run's config winning** over what the checkpoint restores
  (:func:`apply_config_hyperparameters`): the optimizers' learning rates (the LR schedule's base rate; its
  position, the warm-up step, stays the checkpoint's), weight decay and betas, and the KL controller's current
  coefficient when the config's ``algorithm.kl_ctrl.kl_coef`` differs from the one the checkpoint's run started
  from (the same one: an adaptive controller goes on from the checkpoint's value, so a run continued from another
  run's checkpoint with that run's config, as a proxy search's confirmation does, is that run). Everything else
  read from the config at each step (entropy coefficient, clip ratios, KL loss coefficient, ...) is not in a
  checkpoint and wins anyway. The weights, Adam moments, data position, RNG states
  and step number are the checkpoint's: the run continues at step N + 1 and logs into its own metrics file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

TRACKER = "latest_checkpointed_iteration.txt"


def find_latest(root: Path) -> Path | None:
    tracker = root / TRACKER
    if not tracker.is_file():
        return None
    step = int(tracker.read_text().strip())
    path = root / f"global_step_{step}"
    return path if (path / "state.pt").is_file() else None


def save_checkpoint(trainer: Any, root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = root / f".global_step_{step}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(trainer.state_dict(), tmp / "state.pt")
    trainer.actor.model.save_pretrained(tmp / "actor" / "huggingface", safe_serialization=True)
    trainer.tokenizer.save_pretrained(tmp / "actor" / "huggingface")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    tracker_tmp = root / f".{TRACKER}.tmp"
    tracker_tmp.write_text(str(step))
    tracker_tmp.replace(root / TRACKER)
    return final


def load_checkpoint(trainer: Any, path: Path) -> int:
    """Restore ``trainer`` from ``path``; returns the step it was saved at.

    The state is read onto the CPU whatever the trainer's device: ``torch.set_rng_state`` and
    ``torch.cuda.set_rng_state_all`` take CPU byte tensors only, and ``load_state_dict`` of the modules and
    optimizers copies every tensor onto its parameter's device itself.
    """
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    return int(trainer.load_state_dict(state))


def apply_config_hyperparameters(trainer: Any) -> None:
    """After a ``resume_path`` restore: the config's optimizer hyperparameters replace the restored ones, and its KL
    coefficient the controller's when it is not the one the checkpoint's run started from (see the module
    docstring). ``actor/lr`` logged at the next step is the new rate."""
    cfg = trainer.cfg
    workers = [(trainer.actor, cfg.actor_rollout_ref.actor.optim)]
    if trainer.critic is not None:
        workers.append((trainer.critic, cfg.critic.optim))
    for worker, optim in workers:
        sched = worker.scheduler
        sched.base_lrs = [float(optim.lr) for _ in sched.base_lrs]
        factors = [fn(sched.last_epoch) for fn in sched.lr_lambdas]  # the schedule's position: the checkpoint's
        for group, factor in zip(worker.optimizer.param_groups, factors, strict=True):
            group["initial_lr"] = float(optim.lr)
            group["lr"] = float(optim.lr) * factor
            group["weight_decay"] = float(optim.weight_decay)
            group["betas"] = tuple(float(b) for b in optim.betas)
        sched._last_lr = [g["lr"] for g in worker.optimizer.param_groups]
    coef = float(cfg.algorithm.kl_ctrl.kl_coef)
    if trainer.kl_coef_init != coef:  # a new coefficient (PBT's explore); the same one continues the controller
        trainer.kl_ctrl.value = coef
        trainer.kl_coef_init = coef


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after ``step`` (they are recomputed after a resume)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    tmp.replace(path)
