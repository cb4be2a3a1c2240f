"""Checkpoints in verl's layout: ``<default_local_dir>/global_step_<N>/`` plus a tracker file.

A checkpoint holds the actor and critic weights, their optimizer and scheduler states,
the KL controller, the data position and every RNG state, so a run restarted from its
directory continues exactly where it stopped. The actor is also saved as a Hugging
Face model (``actor/huggingface``) that ``actor_rollout_ref.model.path`` can load.
Writes go to a temporary directory renamed into place: a crash never leaves a
half-written checkpoint that resume would pick up.
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
