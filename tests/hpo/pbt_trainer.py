"""STAND-IN for ``python -m verl_core train`` under population-based training, without torch: it speaks verl_core's
segment contract (``trainer.total_training_steps``, ``trainer.save_freq``, ``trainer.default_local_dir``,
``trainer.resume_mode=resume_path`` with ``trainer.resume_from_path``, the JSONL metrics file) and can turn on its
checkpoints as a hostile trial would. :func:`stand_in_env` makes ``python -m verl_core`` run it (a
``sys.meta_path`` finder in a ``sitecustomize`` on PYTHONPATH maps ``verl_core.__main__`` here; the driver, which
never imports that module, keeps the real ``verl_core.config``).

Score: starts at 0, each step adds ``0.01 * (1 - |log10(lr) + 4| / 4)`` (best at lr 1e-4), carried in the
checkpoint's ``state.json``; ``eval/reward_mean`` = the score at every ``trainer.test_freq`` step and the last.
A checkpoint is ``global_step_<N>/state.json`` plus ``actor/model.bin`` (64 KiB). An lr above 1e-3 collapses:
``actor/pg_loss`` is NaN at the first step, then the run waits to be stopped (the driver's diagnosis does).

``PBT_HOSTILE`` (environment), after the checkpoint is saved unless said otherwise:
    delete      remove ``checkpoints/``
    symlink     replace ``checkpoints/`` with a symbolic link to a directory outside the studies directory that
                holds the same ``global_step_<N>`` (a checkpoint of the trial's choosing)
    etc         replace ``checkpoints/`` with a symbolic link to ``/etc``
    write       before training, rewrite every file of the resume directory in place (``open(p, "r+b")``)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

SITECUSTOMIZE = """
import importlib.util, sys


class _StandInVerlCoreMain:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "verl_core.__main__":
            return importlib.util.spec_from_file_location(name, {stand_in!r})
        return None


sys.meta_path.insert(0, _StandInVerlCoreMain)
"""


def stand_in_env(site: Path, hostile: str = "") -> dict[str, str]:
    """Environment variables for the driver under which every ``python -m verl_core`` runs this stand-in."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(stand_in=str(Path(__file__).resolve())))
    return {"PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).resolve().parents[2])]),
            "PBT_HOSTILE": hostile}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("train", "prepare"):
        print("error: expected train or prepare", file=sys.stderr)
        return 2
    if argv[0] == "prepare":
        return 0
    opts: dict[str, str] = {}
    metrics = "metrics.jsonl"
    i = 1
    while i < len(argv):
        if argv[i] in ("--config", "--metrics-file"):
            metrics = argv[i + 1] if argv[i] == "--metrics-file" else metrics
            i += 2
            continue
        key, _, value = argv[i].partition("=")
        opts[key] = value
        i += 1
    hostile = os.environ.get("PBT_HOSTILE", "")
    total = int(opts["trainer.total_training_steps"])
    freq = int(opts.get("trainer.test_freq", 1))
    out = Path(opts["trainer.default_local_dir"])
    lr = float(opts.get("actor_rollout_ref.actor.optim.lr", 1e-4))
    start, score = 0, 0.0
    if opts.get("trainer.resume_mode") == "resume_path":
        resume = Path(opts["trainer.resume_from_path"])
        try:
            state = json.loads((resume / "state.json").read_text())
            (resume / "actor" / "model.bin").read_bytes()
        except (OSError, ValueError) as err:
            print(f"error: cannot resume from {resume}: {err}", file=sys.stderr)
            return 1
        start, score = int(resume.name.rpartition("_")[2]), float(state["score"])
        if hostile == "write":
            rewrite(resume, out.parent.parent.parent)
    gain = 0.01 * (1 - abs(math.log10(lr) + 4) / 4)
    with open(metrics, "a") as fh:
        if lr > 1e-3:
            fh.write(json.dumps({"step": start + 1, "data": {"actor/lr": lr, "actor/pg_loss": float("nan"),
                                                             "eval/reward_mean": score + gain}}) + "\n")
            fh.flush()
            time.sleep(60)
            return 1
        for step in range(start + 1, total + 1):
            score += gain
            data = {"actor/lr": lr, "actor/pg_loss": 0.1}
            if step % freq == 0 or step == total:
                data["eval/reward_mean"] = score
            fh.write(json.dumps({"step": step, "data": data}) + "\n")
            fh.flush()
    ckpt = out / f"global_step_{total}"
    (ckpt / "actor").mkdir(parents=True, exist_ok=True)
    (ckpt / "state.json").write_text(json.dumps({"score": score}))
    (ckpt / "actor" / "model.bin").write_bytes(os.urandom(64 * 1024))
    if hostile in ("delete", "symlink", "etc"):
        outside = out.parent.parent.parent.parent.parent / "outside" / out.parent.name
        if hostile == "symlink":
            shutil.copytree(out, outside)
        shutil.rmtree(out)
        if hostile != "delete":
            os.symlink("/etc" if hostile == "etc" else outside, out)
    return 0


def rewrite(resume: Path, study_dir: Path) -> None:
    """Rewrite every file of ``resume`` in place; log the study's other checkpoint files whose bytes changed by it
    (``<studies>/../rewrites.jsonl``: one line per run, ``changed`` must be empty)."""
    def hashes() -> dict[str, str]:
        import hashlib

        out = {}
        for root in (study_dir / "trials", study_dir / "pbt"):
            for path in root.rglob("*"):
                if path.is_file() and not path.is_symlink() and resume not in path.parents:
                    out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        return out

    before = hashes()
    for path in sorted(p for p in resume.rglob("*") if p.is_file()):
        with open(path, "r+b") as fh:
            fh.write(b"rewritten by trial " + os.environ.get("VERL_HPO_TRIAL", "?").encode())
    after = hashes()
    changed = sorted(p for p in before if after.get(p) != before[p])
    with open(study_dir.parent.parent / "rewrites.jsonl", "a") as log:
        log.write(json.dumps({"resume": str(resume), "checked": len(before), "changed": changed}) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
