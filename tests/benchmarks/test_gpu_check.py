"""``benchmarks/gpu_check.py``: the GPU plan on CPU (``--dry-run``) prints its one table; the verl stages' commands
are valid searches; their judging (SIGTERM and resume, two trials at once, memory ratios) reads like a
specification on made-up outcomes; and their orchestration runs for real against the driver, with the verl
stand-in (``tests/hpo/fake_verl_main_ppo.py``, in ``.venv-verl``) as the trials' ``main_ppo``.

Run in subprocesses: inside pytest the name ``benchmarks`` is this test package (tests/benchmarks)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VERL_PY = REPO / ".venv-verl" / "bin" / "python"  # not resolved: the venv's own link, not the base interpreter
HAS_VERL = VERL_PY.exists()
STAND_IN = REPO / "tests" / "hpo" / "fake_verl_main_ppo.py"
VAL = "val-core/openai/gsm8k/acc/mean@1"
NAMES = ["device", "train (grad checkpointing, fp32)", "memory estimate", "rollout vLLM vs HF", "checkpoint resume",
         "4-bit reward model", "verl study", "verl SIGTERM + resume", "verl two trials at once",
         "verl memory estimate", "throughput ratio", "speed health"]


def run_py(code: str, *args: str, timeout: float = 120) -> Any:
    """Run ``code`` (which has ``g``: benchmarks.gpu_check, and ``argv``) in a subprocess; the JSON it prints last."""
    prelude = ("import json, math, sys\nfrom pathlib import Path\nfrom benchmarks import gpu_check as g\n"
               "from benchmarks import gpu_check_speed as s\nargv = sys.argv[1:]\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the whole plan on CPU
def _dry_run(tmp_path: Path, *only: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``gpu_check.py --dry-run`` (``--only`` those parts when given): the process and its rows by name."""
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parts = ["--only", *only] if only else []
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", *parts, "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, {r["name"]: r for r in json.loads(out.read_text())}


THROUGHPUT_ROWS = ["throughput ratio", "speed health"]


# light enough for the lighter run, but self-contained: taken by a heavy run of make test-slow once its own tests
# are done (the lighter run is CI's longest on stop 64's machine, and test-vllm waits for it)
@pytest.mark.cpu_heavy
@pytest.mark.cpu_heavy_late
@pytest.mark.timeout(1500)
@pytest.mark.slow  # ~1-2 min on 2 busy cores: make test-slow
def test_dry_run_prints_the_table(tmp_path: Path) -> None:
    """Every part but the throughput one (its search + confirm of 6 trainer runs runs in CI through
    tests/hpo/reporting/test_speed.py::test_a_throughput_study_measures_after_warmup_confirms_and_recommends, its rows'
    arithmetic through test_the_throughput_ratio_row and test_the_speed_health_row_..., and the whole dry run through
    test_dry_run_of_the_throughput_part in make test-extended)."""
    proc, rows = _dry_run(tmp_path, "trainer", "reward", "verl")
    assert list(rows) == [n for n in NAMES if n not in THROUGHPUT_ROWS]
    for name in ("device", "train (grad checkpointing, fp32)", "memory estimate", "checkpoint resume"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["4-bit reward model"]["status"] == "skipped" and "CUDA" in rows["4-bit reward model"]["detail"]
    assert rows["rollout vLLM vs HF"]["status"] in ("ok", "skipped")
    assert "ratio" in rows["memory estimate"]["detail"] and "resumed at step 2" in rows["checkpoint resume"]["detail"]
    table = proc.stdout
    assert "gpu-check: DRY RUN on CPU" in table and all(n in table for n in rows)
    verl = rows["verl study"]
    assert "would run: -m hpo search --space verl_grpo_gsm8k" in verl["detail"]
    if HAS_VERL:  # every corner composed by real verl, with its memory estimate
        assert verl["status"] == "ok" and "corner(s) composed by verl 0.9.1" in verl["detail"], verl
    else:
        assert verl["status"] == "skipped" and "make install-verl" in verl["detail"]
    # the plan of every verl stage, nothing run
    resume = rows["verl SIGTERM + resume"]
    assert resume["status"] == "skipped" and "trainer.save_freq=1" in resume["detail"]
    assert "SIGTERM once a trial has a complete checkpoint" in resume["detail"]
    assert "then: -m hpo resume --study gpu-check-verl" in resume["detail"]
    pair = rows["verl two trials at once"]
    assert pair["status"] == "skipped" and "trial.n_jobs=2, trial.gpus_per_trial=1" in pair["detail"]
    assert "--study gpu-check-verl-pair" in pair["detail"]
    assert rows["verl memory estimate"]["status"] == "skipped"
    assert "would run: -m hpo search" in proc.stderr  # the plan is printed as it goes


@pytest.mark.timeout(1500)
@pytest.mark.slow
@pytest.mark.extended  # ~2-4 min on 2 busy cores (6 trainer runs); CI runs its path: see test_dry_run_prints_the_table
def test_dry_run_of_the_throughput_part(tmp_path: Path) -> None:
    """The throughput part ran through the driver: search, then confirm's ABBA re-measurement with its control."""
    proc, rows = _dry_run(tmp_path, "throughput")
    assert list(rows) == ["device", *THROUGHPUT_ROWS]
    ratio, health = rows["throughput ratio"], rows["speed health"]
    assert ratio["status"] == "ok", ratio
    assert ratio["detail"].startswith("pick (micro-batch 16, checkpointing off) vs poor (micro-batch 2, "
                                      "checkpointing on); ")
    assert " over 2 paired runs (" in ratio["detail"] and "order poor, control, pick, pick, poor" in ratio["detail"]
    assert "same math: agrees" in ratio["detail"] and "the first step reproduces exactly" in ratio["detail"]
    assert "confirm: recommended: " in ratio["detail"] and ratio["seconds"] > 0
    assert health["status"] == "ok", health  # no GPU: no GPU label; tiny_arith's generation is a few % of a step
    assert health["detail"].startswith("poor config: no label (no GPU, gen ") and "3 run(s)" in health["detail"]
    assert "pick: no label (no GPU, gen " in health["detail"] and "2 run(s)" in health["detail"]
    assert "[gpu-check] throughput: -m hpo search --space " in proc.stderr


def test_only_runs_the_parts_named() -> None:
    """``--only reward``: the device row and the 4-bit row (skipped on the CPU), nothing else started."""
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--only", "reward"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split()[0] for line in proc.stdout.splitlines()[4:]]
    assert rows == ["device", "4-bit"], proc.stdout
    bad = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--only", "speed"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'speed'" in bad.stderr


def test_steps_below_two_is_an_error() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--steps", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --steps 1: the resume check needs at least 2"


# ----------------------------------------------------------------------------- the commands
def test_the_verl_stage_commands_are_valid_searches() -> None:
    """The studies of the GPU verl stages: their argv parse as ``verl-hpo search`` / ``resume``, and their overrides
    shrink the shipped space to short trials on the local model and data (no verl needed)."""
    from hpo._cli import build_parser
    from hpo.backends import load_space

    work, model = Path("/tmp/w"), Path("/tmp/w/model")
    study, pair, resume, ray_left = run_py(
        "w, m = Path('/tmp/w'), Path('/tmp/w/model')\n"
        "o, p = g.verl_space_overrides(w, m, '/venv/bin/python', 2), g.verl_pair_overrides(w, m, '/venv/bin/python')\n"
        "run, pair = g.StudyRun.of(w, o), g.StudyRun.of(w, p, g.PAIR_STUDY)\n"
        "print(json.dumps([[o, run.search], [p, pair.search], run.resume, g.ray_processes(float('inf'))]))")
    assert ray_left == []
    for (overrides, argv), name, n_trials, n_jobs, steps, save in ((study, "gpu-check-verl", 2, 1, 4, 1),
                                                                   (pair, "gpu-check-verl-pair", 2, 2, 2, -1)):
        assert argv[1:3] == ["-m", "hpo"]
        args = build_parser().parse_args(argv[3:])
        assert args.cmd == "search" and args.space == "verl_grpo_gsm8k" and args.override == overrides
        assert args.study == name and args.studies_dir == work / "studies"
        space = load_space("verl_grpo_gsm8k", overrides, check=False)
        assert space.trial.backend == "verl" and space.trial.python == "/venv/bin/python"
        assert space.study.n_trials == n_trials
        assert space.trial.n_jobs == n_jobs and space.trial.gpus_per_trial == 1
        assert space.param("mini_batch").choices == (16,)
        assert space.overrides["trainer.total_training_steps"] == steps == space.overrides["trainer.test_freq"]
        assert space.overrides["trainer.save_freq"] == save and space.overrides["trainer.val_before_train"] is False
        assert space.overrides["actor_rollout_ref.model.path"] == str(model)
        assert space.overrides["data.train_files"] == str(work / "gsm8k" / "train.parquet")
    args = build_parser().parse_args(resume[3:])
    assert args.cmd == "resume" and args.study == "gpu-check-verl" and args.studies_dir == work / "studies"
    assert args.trust_stored_experiment  # the check's overrides make the stored experiment differ from the file


def test_the_throughput_part_is_a_throughput_study_of_the_pick_against_the_poor_config(tmp_path: Path) -> None:
    """The experiment file the throughput part writes (CUDA and dry): one trial, the pick; ``study.baseline`` the
    poor config; 2 seeds and no more; it loads as a throughput study, and its commands parse as ``search`` and
    ``confirm`` of one study."""
    from hpo._cli import build_parser
    from hpo.backends import load_space

    made = run_py("""
out = {}
for plan in (g.REAL, g.DRY):
    out[plan.device] = [s.speed_experiment(plan), s.speed_commands(Path(argv[0]) / 'x.yaml', Path(argv[0]) / 'st'),
                        s.POOR, s.PICK[plan.device], s.MICRO, s.CHECKPOINTING]
print(json.dumps(out))
""", str(tmp_path))
    for device, (raw, (search, confirm), poor, pick, micro, ckpt) in made.items():
        path = tmp_path / f"{device}.yaml"
        path.write_text(yaml.safe_dump(raw))
        space = load_space(str(path))
        assert space.study.kind == "throughput" and space.study.n_trials == 1
        assert space.study.baseline == poor and poor == {micro: 2, ckpt: True}
        assert {p.key: p.choices for p in space.params} == {micro: (pick[micro],), ckpt: (False,)}
        assert pick[micro] >= 8 * poor[micro]  # 8-16x fewer forward/backward passes in the update
        tp = space.study.throughput
        assert (tp.repeats, tp.max_repeats, tp.top_k, tp.warmup_steps) == (2, 2, 1, 1)
        assert space.overrides["trainer.device"] == device and space.overrides["trainer.total_training_steps"] == 3
        assert space.config == {"cuda": "smollm2_addition", "cpu": "tiny_arith"}[device]
        assert "actor_rollout_ref.rollout.fast_decode" not in space.overrides  # not compared: the trainer's default
        for argv, cmd in ((search, "search"), (confirm, "confirm")):
            args = build_parser().parse_args(argv[3:])
            assert args.cmd == cmd and args.study == "gpu-check-speed" and args.studies_dir == tmp_path / "st"
        assert build_parser().parse_args(search[3:]).space == str(tmp_path / "x.yaml")


def test_the_throughput_ratio_row() -> None:
    rows = run_py("""
import dataclasses
ok = s.SpeedFacts(0, 0, order=['poor', 'control', 'pick', 'pick', 'poor'],
                  pairs=[(1000, 2400.0, 1000.0), (1001, 2600.0, 1000.0)], ratio=2.498, low=1.52, high=4.1,
                  same_math=True, control='control (...): the first step reproduces exactly',
                  verdict='recommended: trial 0, 2.498x', seconds=150.0)
cases = {
    'ok': ok,
    'not separated': dataclasses.replace(ok, pairs=[(1000, 1300.0, 1000.0), (1001, 4000.0, 1000.0)], ratio=2.28,
                                         low=0.01, high=500.0),
    'slower once': dataclasses.replace(ok, pairs=[(1000, 3000.0, 1000.0), (1001, 900.0, 1000.0)], ratio=1.64),
    'small': dataclasses.replace(ok, pairs=[(1000, 1100.0, 1000.0), (1001, 1100.0, 1000.0)], ratio=1.1),
    'differs': dataclasses.replace(ok, same_math=False, disagreements=['seed 1000: actor/grad_norm 5.5 vs 4.9']),
    'unchecked': dataclasses.replace(ok, same_math=None),
    'a pick failed': dataclasses.replace(ok, pairs=ok.pairs[:1], failed=1, ratio=2.4, low=None, high=None),
    'search failed': s.SpeedFacts(1, None, error='search exit 1: error: bad key'),
    'confirm failed': dataclasses.replace(ok, confirm_exit=1, pairs=[], ratio=None, same_math=None, pending=4),
}
out = {k: [s.ratio_row(v, 'micro-batch 32, checkpointing off', 'micro-batch 2, checkpointing on').status,
           s.ratio_row(v, 'micro-batch 32, checkpointing off', 'micro-batch 2, checkpointing on').detail,
           s.ratio_row(v, 'a', 'b').seconds] for k, v in cases.items()}
out['bar'] = [s.MIN_SPEEDUP, s.REPEATS]
print(json.dumps(out))
""")
    status, detail, seconds = rows["ok"]
    assert status == "ok" and seconds == 150
    assert detail == ("pick (micro-batch 32, checkpointing off) vs poor (micro-batch 2, checkpointing on); 2.50x "
                      "[1.52, 4.10] over 2 paired runs (separated); tokens/s 2400 vs 1000, 2600 vs 1000; order poor, "
                      "control, pick, pick, poor; same math: agrees; control (...): the first step reproduces "
                      "exactly; confirm: recommended: trial 0, 2.498x")
    assert rows["not separated"][0] == "ok" and "(not separated)" in rows["not separated"][1]  # 2 seeds: reported
    assert rows["bar"] == [1.2, 2]
    expect = {"slower once": "the pick was not faster on seed(s) [1001]",
              "small": "speed-up 1.10x below 1.2x",
              "differs": "same math: DIFFERS (seed 1000: actor/grad_norm 5.5 vs 4.9)",
              "unchecked": "same math: not checked (no first step logged by both)",
              "a pick failed": "1 paired run(s) of 2 (1 run(s) of the pick failed)",
              "search failed": "search exit 1: error: bad key",
              "confirm failed": "confirm exit 1"}
    for name, text in expect.items():
        assert rows[name][0] == "FAIL" and text in rows[name][1], (name, rows[name])
    assert "0 paired run(s) of 2, 4 still to run" in rows["confirm failed"][1]


def test_the_speed_health_row_checks_the_labels_against_what_each_run_logged(tmp_path: Path) -> None:
    """``gpu_underused`` where the mean utilisation after the first step is below ``util_low`` (a run handed a GPU),
    ``generation_bound`` where generation takes ``gen_fraction`` of the step or more; a label the means do not give,
    or one missing, fails; on CUDA a poor run without a GPU or without its utilisation fails. ``run_health`` reads
    the means from the run's metrics file, the GPU from its command.json."""
    rows = run_py("""
R = s.RunHealth
cuda = [R(1, 'poor', ('gpu_underused',), True, 24.0, 0.4), R(2, 'control', ('gpu_underused', 'generation_bound'),
        True, 30.0, 0.75), R(3, 'pick', (), True, 70.0, 0.5), R(4, 'pick', ('gpu_saturated',), True, 97.0, 0.5),
        R(5, 'poor', ('gpu_underused',), True, 20.0, None)]
cpu = [R(1, 'poor', (), False, None, 0.02), R(2, 'control', (), False, None, 0.03), R(3, 'pick', (), False, None, 0.1)]
cases = {
    'cuda': (cuda, True),
    'cpu': (cpu, False),
    'a label the means do not give': ([R(1, 'poor', ('generation_bound',), False, None, 0.3)], False),
    'a label missing': ([R(1, 'poor', (), True, 20.0, 0.3)], True),
    'no labels recorded': ([R(1, 'poor', None, False, None, 0.3)], False),
    'no GPU handed': ([R(1, 'poor', (), False, None, 0.3)], True),
    'no utilisation logged': ([R(1, 'poor', (), True, None, 0.3)], True),
    'nothing ran': ([R(3, 'pick', (), True, 70.0, 0.5)], True),
}
out = {k: [s.health_row(r, 60.0, 0.7, c).status, s.health_row(r, 60.0, 0.7, c).detail] for k, (r, c) in cases.items()}
tdir = Path(argv[0])
(tdir / 'command.json').write_text(json.dumps({'argv': [], 'env': {'CUDA_VISIBLE_DEVICES': '0'}}))
lines = [{'step': 1, 'data': {'timing_s/step': 9.0, 'timing_s/gen': 9.0, 'perf/gpu_util': 1.0}},
         {'step': 2, 'data': {'timing_s/step': 2.0, 'timing_s/gen': 1.0, 'perf/gpu_util': 20.0}},
         {'step': 2, 'data': {'eval/reward_mean': 0.5}},
         {'step': 3, 'data': {'timing_s/step': 4.0, 'timing_s/gen': 3.0, 'perf/gpu_util': 40.0}}]
(tdir / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\\n' for x in lines))
from types import SimpleNamespace
from hpo.backends.verl_core import VerlCoreBackend
t = SimpleNamespace(number=7, user_attrs={'trial_dir': str(tdir), 'health': ['gpu_underused']})
read = s.run_health(t, 'poor', VerlCoreBackend.metrics)
bare = s.run_health(SimpleNamespace(number=8, user_attrs={'trial_dir': str(tdir / 'none')}), 'pick',
                    VerlCoreBackend.metrics)
(tdir / 'mfu').mkdir()
(tdir / 'mfu' / 'metrics.jsonl').write_text(''.join(json.dumps({'step': i, 'data': {'timing_s/step': 1.0,
                                                   'perf/mfu/actor': 0.1 * i}}) + '\\n' for i in (1, 2, 3)))
mfu = s.run_health(SimpleNamespace(number=9, user_attrs={'trial_dir': str(tdir / 'mfu')}), 'poor',
                   VerlCoreBackend.metrics)
out['read'] = [read.labels, read.gpu, read.util, read.gen_share, bare.labels, bare.gpu, bare.util, mfu.util,
               mfu.gen_share]
print(json.dumps(out))
""", str(tmp_path))
    assert rows["cuda"] == ["ok", "poor config: generation_bound, gpu_underused (GPU util 25%, gen 57% of the step; 3 "
                                  "run(s)); pick: gpu_saturated (GPU util 84%, gen 50% of the step; 2 run(s)); "
                                  "thresholds util < 60%, gen >= 70%"]
    assert rows["cpu"] == ["ok", "poor config: no label (no GPU, gen 2% of the step; 2 run(s)); pick: no label (no "
                                 "GPU, gen 10% of the step; 1 run(s)); thresholds util < 60%, gen >= 70%"]
    expect = {"a label the means do not give": "run 1 (poor) labelled ['generation_bound'] but its means give none",
              "a label missing": "run 1 (poor) labelled none but its means give ['gpu_underused']",
              "no labels recorded": "run 1 (poor) has no health labels recorded",
              "no GPU handed": "run 1 (poor) was handed no GPU",
              "no utilisation logged": "run 1 (poor) logged no perf/gpu_util (NVML): gpu_underused cannot fire",
              "nothing ran": "no run of the poor config finished"}
    for name, text in expect.items():
        assert rows[name][0] == "FAIL" and text in rows[name][1], (name, rows[name])
    # steps 2 and 3 (the first is the warm-up): util (20 + 40) / 2, gen (1/2 + 3/4) / 2
    assert rows["read"][:7] == [["gpu_underused"], True, 30.0, 0.625, None, False, None]
    assert rows["read"][7] == pytest.approx(25.0) and rows["read"][8] is None  # no gpu_util: mfu x 100 (steps 2-3)


# ----------------------------------------------------------------------------- judging, on made-up outcomes
FACTS = """
def facts(number, state='COMPLETE', value=0.5, fail='', lines=4, objective=(0.5,), start=100.0, end=160.0,
          devices='0', retry_of=None, first=1, alloc=float('nan')):
    return g.TrialFacts(number, state, value, fail, lines, tuple(objective), start, end, devices, {'x': 1},
                        retry_of, first, alloc, 'm.jsonl')
"""


def test_overlap_and_the_two_trials_row() -> None:
    rows = run_py(FACTS + """
both = [facts(0, start=100, end=160, devices='0'), facts(1, start=101, end=170, devices='1')]
out = {'overlap': [g.overlap_s([(0, 10), (5, 20)]), g.overlap_s([(0, 10), (12, 20)]), g.overlap_s([(0, 5), (5, 9)]),
                   g.overlap_s([(0, 10), (2, 4), (3, 12)])]}
cases = {
    'ok': g.Pair(0, 75.0, both),
    'one after the other': g.Pair(0, 130.0, [facts(0, start=100, end=160), facts(1, start=161, end=220, devices='1')]),
    'same GPU': g.Pair(0, 75.0, [facts(0), facts(1, start=101, end=170)]),
    'a crash': g.Pair(0, 75.0, [both[0], facts(1, value=float('-inf'), fail='crash', objective=(), devices='1')]),
    'one trial': g.Pair(1, 75.0, both[:1], error='search exit 1: boom'),
    'ray left': g.Pair(0, 75.0, both, ['123 raylet']),
}
for name, p in cases.items():
    c = g.pair_row(p)
    out[name] = [c.status, c.detail, c.data['overlap_s'], c.seconds]
print(json.dumps(out))
""")
    assert rows["overlap"] == [5, -2, 0, 1]  # every interval at once; touching is not overlapping
    status, detail, overlap, seconds = rows["ok"]
    assert status == "ok" and overlap == 59 and seconds == 75
    assert detail == ("trial 0 on GPU 0 COMPLETE 60 s value 0.5, trial 1 on GPU 1 COMPLETE 69 s value 0.5; "
                      "overlapping 59 s; Ray processes left: 0")
    assert rows["one after the other"][0] == "FAIL" and "did not run at once (overlap -1.0 s)" in rows[
        "one after the other"][1]
    assert rows["same GPU"][0] == "FAIL" and "both trials got GPU(s) '0'" in rows["same GPU"][1]
    assert rows["a crash"][0] == "FAIL" and "trial 1 COMPLETE (crash), value -inf" in rows["a crash"][1]
    assert rows["one trial"][0] == "FAIL" and "search exit 1: boom" in rows["one trial"][1]
    assert "1 trials ran, not 2" in rows["one trial"][1]
    assert rows["ray left"][0] == "FAIL" and "Ray processes left: 123 raylet" in rows["ray left"][1]


def test_the_sigterm_and_resume_row() -> None:
    rows = run_py(FACTS + """
import dataclasses
ok = g.Interrupted(trial=0, checkpoint_step=1, checkpoint_s=70.0, exit_code=143, stop_s=4.2, queued=True,
                   resume_exit=0, resume_s=110.0, retry=1, resumed_from=2, first_step=3, loaded_log=True, value=0.25,
                   trials=[facts(0, 'FAIL', None, lines=2, objective=()), facts(1, retry_of=0, first=3, value=0.25)])
cases = {
    'ok': ok,
    'no log line': dataclasses.replace(ok, loaded_log=False),
    'exit 0': dataclasses.replace(ok, exit_code=0),
    'killed by the signal': dataclasses.replace(ok, exit_code=-15),
    'not queued': dataclasses.replace(ok, queued=False),
    'afresh': dataclasses.replace(ok, resumed_from=None, first_step=1, loaded_log=False),
    'from before the checkpoint': dataclasses.replace(ok, checkpoint_step=3, resumed_from=2, first_step=3,
                                                      loaded_log=False),
    'retry crashed': dataclasses.replace(ok, trials=[ok.trials[0], facts(1, value=float('-inf'), fail='crash',
                                                                         objective=(), retry_of=0)]),
    'no checkpoint': g.Interrupted(exit_code=143, stop_s=1.0, error='no complete checkpoint after 900 s'),
    'finished first': g.Interrupted(exit_code=0, error='the search exited 0 before the SIGTERM (after a checkpoint)'),
    'ray after stop': dataclasses.replace(ok, ray_after_stop=['77 gcs_server']),
    'ray at the end': dataclasses.replace(ok, ray_left=['78 ray::WorkerDict']),
}
print(json.dumps({k: [g.resume_row(v).status, g.resume_row(v).detail, g.resume_row(v).seconds]
                  for k, v in cases.items()}))
""")
    status, detail, seconds = rows["ok"]
    assert status == "ok" and seconds == pytest.approx(184.2)
    assert detail == ("trial 0 checkpoint at step 1 after 70 s; SIGTERM -> exit 143 in 4.2 s, trial 0 queued; resume "
                      "exit 0 in 110 s; retry 1 resumed from step 2, first step logged 3 ('Resuming from' in its "
                      "log), value 0.25; Ray processes left: 0")
    assert rows["no log line"][0] == "ok"  # the first step after the checkpoint is enough
    expect = {"exit 0": "driver exit 0 after SIGTERM (expected 143)",
              "killed by the signal": "driver exit -15 after SIGTERM (expected 143)",
              "not queued": "trial 0 not queued (no WAITING retry of it)",
              "afresh": "the retry started afresh (no trainer.resume_from_path)",
              "from before the checkpoint": "the retry resumed from step 2, before the checkpoint 3",
              "retry crashed": "trial 1 COMPLETE (crash), value -inf, 4 metric lines, 0 objective values",
              "no checkpoint": "no complete checkpoint after 900 s",
              "finished first": "the search exited 0 before the SIGTERM",
              "ray after stop": "Ray processes left after the SIGTERM: 77 gcs_server",
              "ray at the end": "Ray processes left: 78 ray::WorkerDict"}
    for name, text in expect.items():
        assert rows[name][0] == "FAIL" and text in rows[name][1], (name, rows[name])
    assert "is not after the checkpoint's 1" in rows["afresh"][1]
    assert "is not after the checkpoint's 3 and its log does not say" in rows["from before the checkpoint"][1]


def test_the_study_row_counts_only_trials_that_really_completed() -> None:
    rows = run_py(FACTS + """
interrupted = facts(0, 'FAIL', None, lines=2, objective=())
cases = {
    'ok': ([interrupted, facts(1, retry_of=0)], 1, [], 0),
    'worst value': ([interrupted, facts(1, value=float('-inf'), fail='timeout', objective=())], 1, [], 0),
    'too few': ([interrupted, facts(1)], 2, [], 0),
    'nothing logged': ([facts(0, lines=0, objective=())], 1, [], None),
    'ray': ([facts(0)], 1, ['9 raylet'], None),
}
print(json.dumps({k: [g.study_row(t, n, 'val', r, i).status, g.study_row(t, n, 'val', r, i).detail]
                  for k, (t, n, r, i) in cases.items()}))
""")
    assert rows["ok"] == ["ok", "1 trial(s) complete, 6 metric lines, val [0.5], Ray processes left: 0"]
    assert rows["worst value"][0] == "FAIL" and "trial 1 COMPLETE (timeout), value -inf" in rows["worst value"][1]
    assert rows["too few"][0] == "FAIL" and "1 of 2 trials complete" in rows["too few"][1]
    assert rows["nothing logged"][0] == "FAIL" and "no val recorded" in rows["nothing logged"][1]
    assert rows["ray"][0] == "FAIL" and "Ray processes left: 9 raylet" in rows["ray"][1]


def test_the_memory_row_reports_expected_and_worst_case_ratios() -> None:
    rows = run_py("""
def row(expected, worst, measured):
    c = g.memory_row(g.MemoryFacts(expected, worst, measured, 'mean response 100 tokens', 'rollout', 1.5, 1.2))
    return [c.status, c.detail, c.data['expected_ratio'], c.data['worst_ratio'], c.data['actor_ratio']]
print(json.dumps({'ok': row(44.0, 46.0, 42.0), 'low': row(30.0, 46.0, 42.0), 'high': row(80.0, 90.0, 42.0),
                  'worst low': row(40.0, 37.0, 42.0), 'nothing measured': row(44.0, 46.0, 0.0),
                  'bands': [g.EXPECTED_RATIO, g.WORST_MIN_RATIO]}))
""")
    status, detail, expected, worst, actor = rows["ok"]
    assert status == "ok" and expected == pytest.approx(44 / 42) and worst == pytest.approx(46 / 42)
    assert actor == pytest.approx(1.25)
    assert detail == ("expected 44.00 GiB (mean response 100 tokens), worst case 46.00 GiB vs device peak 42.00 GiB "
                      "(NVML, all processes): ratios 1.05 / 1.10 (peak phase rollout); actor allocator 1.50 GiB vs "
                      "perf/max_memory_allocated_gb 1.20: ratio 1.25")
    lo, hi = rows["bands"][0]
    assert lo <= 1.0 <= hi and rows["bands"][1] <= 1.0
    for name in ("low", "high", "worst low", "nothing measured"):
        assert rows[name][0] == "FAIL" and "want expected/measured in" in rows[name][1], name
    assert math.isnan(rows["nothing measured"][2])


def test_checkpoints_and_commands_are_read_as_the_driver_writes_them(tmp_path: Path) -> None:
    """The checkpoint the SIGTERM waits for is a complete one (``hpo.backends.verl.checkpoint_step``), in any trial
    of the study; the step a retry resumed from is read from its ``command.json``; the rows render in the table."""
    out = run_py("""
work = Path(argv[0])
run = g.StudyRun.of(work, [])
first = g.checkpoint_in(run)
def save(trial, step, data=True):
    d = run.trial_dir(trial) / 'checkpoints' / f'global_step_{step}'
    (d / 'actor').mkdir(parents=True)
    for kind in ('model', 'optim', 'extra_state'):
        (d / 'actor' / f'{kind}_world_size_1_rank_0.pt').write_bytes(b'x')
    if data:
        (d / 'data.pt').write_bytes(b'x')
save(0, 1, data=False)  # actor saved, data.pt not yet: not complete
half = g.checkpoint_in(run)
save(0, 2)
save(3, 1)
found = g.checkpoint_in(run)
cmd = run.trial_dir(4) / 'command.json'
cmd.parent.mkdir(parents=True)
cmd.write_text(json.dumps({'argv': ['p', 'trainer.resume_mode=resume_path',
                                    f"trainer.resume_from_path={run.trial_dir(0) / 'checkpoints' / 'global_step_2'}"]}))
fresh = run.trial_dir(5) / 'command.json'
fresh.parent.mkdir(parents=True)
fresh.write_text(json.dumps({'argv': ['p', 'trainer.resume_mode=auto']}))
table = g.render([g.Check('verl SIGTERM + resume', 'ok', 'resumed from step 2', 184.2),
                  g.Check('verl two trials at once', 'skipped', 'one GPU (1 visible)')], g.REAL, False)
print(json.dumps([first, half, found, g._resumed_from(run.trial_dir(4)), g._resumed_from(run.trial_dir(5)),
                  table, [a for a in run.resume if a.startswith('--')]]))
""", str(tmp_path))
    first, half, found, resumed, fresh, table, flags = out
    assert first is None and half is None and found == [0, 2] and resumed == 2 and fresh is None
    assert "verl SIGTERM + resume    ok       184  resumed from step 2" in table
    assert "verl two trials at once  skipped    0  one GPU (1 visible)" in table
    assert flags == ["--study", "--studies-dir", "--trust-stored-experiment"]


# ----------------------------------------------------------------------------- the orchestration, for real
_SITECUSTOMIZE = """
import importlib.util, sys


class _StandInMainPpo:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "verl.trainer.main_ppo":
            return importlib.util.spec_from_file_location(name, {stand_in!r})
        return None


sys.meta_path.insert(0, _StandInMainPpo)
"""

STAND_IN_RUN = """
import os
work, study = Path(argv[0]), argv[1]
work.mkdir(parents=True, exist_ok=True)
model = g._model_dir(g.DRY, work)  # config.json only: what composing and the pre-flight estimate read
g.write_verl_data(work)
trial_env = {'PYTHONPATH': argv[2], 'FAKE_VERL_ALL_KEYS': '1', 'VERL_HPO_SKIP_INTERPRETER_CHECK': '1'}
extra = [f'trial.env={json.dumps(trial_env)}', '+fake.step_s=1.0', f'trial.devices={argv[4]}']
overrides = (g.verl_pair_overrides(work, model, argv[3]) if study == g.PAIR_STUDY else
             g.verl_space_overrides(work, model, argv[3], 1)) + extra
run = g.StudyRun.of(work, overrides, study, {**os.environ, 'VERL_HPO_RUNTIME_DIR': str(work / 'runtime')})
"""


def stand_in_args(tmp_path: Path, study: str, devices: str) -> list[str]:
    if not HAS_VERL:
        pytest.skip("the stand-in runs with real verl's code: run `make install-verl` (creates .venv-verl)")
    site = tmp_path / "fake-verl"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(stand_in=str(STAND_IN)))
    return [str(tmp_path / "work"), study, str(site), str(VERL_PY), devices]


# 417 s on CI's machine of stop 64 (real verl composes the study's config before each of the two driver runs): make
# test-extended, not CI; the driver's SIGTERM, queued retry and resume run in CI through tests/hpo/study/
# test_driver.py and tests/hpo/backends/verl/test_resume.py (the stand-in's checkpoints), the GPU check's dry run
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(600)
def test_sigterm_and_resume_through_the_driver_with_the_stand_in(tmp_path: Path) -> None:
    """The GPU check's SIGTERM stage, unchanged, on a study whose trials run the stand-in: the driver is stopped
    once trial 0 has a complete checkpoint (4 steps of 1 s, one checkpoint each), exits 143 with the trial queued;
    ``resume`` runs the retry from that checkpoint to the end, objective recorded."""
    row, study, interrupted = run_py(STAND_IN_RUN + """
o = g.sigterm_and_resume(run, argv[5], timeout_s=300)
c, s = g.resume_row(o), g.study_row(o.trials, 1, argv[5], o.ray_left, o.trial)
print(json.dumps([[c.status, c.detail], [s.status, s.detail], c.data]))
""", *stand_in_args(tmp_path, "gpu-check-verl", "[0]"), VAL, timeout=560)
    assert row[0] == "ok", row
    assert study[0] == "ok" and study[1].startswith("1 trial(s) complete, ") and f"{VAL} [1.0]" in study[1]
    o = interrupted
    assert o["trial"] == 0 and o["checkpoint_step"] >= 1 and o["exit_code"] == 143 and o["queued"]
    assert o["resume_exit"] == 0 and o["retry"] == 1 and o["resumed_from"] >= o["checkpoint_step"]
    assert o["first_step"] == o["resumed_from"] + 1 and o["loaded_log"]  # val_before_train=false: no step N line
    assert o["value"] == pytest.approx(1.0) and o["ray_after_stop"] == [] and o["ray_left"] == []
    retry = next(t for t in o["trials"] if t["number"] == 1)
    assert retry["retry_of"] == 0 and retry["state"] == "COMPLETE" and retry["metrics"].endswith(
        "metrics.attempt1.jsonl")
    assert (tmp_path / "work" / "gpu-check-verl.log").read_text().count("$ ") == 2  # search, then resume


# 227-320 s on CI's machine of stop 64 (real verl composes the study's config before the trials): make
# test-extended, not CI; CI runs the GPU check's dry run (its plan and table) and two trials at once on two devices
# through the driver elsewhere (tests/hpo/study/test_distributed.py)
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(720)
def test_two_trials_at_once_through_the_driver_with_the_stand_in(tmp_path: Path) -> None:
    """The GPU check's pair stage on two (lock-file) devices: both trials COMPLETE, on GPUs 0 and 1, their
    wall-time intervals overlap. Then the memory row's estimate of their config (composed by verl on the CPU), at
    the lengths they logged and in the worst case, against a made-up device peak. (The search's own limit is 540 s:
    227 s here beside the slow suite, and on CI's machine of stop 64 the driver's checks before the trials took
    ~225 s of a 300-s limit, which stopped both trials 75 s in.)"""
    row, pair, memory = run_py(STAND_IN_RUN + """
p = g.run_pair(run, argv[5], timeout_s=540)
c = g.pair_row(p)
# the memory row's plumbing: the trial's config composed by verl, judged at the lengths the trials logged
m = g.verl_memory_row(p.trials, overrides, argv[3], 40 * 2**30, 141 * 2**30)
print(json.dumps([[c.status, c.detail], c.data, m.data]))
""", *stand_in_args(tmp_path, "gpu-check-verl-pair", "[0,1]"), VAL, timeout=680)
    assert row[0] == "ok", row
    assert pair["overlap_s"] > 0 and sorted(t["devices"] for t in pair["trials"]) == ["0", "1"]
    assert all(t["state"] == "COMPLETE" and t["objective"] for t in pair["trials"])
    assert memory["lengths"] == "mean response 100 tokens (largest means of the study)"  # the stand-in's
    # vLLM's slice (gpu_memory_utilization x the GPU) is the peak whatever the lengths
    assert 0 < memory["expected_gib"] <= memory["worst_gib"] and memory["peak_phase"] == "rollout"
    assert memory["measured_gib"] == 40 and memory["expected_ratio"] == pytest.approx(memory["expected_gib"] / 40)
