"""The toy plugin's trainer: ``trainer.py --config FILE --metrics-file PATH key=value ...`` (no torch, a few ms).

Its keys (:data:`KEYS`; another is refused, exit 2): ``toy.x`` (quality peaks at 0.3), ``toy.steps`` (the last step,
default 4), ``toy.seed`` (moves the quality by a millionth per unit), ``toy.out`` (its checkpoints directory),
``toy.save_every`` (a checkpoint ``ckpt-<step>/state.json`` every N steps and at the last; 0: none),
``toy.resume`` (a checkpoint to continue from, at its step + 1, with this run's ``toy.x``), ``toy.fail_at`` (exit 1
after that step's checkpoint). Each step adds ``(1 - (x - 0.3)^2) / steps`` to the quality, logged as
``toy/quality`` every second step and at the last."""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("toy.x", "toy.steps", "toy.seed", "toy.out", "toy.save_every", "toy.resume", "toy.fail_at")


def main(args: list[str]) -> int:
    metrics = args[args.index("--metrics-file") + 1]
    values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        print(f"error: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})", file=sys.stderr)
        return 2
    x, steps = float(values["toy.x"]), int(values.get("toy.steps", 4))
    seed, save_every = int(values.get("toy.seed", 0)), int(values.get("toy.save_every", 0))
    fail_at = int(values.get("toy.fail_at", -1))
    start, quality = 0, 0.0
    if values.get("toy.resume"):
        state = json.loads((Path(values["toy.resume"]) / "state.json").read_text())
        start, quality = int(state["step"]), float(state["quality"])
    out = Path(values.get("toy.out", "checkpoints"))
    with open(metrics, "w") as f:
        for step in range(start + 1, steps + 1):
            quality += (1.0 - (x - 0.3) ** 2) / steps
            data = {"toy/loss": 1.0 / step, "toy/seconds": 0.01}
            if step % 2 == 0 or step == steps:
                data["toy/quality"] = round(quality + seed * 1e-6, 6)
            f.write(json.dumps({"step": step, "data": data}) + "\n")
            f.flush()
            if save_every > 0 and (step % save_every == 0 or step == steps):
                tmp = out / f".ckpt-{step}.tmp"
                tmp.mkdir(parents=True, exist_ok=True)
                (tmp / "state.json").write_text(json.dumps({"step": step, "quality": quality}))
                tmp.rename(out / f"ckpt-{step}")
            if step == fail_at:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
