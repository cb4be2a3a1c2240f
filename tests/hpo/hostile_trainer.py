"""A trainer that writes whatever a test asks into its metrics file: the driver must survive all of it.

    python tests/hpo/hostile_trainer.py train --config NAME --metrics-file PATH hostile.script=ACTIONS.json [k=v ...]

``ACTIONS.json`` is a list of actions run in order:
    {"write": TEXT}                       append TEXT (a str) to the metrics file
    {"fill": N, "byte": "x"}              append N copies of one byte, 1 MiB at a time (no newline)
    {"eval": STEP, "value": V}            append a well-formed line with eval/reward_mean = V at STEP ("x": the
                                          value of the fake.x override)
    {"checkpoint": N}                     write an N-byte checkpoint under <metrics dir>/checkpoints/global_step_1
    {"truncate": true}                    truncate the metrics file to 0 bytes
    {"mkfifo": true}                      make the metrics path a FIFO (nobody ever writes it)
    {"sleep": S}                          sleep S seconds
    {"exit": CODE}                        exit now
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    metrics, script, x = None, None, None
    for i, arg in enumerate(argv):
        if arg == "--metrics-file":
            metrics = argv[i + 1]
        elif arg.startswith("hostile.script="):
            script = arg.partition("=")[2]
        elif arg.startswith("fake.x="):
            x = float(arg.partition("=")[2])
    assert metrics and script, "needs --metrics-file and hostile.script="
    with open(script) as fh:
        actions = json.load(fh)
    for act in actions:
        if "write" in act:
            with open(metrics, "a") as out:
                out.write(act["write"])
        elif "fill" in act:
            block = act.get("byte", "x").encode() * 2**20
            with open(metrics, "ab") as bout:
                left = int(act["fill"])
                while left > 0:
                    bout.write(block[:left])
                    left -= len(block)
        elif "eval" in act:
            with open(metrics, "a") as out:
                value = x if act["value"] == "x" else act["value"]
                out.write(json.dumps({"step": act["eval"], "data": {"eval/reward_mean": value}}) + "\n")
        elif "checkpoint" in act:
            step_dir = os.path.join(os.path.dirname(metrics), "checkpoints", "global_step_1")
            os.makedirs(step_dir, exist_ok=True)
            with open(os.path.join(step_dir, "model.pt"), "wb") as bout:
                bout.write(os.urandom(int(act["checkpoint"])))
        elif act.get("truncate"):
            os.truncate(metrics, 0)
        elif act.get("mkfifo"):
            os.mkfifo(metrics)
        elif "sleep" in act:
            time.sleep(float(act["sleep"]))
        elif "exit" in act:
            return int(act["exit"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
