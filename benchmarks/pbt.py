"""Population-based training against TPE and random search at equal total trainer steps, on the default task and
on a variant where a schedule should beat every constant.

Every method searches ``kl_coef`` in [0.01, 2] and ``actor_lr`` in [1e-7, 3e-3] (both log; ``kl_lr``'s ranges) for
a policy trained ``task.horizon`` steps (``trainer.test_freq`` = ``task.interval``), with pruning and early stopping
off so that each method spends exactly its budget of trainer steps:

* PBT: ``search_spaces/pbt_kl_lr.yaml``, ``POPULATION`` members x ``horizon`` steps in segments of ``interval``.
* TPE and random: ``search_spaces/kl_lr.yaml`` scored by its last evaluation, ``horizon`` steps a trial; their
  best after the first ``POPULATION`` trials is the equal-budget figure. Random runs ``2 x POPULATION`` trials,
  TPE ``3 x POPULATION`` (its first ``POPULATION``, then ``resume --n-trials``), so that PBT's budget is under 60%
  of TPE's whole one (the goal's first clause) even where early-stopped trials shorten TPE's.
* PBT's initial population and TPE's start-up trials are the same Latin hypercube for a search seed
  (``study.pbt.seed`` = ``study.sampler.seed``): a paired comparison, where a difference is what each does after
  the same start and not the luck of the draw.

The value of a method is the best final objective (greedy accuracy at step ``horizon``) of a trial (TPE, random)
or of a member that reached the last step (PBT); the trainer steps used are summed over the trials (segments)
from each one's first step to its last. Over ``SEEDS`` search seeds (sampler seed, PBT seed; the trainer seed stays
1), median and min-max. Goal (issue 24): PBT matches TPE's median best with at most 60% of its trainer steps, or
beats it at equal budget.

Tasks (``TASKS``): ``default`` (tiny_arith); ``late``, the same with no exploit before step 10 (half the run);
``noisy``, the same with 40% of the training rewards flipped (``benchmarks/noisy_reward.py``; measured: no schedule
tried beat the best constant there); and ``late_noise``, where the training reward turns into a coin flip after
step 8 (``benchmarks/late_noise_reward.py``): a schedule (large learning rate for the clean steps, near zero after)
should beat every constant, which :func:`constants_vs_schedule` checks first (a grid of constants and the schedule
on 3 trainer seeds).

Run alone: ``python -m benchmarks.pbt [--smoke] [TASK ...]``; from ``benchmarks/run.py`` (part ``pbt``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, Row, hpo_cli, log, main_python, make_row

POPULATION = 4
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Task:
    """A task the methods are compared on: trainer overrides, each member's / trial's steps, the PBT interval
    (also the evaluation period, so every segment ends with an evaluation)."""

    name: str
    what: str
    horizon: int
    interval: int
    overrides: tuple[str, ...] = ()
    confirm: bool = True  # PBT's and TPE's picks confirmed on fresh seeds, scored on the held-out test split
    confirm_seeds: int = 3  # fresh trainer seeds per confirmed pick
    burn_in: int | None = None  # steps before a member may exploit (None: one interval)
    schedule: tuple[tuple[int, float], ...] = ()  # a hand schedule ((until step, lr), ...) to check against constants


TASKS = {
    "default": Task("default", "default task", 20, 5),
    # The default task with exploits from half-way on: does a later first selection keep the slow, better starters?
    "late": Task("late", "default task, exploits from step 10 on (burn-in 10)", 20, 5, burn_in=10),
    "noisy": Task("noisy", "noisy-reward variant: 40% of training rewards flipped (benchmarks/noisy_reward.py)", 20, 4,
                  (f"custom_reward_function.path={REPO / 'benchmarks' / 'noisy_reward.py'}",)),
    # The training reward is a coin flip after step 8: a large learning rate for 8 steps, then near zero, should win.
    "late_noise": Task("late_noise", "schedule variant: the training reward is a coin flip after step 8 "
                       "(benchmarks/late_noise_reward.py)", 20, 4,
                       (f"custom_reward_function.path={REPO / 'benchmarks' / 'late_noise_reward.py'}",),
                       schedule=((8, 2.4e-5), (20, 1e-6))),
}
SMOKE_TASK = Task("smoke", "smoke", 4, 2, confirm_seeds=1)
GRID_LR = (3e-6, 6e-6, 1.2e-5, 2.4e-5, 5e-5, 1e-4, 2e-4)  # constants of constants_vs_schedule (actor lr)
GRID_KL = (0.01, 0.1)  # and kl_coef
GRID_SEEDS = (11, 12, 13)  # its trainer seeds


def common(task: Task) -> list[str]:
    """Every method's overrides: the task's, its budget, no pruning or early stopping (each method spends exactly its
    budget), and the final evaluation as the value (``aggregate: last``, what PBT's members are compared by)."""
    return [*task.overrides, f"trainer.total_training_steps={task.horizon}", f"trainer.test_freq={task.interval}",
            "early_stopping.enabled=false", "study.pruner.type=none", "trial.n_jobs=2", "trainer.cpu_threads=1"]


def _study(studies: Path, study: str) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.load_study(study_name=study, storage=f"sqlite:///{studies / (study + '.db')}")


def _run(studies: Path, study: str, space: str, overrides: list[str]) -> list[Any]:
    hpo_cli(["search", "--space", space, "--study", study, *(a for o in overrides for a in ("--override", o))],
            studies)
    return list(_study(studies, study).trials)


def confirm_pick(studies: Path, study: str, seeds: int) -> dict[str, Any]:
    """``verl-hpo confirm --top 1 --seeds SEEDS`` on the study's pick (the best search trial; for PBT the
    winning lineage's schedule, re-run from scratch), and that pick's confirmed validation and held-out test means:
    the value a user gets, free of the selection bias of the best of several noisy evaluations."""
    from hpo.study._confirm import confirmed, top_trials

    # --trust-stored-experiment: a task's reward file (custom_reward_function.path, a code key) is this benchmark's
    hpo_cli(["confirm", "--study", study, "--top", "1", "--seeds", str(seeds), "--trust-stored-experiment"], studies)
    st = _study(studies, study)
    top = top_trials(st, 1)
    done = {c.trial.number: c for c in confirmed(st)}
    c = done.get(top[0].number) if top else None
    if c is None and done:  # PBT: the confirmed entry is the winning lineage's last segment
        c = next(iter(done.values()))
    if c is None or not c.test_values:
        return {"trial": None, "test": None, "val": None, "test_values": []}
    return {"trial": c.trial.number, "params": dict(c.trial.params), "test": c.test_mean, "val": c.mean,
            "test_values": list(c.test_values), "val_values": list(c.values)}


def _steps(t: Any) -> int:
    return int(t.user_attrs.get("last_step") or 0) - int(t.system_attrs.get("pbt:start", 0))


def pbt_once(studies: Path, task: Task, seed: int, population: int) -> dict[str, Any]:
    trials = _run(studies, f"{task.name}-pbt-{population}-{seed}", "search_spaces/pbt_kl_lr.yaml",
                  [*common(task), f"study.pbt.population={population}", f"study.pbt.interval_steps={task.interval}",
                   f"study.pbt.burn_in_steps={task.burn_in or task.interval}", f"study.pbt.seed={seed}"])
    finals = [t.values[0] for t in trials if t.state.name == "COMPLETE" and t.values
              and t.system_attrs.get("pbt:end") == task.horizon and t.user_attrs.get("last_step") == task.horizon]
    exploits = sum(t.system_attrs.get("pbt:action") == "exploit" for t in trials)
    rollbacks = sum(t.system_attrs.get("pbt:action") == "rollback" for t in trials)
    out = {"best": max(finals) if finals else None, "steps": sum(_steps(t) for t in trials),
           "segments": len(trials), "exploits": exploits, "rollbacks": rollbacks}
    if task.confirm:
        out["confirmed"] = confirm_pick(studies, f"{task.name}-pbt-{population}-{seed}", task.confirm_seeds)
    return out


def optuna_once(studies: Path, task: Task, seed: int, sampler: str, n_first: int, n_trials: int,
                confirm: bool = False) -> dict[str, Any]:
    """``n_trials`` trials of ``sampler``, their best after the first ``n_first`` (``*_half``: PBT's budget) and
    after all. With ``confirm``: the study runs its first ``n_first``, its pick is confirmed, then it is resumed to
    ``n_trials`` (``resume --n-trials``, as a user extends a study) and the pick of the whole study is confirmed."""
    name = f"{task.name}-{sampler}-{seed}"
    over = [*common(task), "objective.aggregate=last", "objective.k=null", f"study.sampler.type={sampler}",
            f"study.sampler.seed={seed}", "study.baseline=null"]
    picks: dict[str, Any] = {}
    if confirm:
        _run(studies, name, "kl_lr", [*over, f"study.n_trials={n_first}"])
        picks["confirmed_half"] = confirm_pick(studies, name, task.confirm_seeds)
        hpo_cli(["resume", "--study", name, "--n-trials", str(n_trials), "--trust-stored-experiment"], studies)
        picks["confirmed"] = confirm_pick(studies, name, task.confirm_seeds)
        trials = list(_study(studies, name).trials)
    else:
        trials = _run(studies, name, "kl_lr", [*over, f"study.n_trials={n_trials}"])
    trials = [t for t in trials if t.user_attrs.get("stop_reason") != "surplus" and "confirm_of" not in t.user_attrs]

    def best(upto: int) -> float | None:
        vals = [t.values[0] for t in trials[:upto] if t.state.name == "COMPLETE" and t.values]
        return max(vals) if vals else None

    return {"best_half": best(n_first), "best": best(n_trials), "n_trials": n_trials,
            "steps_half": sum(_steps(t) for t in trials[:n_first]), "steps": sum(_steps(t) for t in trials),
            **picks}


def train_run(out: Path, task: Task, seed: int, lrs: tuple[tuple[int, float], ...], kl: float) -> float | None:
    """One trainer run of ``task`` from scratch (``python -m verl_core train``) with the actor learning rate
    ``lr`` up to each ``until`` step of ``lrs`` (one constant: one entry; a schedule: a resumed segment per entry,
    the way PBT's segments and a confirmed schedule run), and its validation reward at the last step."""
    import subprocess

    out.mkdir(parents=True)
    start, value = 0, None
    for i, (until, lr) in enumerate(lrs):
        metrics = out / f"metrics-{i}.jsonl"
        argv = [main_python(), "-m", "verl_core", "train", "--config", "tiny_arith", "--metrics-file", str(metrics),
                *task.overrides, f"trainer.total_training_steps={until}", f"trainer.test_freq={task.interval}",
                "trainer.cpu_threads=1", f"trainer.seed={seed}", f"trainer.default_local_dir={out / 'ckpt'}",
                f"trainer.save_freq={until if until < task.horizon else -1}", f"actor_rollout_ref.actor.optim.lr={lr}",
                f"algorithm.kl_ctrl.kl_coef={kl}",
                *(["trainer.resume_mode=resume_path",
                   f"trainer.resume_from_path={out / 'ckpt' / f'global_step_{start}'}"] if start
                  else ["trainer.resume_mode=disable"])]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            log(f"  trainer failed ({lrs}, kl {kl}, seed {seed}): {done.stderr.strip()[-300:]}")
            return None
        start = until
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("step") == task.horizon and "eval/reward_mean" in rec.get("data", {}):
            value = float(rec["data"]["eval/reward_mean"])
    return value


def constants_vs_schedule(task: Task, tmp: Path) -> tuple[list[Row], dict[str, Any]]:
    """Does ``task.schedule`` beat every constant setting? Every (lr, kl_coef) of ``GRID_LR`` x ``GRID_KL`` held for
    the whole run, and the schedule (at the grid's kl_coef the best constant used), each on ``GRID_SEEDS``; scored by
    the validation reward at the last step, mean over the seeds. The best constant is the best of 14 means, an
    upward-biased figure, so the check is conservative."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(lr, kl, seed) for lr in GRID_LR for kl in GRID_KL for seed in GRID_SEEDS]
    with ThreadPoolExecutor(2) as pool:
        vals = list(pool.map(lambda j: train_run(tmp / f"grid-{task.name}-{j[0]}-{j[1]}-{j[2]}", task, j[2],
                                                 ((task.horizon, j[0]),), j[1]), jobs))
    consts: dict[tuple[float, float], list[float]] = {}
    for (lr, kl, _), v in zip(jobs, vals):
        consts.setdefault((lr, kl), []).append(0.0 if v is None else v)
    (best_lr, best_kl), best = max(consts.items(), key=lambda kv: statistics.mean(kv[1]))
    with ThreadPoolExecutor(2) as pool:
        sched = list(pool.map(lambda seed: train_run(tmp / f"sched-{task.name}-{seed}", task, seed, task.schedule,
                                                     best_kl), GRID_SEEDS))
    sched_v = [0.0 if v is None else v for v in sched]
    plan = ", ".join(f"lr {lr:g} to step {until}" for until, lr in task.schedule)
    row = make_row("hand schedule vs the best constant setting: validation reward at the last step", "acc",
                   sched_v, best, group=f"population-based training ({task.what})",
                   note=f"schedule {plan} (kl_coef {best_kl:g}) vs the best of {len(consts)} constants (lr "
                        f"{', '.join(f'{x:g}' for x in GRID_LR)} x kl_coef {', '.join(f'{x:g}' for x in GRID_KL)}: "
                        f"lr {best_lr:g}, kl_coef {best_kl:g}), each on trainer seeds "
                        f"{', '.join(map(str, GRID_SEEDS))}; per seed schedule "
                        f"{' / '.join(f'{v:.3f}' for v in sched_v)}, best constant "
                        f"{' / '.join(f'{v:.3f}' for v in best)}")
    means = {f"lr={lr:g},kl={kl:g}": round(statistics.mean(v), 4) for (lr, kl), v in consts.items()}
    return [row], {"constants": means, "best_constant": {"lr": best_lr, "kl_coef": best_kl, "values": best},
                   "schedule": {"plan": [list(x) for x in task.schedule], "kl_coef": best_kl, "values": sched_v}}


def compare(task: Task, seeds: tuple[int, ...], pop: int, tmp: Path) -> tuple[list[Row], dict[str, Any]]:
    """PBT, TPE and random on ``task`` for each search seed, and their rows."""
    runs: dict[str, list[dict[str, Any]]] = {"pbt": [], "tpe": [], "random": []}
    for seed in seeds:
        for kind in ("pbt", "tpe", "random"):
            log(f"pbt bench: {task.name}: {kind} seed {seed}")
            res = (pbt_once(tmp, task, seed, pop) if kind == "pbt" else
                   optuna_once(tmp, task, seed, kind, pop, (3 if kind == "tpe" else 2) * pop,
                               confirm=task.confirm and kind == "tpe"))
            log(f"  {res}")
            runs[kind].append(res)
    g = f"population-based training ({task.what})"

    def col(kind: str, key: str) -> list[float]:
        return [float(r[key]) for r in runs[kind] if r[key] is not None]

    def per_seed(kind: str, key: str) -> str:
        return " / ".join("-" if r[key] is None else f"{r[key]:.3f}" for r in runs[kind])

    pbt_best, tpe_half, tpe_all = col("pbt", "best"), col("tpe", "best_half"), col("tpe", "best")
    share = statistics.median(col("pbt", "steps")) / max(statistics.median(col("tpe", "steps")), 1)
    med = statistics.median
    met = (pbt_best and tpe_all and med(pbt_best) >= med(tpe_all) and share <= 0.6) or \
        (pbt_best and tpe_half and med(pbt_best) > med(tpe_half))
    note_eq = (f"{pop} members x {task.horizon} steps (segments of {task.interval}, exploits from step "
               f"{task.burn_in or task.interval}, Latin-hypercube start) vs the "
               f"first {pop} trials x {task.horizon} steps; value = the evaluation at step {task.horizon}; search "
               f"seeds {', '.join(map(str, seeds))}")
    rows = [
        make_row("best final objective at equal trainer steps: PBT vs TPE", "acc", pbt_best, tpe_half, group=g,
                 note=f"{note_eq}; per seed PBT {per_seed('pbt', 'best')}, TPE {per_seed('tpe', 'best_half')} (TPE's "
                      f"first {pop} trials are its Latin-hypercube start-up, the points PBT's members start from: at "
                      f"this budget TPE is that design without a model, and PBT's difference is its exploits)"),
        make_row("best final objective at equal trainer steps: PBT vs random", "acc", pbt_best,
                 col("random", "best_half"), group=g, note=f"{note_eq}; per seed random "
                                                            f"{per_seed('random', 'best_half')}"),
        make_row(f"best final objective: PBT vs TPE with {3 * pop} trials", "acc", pbt_best, tpe_all, group=g,
                 note=f"TPE: {3 * pop} trials x {task.horizon} steps, per seed {per_seed('tpe', 'best')}; PBT uses "
                      f"{share:.0%} of its steps; goal (PBT's median >= TPE's with <= 60% of its steps, or PBT's "
                      f"median above TPE's at equal budget): {'met' if met else 'NOT met'}"),
        make_row("trainer steps used: PBT vs TPE (equal budget)", "steps", col("pbt", "steps"),
                 col("tpe", "steps_half"), higher_is_better=False, group=g,
                 note=f"PBT segments per run {col('pbt', 'segments')}, exploits {col('pbt', 'exploits')}, rollbacks "
                      f"{col('pbt', 'rollbacks')}; an exploit resumes at the donor's step, so PBT can use more than "
                      f"{pop} x {task.horizon}"),
    ]
    met_test = None
    if task.confirm:
        def conf(kind: str, key: str) -> list[float]:
            return [float(r[key]["test"]) for r in runs[kind] if r.get(key) and r[key]["test"] is not None]

        def conf_seed(kind: str, key: str) -> str:
            return " / ".join("-" if not r.get(key) or r[key]["test"] is None else f"{r[key]['test']:.3f}"
                              for r in runs[kind])

        p_test, t_half, t_all = conf("pbt", "confirmed"), conf("tpe", "confirmed_half"), conf("tpe", "confirmed")
        met_test = bool((p_test and t_all and med(p_test) >= med(t_all) and share <= 0.6)
                        or (p_test and t_half and med(p_test) > med(t_half)))
        note_c = (f"each method's pick (PBT: the winning lineage's schedule, re-run from scratch; TPE: its best "
                  f"trial) confirmed on {task.confirm_seeds} fresh trainer seeds, mean held-out test reward (225 "
                  f"problems no search saw) at step {task.horizon}: no selection bias from the best of several noisy "
                  f"evaluations")
        rows += [
            make_row("confirmed test reward of the pick at equal trainer steps: PBT vs TPE", "acc", p_test, t_half,
                     group=g, note=f"{note_c}; TPE after its first {pop} trials; per seed PBT "
                                   f"{conf_seed('pbt', 'confirmed')}, TPE {conf_seed('tpe', 'confirmed_half')}"),
            make_row(f"confirmed test reward of the pick: PBT vs TPE with {3 * pop} trials", "acc", p_test, t_all,
                     group=g, note=f"{note_c}; TPE resumed to {3 * pop} trials (resume --n-trials), PBT uses "
                                   f"{share:.0%} of its steps; per seed TPE "
                                   f"{conf_seed('tpe', 'confirmed')}; goal on this measure (PBT's median >= TPE's "
                                   f"with <= 60% of its steps, or above TPE's at equal budget): "
                                   f"{'met' if met_test else 'NOT met'}"),
        ]
    return rows, {"runs": runs, "task": task.name, "horizon": task.horizon, "interval": task.interval,
                  "population": pop, "goal_met": bool(met), "goal_met_confirmed_test": met_test}


def bench(smoke: bool, workdir: Path | None = None, tasks: tuple[str, ...] = tuple(TASKS)
          ) -> tuple[list[Row], dict[str, Any]]:
    seeds = SEEDS[:1] if smoke else SEEDS
    pop = 2 if smoke else POPULATION  # smoke: the plumbing only, 2 members / 4 trials x 4 steps
    rows: list[Row] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pbt-", dir=workdir) as tmp:
        for name in (("smoke",) if smoke else tasks):
            task = SMOKE_TASK if smoke else TASKS[name]
            if task.schedule:  # first: is this a task where a schedule wins?
                log(f"pbt bench: {task.name}: constants vs the hand schedule")
                check_rows, check = constants_vs_schedule(task, Path(tmp))
                log(f"  {check}")
                rows += check_rows
            r, d = compare(task, seeds, pop, Path(tmp))
            if task.schedule:
                d["constants_vs_schedule"] = check
            rows += r
            details[name] = d
    return rows, details


if __name__ == "__main__":
    import sys

    rows, details = bench("--smoke" in sys.argv, tasks=tuple(a for a in sys.argv[1:] if a in TASKS) or tuple(TASKS))
    print(json.dumps({"rows": [r.to_json() for r in rows], "details": details}, indent=1, default=str))
