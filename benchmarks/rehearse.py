"""``verl-hpo rehearse`` of the shipped experiments on this CPU (issue 43: a full rehearsal of ``verl_grpo_cpu`` and
of ``verl_grpo_gsm8k`` in <= 10 min each on a quiet 2-core machine).

``python -m benchmarks.run --only rehearse [--smoke]``: ``python -m hpo rehearse --space verl_grpo_cpu``, then
``--space verl_grpo_gsm8k --override actor_rollout_ref.model.path=<SmolLM2-135M-Instruct, converted locally>``, from
the repo root (smoke: ``--quick``, the default point only). How each figure is taken:

* wall: this process's clock around the command (spawn to exit), which also prints its own total in the report;
* before launch: from the spawn to the moment this process reads its ``running N corners`` line on stderr (the space's
  checks, the prepare step, composing the corners and measuring the prompts in verl's interpreter, the small model,
  the first rows and the reward calls);
* per corner: the attempts' walls the rehearsal records in ``rehearsal.json`` (the default point: its first attempt,
  killed after its checkpoint, plus its resumed one), as many corners at a time as the rehearsal chose (said in the
  note: two on a quiet 2-core host).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from benchmarks._common import REPO, Row, load_average, log, make_row

VERL_PY = REPO / ".venv-verl" / "bin" / "python"
SPACE = "verl_grpo_gsm8k"
GROUP = "verl-hpo rehearse (real verl 0.9.1 on the CPU)"


def _read_lines(stream: IO[str], into: list[tuple[float, str]]) -> None:
    for line in stream:
        into.append((time.monotonic(), line.rstrip("\n")))


SPACES = ("verl_grpo_cpu", SPACE)  # the shipped CPU experiment (its prepare step's model), the GPU one (SmolLM2)


def bench(smoke: bool) -> tuple[list[Row], dict[str, Any]]:
    if not VERL_PY.exists():
        log(f"rehearse: skipped: {VERL_PY} is missing (make install-verl)")
        return [], {"skipped": f"{VERL_PY} missing"}
    rows: list[Row] = []
    details: dict[str, Any] = {}
    for space in SPACES:
        more, details[space] = _rehearse(space, smoke)
        rows += more
    return rows, details


def _rehearse(space: str, smoke: bool) -> tuple[list[Row], dict[str, Any]]:
    """One ``verl-hpo rehearse`` of ``space`` from the repo root: its rows and what it printed."""
    from verl_core.pretrained import ensure_smollm2

    model = ["--override", f"actor_rollout_ref.model.path={ensure_smollm2(log=False)}"] if space == SPACE else []
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-rehearse-") as tmp:
        argv = [sys.executable, "-m", "hpo", "rehearse", "--space", space, "--studies-dir", tmp, *model,
                *(["--quick"] if smoke else [])]
        log(f"rehearse: {' '.join(argv[3:])}")
        seen: list[tuple[float, str]] = []
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=_read_lines, args=(proc.stderr, seen), daemon=True)
        reader.start()
        out = proc.stdout.read() if proc.stdout else ""
        code = proc.wait()
        wall = time.monotonic() - t0
        reader.join(timeout=5)
        if code != 0:
            raise RuntimeError(f"rehearse {space} exited {code}: {out[-2000:]}")
        state = json.loads((Path(tmp) / "rehearsals" / space / "rehearsal.json").read_text())
    launch = next(((t - t0, line) for t, line in seen if line.startswith("running ")), None)
    at_once = launch[1].split(", ", 1)[1].split(" at a time")[0] if launch and " at a time" in launch[1] else "?"
    corners = {c["name"]: [r["wall_time_s"] for r in c["results"]] for c in state["corners"]}
    load = f"load {load_start} -> {load_average()}"
    model_note = ("SmolLM2-135M's config and tokenizer -> 2 layers of 128" if space == SPACE else
                  "the arith model's config and tokenizer -> 2 layers of 128")
    what = (f"{len(corners)} corner(s){'' if smoke else ' + the resume'}, {at_once} at a time; {model_note}; {load}")
    rows = [
        make_row(f"rehearse {space}: wall (spawn -> exit)", "s", [wall], higher_is_better=False, group=GROUP,
                 note=f"python -m hpo rehearse{' --quick' if smoke else ''}; {what}; exit {code}"),
        make_row(f"rehearse {space}: before the first launch (checks, prepare, compose + prompt measurement, "
                 "shrink)", "s", [launch[0]] if launch is not None else None, higher_is_better=False, group=GROUP,
                 note=f"spawn to its 'running N corners' line; {what}"),
    ]
    for name, walls in corners.items():
        rows.append(make_row(f"rehearse {space}: corner {name} ({len(walls)} attempt(s), walls summed)", "s",
                             [sum(walls)], higher_is_better=False, group=GROUP,
                             note=f"TrialProcess walls from rehearsal.json: {', '.join(f'{w:.0f}' for w in walls)} s; "
                                  f"{what}"))
    return rows, {"wall_s": wall, "before_launch_s": launch[0] if launch else None, "corners": corners,
                  "stderr": [[round(t - t0, 1), line] for t, line in seen], "report": out}
