"""``Backend.plan``: one attempt in, its launch out (argv, environment, metrics file, config, resume point), and the
retry-chain walk every resumable backend shares (:func:`hpo.backends._replay.resume_point`), on real files: a
trainer whose checkpoints are ``ckpt-<step>`` directories, complete once they hold ``done``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hpo.backends import Attempt, CheckpointLayout, CommandBackend, Resumable, load_space


def _newest(checkpoints: Path) -> int | None:
    steps = [int(d.name[5:]) for d in checkpoints.glob("ckpt-*") if (d / "done").is_file()]
    return max(steps, default=None)


def _resumed_from(trial_dir: Path) -> Path | None:
    try:
        argv = json.loads((trial_dir / "command.json").read_text())["argv"]
    except OSError:
        return None
    return next((Path(a.partition("=")[2]) for a in argv if a.startswith("resume=")), None)


LAYOUT = CheckpointLayout(newest=_newest, step_dir=lambda d, step: d / f"ckpt-{step}",
                          step_of=lambda d: int(d.name[5:]) if d.name.startswith("ckpt-") else None,
                          resumed_from=_resumed_from)


class Resuming(CommandBackend):
    name: ClassVar[str] = "resumable"
    metrics_env: ClassVar[str | None] = "MY_METRICS"
    steps_key = "trainer.total_training_steps"
    resumable = Resumable(LAYOUT, lambda checkpoint: [f"resume={checkpoint}"])

    def metrics_path(self, trial_dir: Path, attempt: int) -> Path:
        return trial_dir / f"m{attempt}.jsonl"


def _attempt(trials: Path, number: int, k: int, steps: dict[int, bool], resume: Path | None = None,
             logged: range = range(0)) -> None:
    """Trial ``number`` ran as attempt ``k``: its checkpoints (step: complete?), its start, its metrics lines."""
    trial_dir = trials / str(number)
    for step, complete in steps.items():
        (trial_dir / "checkpoints" / f"ckpt-{step}").mkdir(parents=True)
        if complete:
            (trial_dir / "checkpoints" / f"ckpt-{step}" / "done").write_text("")
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "command.json").write_text(json.dumps({"argv": ["train", *([f"resume={resume}"] if resume else [])]}))
    (trial_dir / f"m{k}.jsonl").write_text("".join(json.dumps({"step": s, "data": {"score": 10 * k + s}}) + "\n"
                                                   for s in logged))


def test_a_retry_plans_from_the_newest_complete_checkpoint_of_its_chain(tmp_path: Path) -> None:
    trials = tmp_path / "trials"
    _attempt(trials, 4, 0, {2: True, 4: False}, logged=range(0, 5))  # killed while writing ckpt-4
    _attempt(trials, 9, 1, {3: True}, resume=trials / "4" / "checkpoints" / "ckpt-2", logged=range(2, 4))
    space = load_space("search_spaces/kl_lr.yaml", ["trial.command=[python, train.py]",
                                                    "overrides.trainer.total_training_steps=40"])
    backend = Resuming()
    attempt = Attempt(space=space, study="s", number=12, trial_dir=trials / "12", trials_dir=trials, history=(4, 9),
                      values={"kl_coef": 0.5}, cwd=str(tmp_path), env={"CUDA_VISIBLE_DEVICES": "1"}, devices=1)
    launch = backend.plan(attempt)
    assert launch.resume is not None and launch.resume.checkpoint == trials / "9" / "checkpoints" / "ckpt-3"
    assert launch.resume.step == 3
    # the curve up to the checkpoint: attempt 0's steps 0-2, then attempt 1's from its start (step 2 merged)
    assert launch.resume.records() == [(0, {"score": 0}), (1, {"score": 1}), (2, {"score": 12}), (3, {"score": 13})]
    assert launch.metrics == trials / "12" / "m2.jsonl"
    assert launch.env["MY_METRICS"] == str(launch.metrics) and launch.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert launch.argv[:6] == [sys.executable, "train.py", "--config", space.config, "--metrics-file",
                               str(launch.metrics)]
    assert launch.argv[6:] == launch.config.overrides and launch.config.total_steps == 40
    assert "algorithm.kl_ctrl.kl_coef=0.5" in launch.config.overrides
    assert yaml_overrides(launch.config.config_text) == launch.config.overrides


def yaml_overrides(text: str) -> list[str]:
    import yaml

    return list(yaml.safe_load(text)["overrides"])


@pytest.mark.parametrize("history", [(), (4,)])
def test_no_checkpoint_or_no_layout_starts_afresh(tmp_path: Path, history: tuple[int, ...]) -> None:
    trials = tmp_path / "trials"
    _attempt(trials, 4, 0, {2: False})  # nothing complete
    space = load_space("search_spaces/kl_lr.yaml", ["trial.command=[python, train.py]"])
    start = tmp_path / "parent" / "ckpt-6"
    seen: list[Path | None] = []

    class Recording(Resuming):
        def command(self, attempt: Attempt, config: Any) -> Any:
            seen.append(attempt.resume_from)
            return super().command(attempt, config)

    for backend in (Recording(), CommandBackend()):
        launch = backend.plan(Attempt(space=space, study="s", number=5, trial_dir=trials / "5", trials_dir=trials,
                                      history=history, cwd=str(tmp_path), start=start))
        assert launch.resume is None  # a PBT segment's start: what the command continues from
        assert ("MY_METRICS" in launch.env) == isinstance(backend, Resuming)
    assert seen == [start]
    _attempt(trials, 7, 0, {6: True})
    plan = Recording().plan(Attempt(space=space, number=8, trial_dir=trials / "8", trials_dir=trials, history=(7,),
                                    start=start))
    assert plan.resume is not None and seen[-1] == trials / "7" / "checkpoints" / "ckpt-6"  # a retry's point first
    assert CommandBackend().plan(Attempt(space=space, number=8, trial_dir=trials / "8", trials_dir=trials,
                                         history=(7,))).resume is None  # no resumable feature: nothing is resumed
