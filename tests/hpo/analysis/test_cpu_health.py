"""No GPU health label without a GPU (issue 52 item 9): verl on the CPU platform logs an MFU (against the CPU's
FLOPS, ``verl/utils/flops_counter.py``), far under 60 %, and its trials were labelled ``gpu_underused``. A trial the
driver handed no GPU gets neither GPU label; one handed a GPU still does, and the other speed labels stay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpo.analysis import Diagnoser, DiagnosisSpec
from hpo.backends.verl_core._names import METRICS
from tests.hpo.conftest import PY, fake_space, load, run_cli, write

# what a trainer on the CPU logs each step: step and generation time, verl's MFU as a fraction (2 %)
TRAINER = '''
import json, sys
args = sys.argv[1:]
metrics = args[args.index("--metrics-file") + 1]
with open(metrics, "w") as fh:
    for step in range(1, 6):
        data = {"timing_s/step": 2.0, "timing_s/gen": 1.8, "perf/mfu/actor": 0.02}
        if step % 2 == 0:
            data["eval/reward_mean"] = 0.1 * step
        fh.write(json.dumps({"step": step, "data": data}) + "\\n")
'''


def _health(gpu: bool, **line: float) -> dict[str, dict[str, Any]]:
    d = Diagnoser(DiagnosisSpec(), "eval/reward_mean", True, METRICS, gpu=gpu)
    for step in range(1, 6):
        assert d.update(step, {"timing_s/step": 2.0, "timing_s/gen": 0.4, **line}) is None
    return d.health()


def test_a_diagnoser_of_a_trial_without_gpus_gives_no_gpu_label() -> None:
    for line in ({"perf/gpu_util": 35.0}, {"perf/mfu/actor": 0.02}, {"perf/gpu_util": 99.0}):
        assert _health(gpu=False, **line) == {}, line
    assert list(_health(gpu=True, **{"perf/mfu/actor": 0.02})) == ["gpu_underused"]
    assert list(_health(gpu=True, **{"perf/gpu_util": 99.0})) == ["gpu_saturated"]
    slow_gen = Diagnoser(DiagnosisSpec(), "eval/reward_mean", True, METRICS, gpu=False)
    for step in range(1, 6):
        slow_gen.update(step, {"timing_s/step": 2.0, "timing_s/gen": 1.8, "perf/mfu/actor": 0.02})
    assert list(slow_gen.health()) == ["generation_bound"]  # the speed labels that need no GPU stay


def test_a_cpu_trial_of_a_study_gets_no_gpu_label_and_a_gpu_trial_does(tmp_path: Path) -> None:
    trainer = write(tmp_path / "my_trainer.py", TRAINER)
    studies = tmp_path / "studies"
    labels = {}
    for name, devices in (("on_cpu", None), ("on_gpu", ["0"])):
        trial: dict[str, Any] = {"backend": "verl_core", "command": [PY, str(trainer)]}
        if devices:
            trial["devices"] = devices  # handed GPU 0 (the trainer is the same: only the driver's view differs)
        space = fake_space(tmp_path, name=name, overrides={"trainer.total_training_steps": 5}, params={
            "x": {"key": "my.x", "type": "float", "low": 0.0, "high": 1.0}}, study={"n_trials": 1}, trial=trial)
        res = run_cli(["search", "--space", str(space)], studies, CUDA_VISIBLE_DEVICES="")
        assert res.returncode == 0, res.stderr
        (t,) = load(studies, name).trials
        labels[name] = t.user_attrs["health"]
    assert labels == {"on_cpu": ["generation_bound"], "on_gpu": ["gpu_underused", "generation_bound"]}
