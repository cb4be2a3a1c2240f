"""The throughput part of ``benchmarks/gpu_check.py`` (its module docstring, item 8): verl_core's SmolLM2 task on the
GPU (dry run: ``tiny_arith`` on the CPU) tuned for speed through the driver, as a user runs it. A ``study.kind:
throughput`` experiment file is written to the work directory: its one search trial is the pick (:data:`PICK`:
large actor micro-batches, gradient checkpointing off), ``study.baseline`` the deliberately poor config
(:data:`POOR`: actor micro-batch 2, checkpointing on); then ``python -m hpo confirm`` re-measures both interleaved on
:data:`REPEATS` seeds (poor, the control (poor again, same seed), pick, pick, poor: ABBA) and checks that they compute
the same first update. Two rows, judged from the stored study by pure functions (:func:`ratio_row`,
:func:`health_row`) that the tests feed made-up facts:

* ``throughput ratio``: ``ok`` when the search and ``confirm`` exit 0, every paired run is there, each pair's pick is
  faster, the geometric mean of the paired ratios is at least :data:`MIN_SPEEDUP`, and the same-math check agrees.
  Two seeds give an interval with one degree of freedom (t = 12.7), which excludes 1 only when the two log ratios
  differ by less than a sixth of their mean (for 2x: the two ratios within ~11% of each other): ``separated`` is
  reported with ``confirm``'s verdict, not required.
* ``speed health``: the health labels (trial user attr ``health``) of the poor config's runs and of the pick's,
  beside what each run logged (mean ``perf/gpu_util`` and ``timing_s/gen`` / ``timing_s/step`` over the steps
  after the first, read from its metrics file). ``ok`` when every run of the poor config carries the attr, each
  run's ``gpu_underused`` and ``generation_bound`` labels are what the experiment's thresholds
  (``diagnosis.util_low``, ``gen_fraction``) give for its means, and, on CUDA, each poor run was handed a GPU and
  logged its utilisation (else ``gpu_underused`` could never fire).

The decode loop is not compared: verl_core's KV-cached decoder (``rollout.fast_decode=true``, the default, in both
settings) samples other tokens than ``transformers.generate`` at one seed, so a pick that switches it computes
another first update and ``confirm`` never recommends it (tiny_arith on the CPU, seed 1: ``actor/grad_norm``
3.27 vs 2.79, ``critic/score/mean`` 0.109 vs 0.156), although the driver lists ``fast_decode`` among verl_core's
math-neutral speed keys. vLLM is a learning key (``rollout.name``: other samples) and is not compared either.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gpu_check_rows import Check, Plan, last_line_of
from benchmarks.gpu_check_verl import read_steps

REPO = Path(__file__).resolve().parents[1]
SPEED_STUDY = "gpu-check-speed"
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
CHECKPOINTING = "actor_rollout_ref.model.enable_gradient_checkpointing"
REPEATS = 2  # seeds confirm re-measures on (study.throughput.repeats = max_repeats: no more, to fit the time budget)
STEPS = 3  # per run: 1 warm-up step, 2 measured
MIN_SPEEDUP = 1.2  # the pick's geometric-mean paired ratio over the poor config, at least
POOR = {MICRO: 2, CHECKPOINTING: True}
PICK = {"cuda": {MICRO: 32, CHECKPOINTING: False}, "cpu": {MICRO: 16, CHECKPOINTING: False}}
# the task, cut to STEPS steps without validation; CUDA: 16 prompts x 4 answers = 64 samples a step, 64 new tokens,
# two mini-batches of 32 samples (the pick: one micro-batch each; the poor config: 16 each)
FIXED = {
    "cuda": {"data.train_batch_size": 16, "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
             "data.max_response_length": 64},
    # the dry run's plan (32 samples, mini-batch 16, one epoch), one torch thread: a few minutes on 2 busy cores
    "cpu": {"data.train_batch_size": 32, "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
            "actor_rollout_ref.actor.ppo_epochs": 1, "trainer.cpu_threads": 1},
}
# the same-math check's tolerance: verl_core's first step reproduces on the CPU (fp32); under bf16 autocast the
# kernels of other batch shapes round differently (the value of docs/verl.md's example; not measured on a GPU yet)
TOLERANCE = {"cuda": 0.02, "cpu": 0.001}
CONFIGS = {"cuda": "smollm2_addition", "cpu": "tiny_arith"}


def speed_experiment(plan: Plan) -> dict[str, Any]:
    """The experiment file's content: one search trial (the pick), ``study.baseline`` the poor config."""
    dev, pick = plan.device, PICK[plan.device]
    return {
        "config": CONFIGS[dev],
        "overrides": {"trainer.total_training_steps": STEPS, "trainer.test_freq": -1, "trainer.val_before_train": False,
                      "trainer.seed": 1, "trainer.device": dev, "evaluation.latency.enable": False,
                      "evaluation.toxicity.enable": False, **FIXED[dev]},
        "params": {"micro": {"key": MICRO, "type": "categorical", "choices": [pick[MICRO]]},
                   "checkpointing": {"key": CHECKPOINTING, "type": "categorical", "choices": [pick[CHECKPOINTING]]}},
        "objective": {"metric": "perf/throughput", "direction": "maximize", "aggregate": "mean"},
        "study": {"kind": "throughput", "n_trials": 1, "sampler": {"type": "random", "seed": 0},
                  "throughput": {"warmup_steps": 1, "repeats": REPEATS, "max_repeats": REPEATS, "top_k": 1,
                                 "tolerance": TOLERANCE[dev]},
                  "baseline": dict(POOR)},
        "trial": {"n_jobs": 1, "timeout_s": 300},
    }


def speed_commands(space_file: Path, studies: Path) -> tuple[list[str], list[str]]:
    """``search`` of the experiment file, then ``confirm`` of its study."""
    common = ["--study", SPEED_STUDY, "--studies-dir", str(studies)]
    return ([sys.executable, "-m", "hpo", "search", "--space", str(space_file), *common],
            [sys.executable, "-m", "hpo", "confirm", *common])


# ----------------------------------------------------------------------------- facts and rows (pure)
@dataclass
class SpeedFacts:
    """The search and its confirmation as :func:`ratio_row` judges them."""

    search_exit: int | None = None
    confirm_exit: int | None = None
    error: str = ""
    order: list[str] = field(default_factory=list)  # the confirmation runs in the order they ran: poor, control, pick
    pairs: list[tuple[int, float, float]] = field(default_factory=list)  # (seed, pick's value, poor's value)
    ratio: float | None = None  # the geometric mean of the paired ratios (> 1: the pick is faster)
    low: float | None = None
    high: float | None = None
    same_math: bool | None = None
    disagreements: list[str] = field(default_factory=list)
    control: str = ""  # what the control says about the same-math check (confirm's line)
    verdict: str = ""  # confirm's "recommended: ..." line
    failed: int = 0  # runs of the pick without a value
    pending: int = 0
    seconds: float = 0.0


def ratio_row(f: SpeedFacts, pick: str, poor: str) -> Check:
    """``ok`` when both commands exited 0, :data:`REPEATS` pairs ran, each pair's pick is faster, the geometric mean
    ratio is at least :data:`MIN_SPEEDUP` and the first updates agree (module docstring)."""
    c = Check("throughput ratio", seconds=f.seconds)
    problems = [f.error] if f.error else []
    for what, code in (("search", f.search_exit), ("confirm", f.confirm_exit)):
        if code not in (0, None) and not f.error:
            problems.append(f"{what} exit {code}")
    if len(f.pairs) < REPEATS:
        problems.append(f"{len(f.pairs)} paired run(s) of {REPEATS}"
                        + (f" ({f.failed} run(s) of the pick failed)" if f.failed else "")
                        + (f", {f.pending} still to run" if f.pending else ""))
    slower = [seed for seed, a, b in f.pairs if not a > b]
    if slower:
        problems.append(f"the pick was not faster on seed(s) {slower}")
    if f.ratio is not None and f.ratio < MIN_SPEEDUP:
        problems.append(f"speed-up {f.ratio:.2f}x below {MIN_SPEEDUP}x")
    if f.same_math is False:
        problems.append("same math: DIFFERS (" + "; ".join(f.disagreements[:3]) + ")")
    elif f.same_math is None and f.pairs:
        problems.append("same math: not checked (no first step logged by both)")
    parts = [f"pick ({pick}) vs poor ({poor})"]
    if f.ratio is not None:
        shown = "" if f.low is None or f.high is None else f" [{f.low:.2f}, {f.high:.2f}]"
        sep = "separated" if f.low is not None and f.high is not None and (f.low > 1 or f.high < 1) else \
            "not separated"
        parts.append(f"{f.ratio:.2f}x{shown} over {len(f.pairs)} paired runs ({sep}); tokens/s "
                     + ", ".join(f"{a:.0f} vs {b:.0f}" for _, a, b in f.pairs))
    if f.order:
        parts.append("order " + ", ".join(f.order))
    if f.same_math:
        parts.append("same math: agrees")
    if f.control:
        parts.append(f.control)
    if f.verdict:
        parts.append(f"confirm: {f.verdict}")
    c.status = "FAIL" if problems else "ok"
    c.detail = "; ".join(parts + problems)
    c.data = dataclasses.asdict(f)
    return c


@dataclass(frozen=True)
class RunHealth:
    """One run of the confirmation: its health labels and the means they are judged on (None: not logged)."""

    number: int
    role: str  # poor | control | pick
    labels: tuple[str, ...] | None  # trial user attr ``health`` (None: the driver recorded none)
    gpu: bool  # the run was handed a GPU (CUDA_VISIBLE_DEVICES in its command.json)
    util: float | None  # mean GPU utilisation (%) over the steps after the first
    gen_share: float | None  # mean timing_s/gen / timing_s/step over the steps after the first


def _expected(r: RunHealth, util_low: float, gen_fraction: float) -> set[str]:
    """The labels the thresholds give for the logged means (the two this row judges)."""
    out = set()
    if r.gpu and r.util is not None and r.util < util_low:
        out.add("gpu_underused")
    if r.gen_share is not None and r.gen_share >= gen_fraction:
        out.add("generation_bound")
    return out


def _mean_text(r: list[RunHealth], what: str) -> str:
    vals = [getattr(x, what) for x in r if getattr(x, what) is not None]
    if not vals:
        return "not logged"
    m = statistics.fmean(vals)
    return f"{m:.0f}%" if what == "util" else f"{100 * m:.0f}% of the step"


def health_row(runs: list[RunHealth], util_low: float, gen_fraction: float, cuda: bool) -> Check:
    """``ok`` when every poor run carries its health labels, each run's ``gpu_underused`` / ``generation_bound`` are
    those its logged means give at the thresholds, and on CUDA each poor run had a GPU and logged its utilisation."""
    c = Check("speed health")
    poor = [r for r in runs if r.role in ("poor", "control")]
    problems = [] if poor else ["no run of the poor config finished"]
    judged = ("gpu_underused", "generation_bound")
    for r in runs:
        if r.labels is None:
            if r.role != "pick":
                problems.append(f"run {r.number} ({r.role}) has no health labels recorded")
            continue
        got, want = {lb for lb in r.labels if lb in judged}, _expected(r, util_low, gen_fraction)
        if got != want:
            problems.append(f"run {r.number} ({r.role}) labelled {sorted(got) or 'none'} but its means give "
                            f"{sorted(want) or 'none'} (util {r.util}, gen share {r.gen_share})")
    if cuda:
        problems += [f"run {r.number} ({r.role}) was handed no GPU" for r in poor if not r.gpu]
        problems += [f"run {r.number} ({r.role}) logged no perf/gpu_util (NVML): gpu_underused cannot fire"
                     for r in poor if r.gpu and r.util is None]

    def group(rs: list[RunHealth], name: str) -> str:
        labels = sorted({lb for r in rs for lb in (r.labels or ())})
        gpu = f"GPU util {_mean_text(rs, 'util')}, " if any(r.gpu for r in rs) else "no GPU, "
        return (f"{name}: {', '.join(labels) or 'no label'} ({gpu}gen {_mean_text(rs, 'gen_share')}; "
                f"{len(rs)} run(s))")

    parts = [group(poor, "poor config")]
    pick = [r for r in runs if r.role == "pick"]
    if pick:
        parts.append(group(pick, "pick"))
    parts.append(f"thresholds util < {util_low:g}%, gen >= {100 * gen_fraction:g}%")
    c.status = "FAIL" if problems else "ok"
    c.detail = "; ".join(parts + problems)
    c.data = {"runs": [dataclasses.asdict(r) for r in runs], "util_low": util_low, "gen_fraction": gen_fraction}
    return c


# ----------------------------------------------------------------------------- reading the study
def _number(d: dict[str, Any], metric: str | None) -> float | None:
    x = d.get(metric) if metric else None
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _util(d: dict[str, Any], names: Any) -> float | None:
    """A step's GPU utilisation (%) as the diagnosis reads it: ``gpu_util``, else ``mfu`` x 100."""
    util, mfu = _number(d, names.gpu_util), _number(d, names.mfu)
    return util if util is not None else None if mfu is None else 100.0 * mfu


def _gen_share(d: dict[str, Any], names: Any) -> float | None:
    gen, step = _number(d, names.gen_time), _number(d, names.step_time)
    return gen / step if gen is not None and step else None


def _mean(values: list[float | None]) -> float | None:
    known = [x for x in values if x is not None]
    return statistics.fmean(known) if known else None


def run_health(t: Any, role: str, names: Any) -> RunHealth:
    """A confirmation run's :class:`RunHealth` from its user attrs, its command.json and its metrics file."""
    tdir = Path(str(t.user_attrs.get("trial_dir", "")))
    try:
        env = json.loads((tdir / "command.json").read_text()).get("env", {})
    except (OSError, ValueError):
        env = {}
    # the training lines after the first (the diagnosis judges those: the first compiles and warms up)
    steps = [d for _, d in read_steps(tdir / "metrics.jsonl") if (_number(d, names.step_time) or 0) > 0][1:]
    labels = t.user_attrs.get("health")
    return RunHealth(t.number, role, tuple(labels) if isinstance(labels, list) else None,
                     bool(str(env.get("CUDA_VISIBLE_DEVICES", "")).strip()),
                     _mean([_util(d, names) for d in steps]), _mean([_gen_share(d, names) for d in steps]))


def study_facts(space_file: Path, studies: Path, facts: SpeedFacts) -> list[RunHealth]:
    """Fill ``facts`` from the stored study (``speed_report``: the pairs, the ratio, the same-math check, confirm's
    lines); the confirmation runs' :class:`RunHealth`, in the order they ran."""
    import optuna

    from hpo.backends import backend_of, load_space
    from hpo.record import ATTR_CONFIRM_OF, is_confirm
    from hpo.reporting._speed import speed_lines, speed_report
    from hpo.study._confirm import BASELINE_OF, CONTROL_OF

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(str(space_file), check=False)
    study = optuna.load_study(study_name=SPEED_STUDY, storage=f"sqlite:///{studies / (SPEED_STUDY + '.db')}")
    report = speed_report(study, space)
    if report is not None:
        lines = speed_lines(report, space)
        facts.control = next((x for x in lines if x.startswith("control")), "")
        facts.verdict = next((x for x in lines if x.startswith("recommended")), "")
        facts.pending = report.pending
        if report.picks:
            p = report.picks[0]
            facts.pairs, facts.ratio, facts.low, facts.high = list(p.pairs), p.ratio, p.low, p.high
            facts.same_math, facts.disagreements, facts.failed = p.same_math, list(p.disagreements), p.failed
    names, runs = backend_of(space).metrics, []
    for t in sorted((t for t in study.get_trials(deepcopy=False) if is_confirm(t)), key=lambda t: t.number):
        of = t.system_attrs.get(ATTR_CONFIRM_OF)
        role = "poor" if of == BASELINE_OF else "control" if of == CONTROL_OF else "pick"
        facts.order.append(role)
        if t.state == optuna.trial.TrialState.COMPLETE:
            runs.append(run_health(t, role, names))
    return runs


def _run(argv: list[str], cwd: Path, log: Path, timeout_s: float) -> int:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.run(argv, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout_s).returncode


def check_throughput(plan: Plan, work: Path, timeout_s: float = 900.0) -> list[Check]:
    """The part's two rows: the experiment file written to ``work``, its search and confirm run, the study read."""
    space_file, studies, log = work / f"{SPEED_STUDY}.yaml", work / "studies", work / f"{SPEED_STUDY}.log"
    space_file.write_text("# benchmarks/gpu_check.py's throughput part: the pick as the one trial, the poor config as "
                          "study.baseline\n" + yaml.safe_dump(speed_experiment(plan), sort_keys=False))
    search, confirm = speed_commands(space_file, studies)
    print(f"[gpu-check] throughput: {' '.join(search[1:])}; then {' '.join(confirm[1:])}", file=sys.stderr,
          flush=True)
    facts, t0 = SpeedFacts(), time.time()
    try:
        facts.search_exit = _run(search, work, log, timeout_s)
        if facts.search_exit == 0:
            facts.confirm_exit = _run(confirm, work, log, timeout_s)
        else:
            facts.error = f"search exit {facts.search_exit}: {last_line_of(log.read_text(errors='replace'))}"
    except subprocess.TimeoutExpired as err:
        facts.error = f"{' '.join(err.cmd[1:4])} ran over {timeout_s:.0f} s"
    facts.seconds = time.time() - t0
    if facts.confirm_exit not in (0, None) and not facts.error:
        facts.error = f"confirm exit {facts.confirm_exit}: {last_line_of(log.read_text(errors='replace'))}"
    runs = study_facts(space_file, studies, facts) if (studies / f"{SPEED_STUDY}.db").exists() else []
    print(log.read_text(errors="replace")[-4000:], file=sys.stderr, flush=True)
    pick, poor = _setting(PICK[plan.device]), _setting(POOR)
    health = health_row(runs, *_thresholds(space_file), cuda=plan.device == "cuda")
    return [ratio_row(facts, pick, poor), health]


def _setting(values: dict[str, Any]) -> str:
    return f"micro-batch {values[MICRO]}, checkpointing {'on' if values[CHECKPOINTING] else 'off'}"


def _thresholds(space_file: Path) -> tuple[float, float]:
    from hpo.backends import load_space

    spec = load_space(str(space_file), check=False).diagnosis
    return float(spec.util_low), float(spec.gen_fraction)


