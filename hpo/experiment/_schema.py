"""The schema of an experiment file: the frozen dataclasses a parsed ``search_spaces/<name>.yaml`` is made of
(:class:`Space` and its sections :class:`StudySpec`, :class:`TrialSpec`, :class:`EarlyStopping`, ...; one
:class:`Param` per tuned parameter), each field's default and its metadata (``help``: what it means; ``choices``: the
values the parser accepts), the names of the file's top-level fields, and :func:`format_value` (a value as a trainer
override's right-hand side).

One file defines one experiment: the trainer config it starts from, fixed trainer overrides, the parameters to tune
(Optuna's short distribution form, each mapped to a dotted trainer key), the objective, early stopping, the
diagnosis, the study settings (sampler, pruner, heartbeats, confirmation, PBT), how trials run and the tracking.
Parsing a raw mapping into these is :mod:`hpo.experiment._parse`'s; nothing here reads a file.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from hpo.analysis import DiagnosisSpec
from hpo.experiment._fidelity import FidelitySpec
from hpo.experiment._objective import Objective
from hpo.experiment._ray_spec import EXECUTORS, RaySpec
from hpo.experiment._secrets import env_ref, is_env_ref, is_secret_key, secret_env_name
from hpo.experiment._throughput import ThroughputSpec
from hpo.experiment._tracking import TrackingSpec

MAX_N_JOBS = 256  # trials one driver runs at once (trial.n_jobs, worker --n-jobs): each job is a thread with its
# trial's own threads beside it; 100,000 ended in "can't start new thread" after as many trials as the host allowed


def _meta(help: str, choices: typing.Sequence[Any] | None = None) -> dict[str, Any]:
    return {"help": help, "choices": choices}


# ----------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class EarlyStopping:
    """Stop a trial whose ``metric`` (a spread) stays below ``threshold`` for ``patience`` evaluations.

    A small spread means one of two things, told apart by the objective's value at that point:
    ``converged`` (the objective reached ``min_value``: nothing more to learn) or ``collapsed`` (it did
    not: every answer scores the same low value). Both stop the trial, which completes with its last
    objective value; the ``stop_reason`` user attr says which.

    ``plateau_evals`` (off by default) adds a second rule that needs no spread metric: a trial whose objective
    has not beaten its earlier best by more than ``plateau_min_delta`` for ``plateau_evals`` consecutive
    evaluations stops with ``stop_reason=plateau`` (RL runs that learned what they will learn early spend the
    rest of their budget re-measuring it). Its value is the objective's aggregate so far.
    """

    enabled: bool = field(default=True, metadata=_meta("Off with false."))
    metric: str | None = field(default=None, metadata=_meta(
        "Spread metric watched at evaluations; null = the trainer's (its backend's metrics.spread; none: rule off)."))
    threshold: float = field(default=0.05, metadata=_meta("Small spread while metric < threshold."))
    patience: int = field(default=3, metadata=_meta("Consecutive evaluations below threshold."))
    min_value: float = field(default=0.5, metadata=_meta(
        "Objective floor: a small spread with the objective >= min_value (<= for minimize) is 'converged', "
        "otherwise 'collapsed'."))
    plateau_evals: int | None = field(default=None, metadata=_meta(
        "Stop a trial (stop_reason=plateau) whose objective has not beaten its earlier best by more than "
        "plateau_min_delta for this many consecutive evaluations; null = off."))
    plateau_min_delta: float = field(default=0.0, metadata=_meta("plateau: the improvement that counts."))


@dataclass(frozen=True)
class SamplerSpec:
    """Which Optuna sampler suggests parameters.

    ``tpe`` (default): Optuna 5's TPE, which is multivariate always and imputes running trials' values
    (``constant_liar``) by default, so parallel jobs and workers spread out: no flags needed. ``gp``: Optuna's
    Gaussian-process sampler (constraints, several objectives and running trials handled); usually needs fewer
    trials on small continuous spaces, but it imports torch into the driver (CPU, one GP fit per suggestion),
    the one exception to the driver being torch-free. ``random``: the baseline.
    """

    type: str = field(default="tpe", metadata=_meta("Sampler.", ("tpe", "gp", "random")))
    seed: int | None = field(default=0, metadata=_meta("Base seed; + number of existing trials on resume."))
    n_startup_trials: int = field(default=4, metadata=_meta("TPE / GP: start-up trials before modelling."))
    startup: str = field(default="lhs", metadata=_meta(
        "TPE / GP: how the start-up trials are drawn. lhs: a Latin hypercube from the base seed (each parameter's "
        "range cut into n_startup_trials strata, one trial in each; shared by every driver of the study); random: "
        "independent draws (Optuna's own).", ("lhs", "random")))


@dataclass(frozen=True)
class PrunerSpec:
    type: str = field(default="median", metadata=_meta("Pruner.", ("median", "hyperband", "successive_halving",
                                                                      "none")))
    n_startup_trials: int = field(default=2, metadata=_meta("median: trials before pruning starts."))
    n_min_trials: int = field(default=3, metadata=_meta(
        "median: a trial is compared only at a step where at least this many other trials reported a value. "
        "Plateau and early stopping end the fast learners early, so at late steps only a few slower trials have "
        "values; with Optuna's default of 1 a trial was pruned for being below the single trial left there (0.939 "
        "against 0.948, within the noise)."))
    n_warmup_steps: int = field(default=0, metadata=_meta("median: trainer steps before a trial can be pruned."))
    interval_steps: int = field(default=1, metadata=_meta("median: check every N reported steps."))
    min_resource: int = field(default=1, metadata=_meta("hyperband/successive_halving: min steps."))
    max_resource: int | None = field(default=None, metadata=_meta("hyperband: max steps; null = auto."))
    reduction_factor: int = field(default=3, metadata=_meta("hyperband/successive_halving: eta."))
    n_warmup_evals: int = field(default=0, metadata=_meta(
        "Any pruner: a trial is not pruned before it has reported this many evaluations (RL curves are noisy "
        "and late bloomers look like failures early on); counted in evaluations, not trainer steps."))
    patience: int | None = field(default=None, metadata=_meta(
        "Wrap the pruner in Optuna's PatientPruner: the pruner is asked only once the trial's best over its last "
        "patience + 1 evaluations is below its earlier best (by more than min_delta); a trial still improving or "
        "on a plateau is never pruned; null = off."))
    min_delta: float = field(default=0.0, metadata=_meta("patience: the drop below the earlier best that counts."))


@dataclass(frozen=True)
class ConfirmSpec:
    """``verl-hpo confirm``: re-run the top trials with fresh seeds (as tagged trials of the same study).

    Confirmation seeds are ``seed_base, seed_base + 1, ...``, skipping every seed the tuning trials used (the
    fixed ``seed_key`` override, the trainer's default, or a tuned seed's whole range), so tuning and
    confirmation seeds never overlap."""

    top_k: int = field(default=3, metadata=_meta("Trials to confirm (best first)."))
    seeds: int = field(default=3, metadata=_meta("Fresh seeds per confirmed trial (race: at most this many)."))
    race: bool = field(default=False, metadata=_meta(
        "Racing confirmation: the candidates (and the baseline) run seed by seed; after each round a candidate "
        "whose paired 95% interval against the leader lies above 0 is dropped, and the race ends when the leader is "
        "alone (separated), when every other candidate is within +-resolution of it (tied), or at `seeds` (seed "
        "cap); the baseline stops once the improvement over it excludes 0. false = every seed of every candidate "
        "at once."))
    reuse_baseline: bool = field(default=True, metadata=_meta(
        "Reuse the baseline's runs this host already made for the same experiment, seed and trainer version (kept "
        "under <studies>/.baselines/); false = always run them."))
    min_seeds: int = field(default=2, metadata=_meta("race: seeds before anything is dropped or decided (>= 2)."))
    resolution: float | None = field(default=None, metadata=_meta(
        "Confirmed means closer than this do not matter: best prefers the safer, cheaper of settings not separated "
        "only within it (else the better mean wins); a race ends tied when all are within it. null = "
        "early_stopping.plateau_min_delta, else 1% of the best confirmed mean."))
    seed_key: str | None = field(default=None, metadata=_meta(
        "Trainer key of the run's seed; null = the trainer's seed keys (its backend's confirmation.seed_keys; a "
        "trainer without them needs this set)."))
    seed_base: int = field(default=1000, metadata=_meta("First confirmation seed."))
    test_files: str | None = field(default=None, metadata=_meta(
        "Held-out test data of confirmation runs (never seen by the search), set through the trainer's held-out key "
        "(its backend's confirmation.heldout_keys; how the trainer evaluates it: its page under docs/); "
        "null = the trainer's built-in test split where it has one, else none."))
    test_metric: str | None = field(default=None, metadata=_meta(
        "The metric a confirmation run's held-out value is read from; null = the trainer's name for the objective's "
        "metric on the test split (its backend's confirmation.heldout_prefixes). A trainer that names metrics by data "
        "source needs it set to the test file's (its page under docs/); the race and the ranking then use the "
        "validation metric and only the report reads the test one."))
    early_stopping: bool = field(default=False, metadata=_meta(
        "Confirmation runs stop early by the early_stopping rules (plateau, spread) as search trials do; false = "
        "they run the full budget, so the confirmed value measures the setting, not the stopping rule (never "
        "pruned either way; the diagnosis still stops a collapsed run)."))


@dataclass(frozen=True)
class PbtSpec:
    """``study.strategy: pbt``: population-based training (Jaderberg et al. 2017) over the study's trials
    (:mod:`hpo.samplers._pbt`). Each interval of ``interval_steps`` trainer steps of a member is one trial; when it
    ends, a member in the bottom ``quantile`` of the population's latest results takes a top member's checkpoint
    and perturbed hyperparameters (exploit + explore), otherwise it continues its own. A segment stopped by a
    collapse (``collapsed:nan|kl_blowup|entropy_collapse``) restarts from the checkpoint it started from with
    the ``rollback`` rules applied."""

    population: int = field(default=4, metadata=_meta("Members trained side by side."))
    interval_steps: int = field(default=10, metadata=_meta(
        "Trainer steps per segment (one trial); a multiple of trainer.test_freq, so each segment ends with an "
        "evaluation."))
    total_steps: int | None = field(default=None, metadata=_meta(
        "Trainer steps of each member; null = the config's trainer.total_training_steps."))
    burn_in_steps: int = field(default=0, metadata=_meta("No exploit before a member has trained this many steps."))
    quantile: float = field(default=0.25, metadata=_meta(
        "Bottom fraction that exploits, top fraction it copies from (0 < quantile <= 0.5)."))
    resample_probability: float = field(default=0.25, metadata=_meta(
        "Explore: each explored parameter is drawn afresh from its distribution with this probability, else "
        "perturbed (floats: times perturb_down or perturb_up, in log space for log parameters; ints and "
        "categoricals: a neighbouring value)."))
    perturb_down: float = field(default=0.8, metadata=_meta("Explore: the factor below 1."))
    perturb_up: float = field(default=1.25, metadata=_meta("Explore: the factor above 1."))
    explore: tuple[str, ...] | None = field(default=None, metadata=_meta(
        "Parameter names perturbed by explore; null = all (the others are inherited from the donor)."))
    max_rollbacks: int = field(default=2, metadata=_meta(
        "Rollbacks of one member in a row; past it the member exploits a healthy one."))
    rollback: dict[str, str] | None = field(default=None, metadata=_meta(
        "Per collapse label (nan, kl_blowup, entropy_collapse), the parameters to move: 'lr*0.5 kl*2' (parameter "
        "name * factor, clipped to its range); null = lower every learning-rate parameter (optim.lr keys) x0.5, and "
        "raise KL coefficients (kl_coef, kl_loss_coef) x2 on kl_blowup and entropy_coeff x2 on entropy_collapse."))
    init: str = field(default="lhs", metadata=_meta(
        "How the initial population is drawn: lhs = a Latin hypercube (each parameter's range, in log space for log "
        "parameters, cut into `population` equal strata with one member in each; categoricals cycled evenly), so a "
        "small population cannot start with every member in the same region; random = each member drawn "
        "independently.", ("lhs", "random")))
    seed: int = field(default=0, metadata=_meta(
        "Seed of the initial population and of explore. With init lhs the initial population is the Latin "
        "hypercube that TPE and GP start from with study.sampler.seed set to the same value and n_startup_trials = "
        "population, so a PBT study and a sampler study of one seed start from the same points."))


@dataclass(frozen=True)
class StudySpec:
    n_trials: int = field(default=10, metadata=_meta("Finished trials the study runs to."))
    sampler: SamplerSpec = field(default_factory=SamplerSpec, metadata=_meta("Sampler."))
    pruner: PrunerSpec = field(default_factory=PrunerSpec, metadata=_meta("Pruner."))
    heartbeat_interval: int = field(default=10, metadata=_meta("Heartbeat period (s) of running trials."))
    grace_period: int = field(default=30, metadata=_meta(
        "A RUNNING trial without heartbeat this long (s) is stale (its driver is dead): at least twice "
        "heartbeat_interval."))
    max_retry: int | None = field(default=3, metadata=_meta("Retries of an interrupted trial; null = unlimited."))
    budget: float | None = field(default=None, metadata=_meta(
        "Full-run equivalents (a full run = a search trial's trainer steps) the search and its confirmation may "
        "spend together, a cap: the search asks for no new trial, and stops a running one at its evaluation "
        "(stop_reason=budget), once what the study spent plus the confirmation's least (its candidates and baseline "
        "on min_seeds seeds; seeds when not racing) plus one evaluation interval per running trial would pass it, "
        "and a race ends ('budget') when its next round would pass it; null = no limit (--budget sets it)."))
    confirm: ConfirmSpec = field(default_factory=ConfirmSpec, metadata=_meta("verl-hpo confirm defaults."))
    fidelity: FidelitySpec = field(default_factory=FidelitySpec, metadata=_meta(
        "Model-size fidelity: proxy: {overrides: {<model key>: <a smaller model of the same family>, ...}, promote: "
        "4, promote_steps: null, transfer: {<param>: {multiply: F} | {scale_by: hidden_ratio}}, confirm_top: 1, "
        "tie_seeds: 1}: the search runs on the proxy (its best settings within the resolution of each other run "
        "tie_seeds more times on the proxy, on the race's seeds, and rank by their mean), its top `promote` settings "
        "run on the target for promote_steps steps (null: the "
        "first successive-halving rung, else a quarter of the trial's steps) on the confirmation's first seed, saving "
        "a checkpoint there where the trainer can, and the proxy is trusted only if it ranks them as the target "
        "does at that step. Then the confirmation races at most confirm_top of them (the proxy's best first, only "
        "those it cannot tell apart: final proxy values within the resolution of its best; at most promote; and the "
        "target's best at promote_steps when the target has the pick further behind it there than the proxy had, by "
        "more than the resolution), each "
        "one's first seed continuing its promoted run's checkpoint; otherwise the rest of the budget searches on the "
        "target and the race takes confirm.top_k. Parsed "
        "by hpo.experiment._fidelity."))
    baseline: dict[str, Any] = field(default_factory=dict, metadata=_meta(
        "The setting a user would run without a search, as trainer overrides on top of the fixed ones (e.g. the "
        "framework's defaults of the tuned keys); verl-hpo confirm runs it on the same fresh seeds and best "
        "reports the improvement over it; empty = none."))
    strategy: str = field(default="optuna", metadata=_meta(
        "optuna: the sampler suggests each trial's parameters; pbt: population-based training (study.pbt).",
        ("optuna", "pbt")))
    pbt: PbtSpec = field(default_factory=PbtSpec, metadata=_meta("strategy pbt: the population and its rules."))
    kind: str = field(default="learning", metadata=_meta(
        "learning: trials are scored on what the model learns; throughput: on how fast it trains (tokens per second "
        "after study.throughput.warmup_steps), tuning only math-neutral speed keys (hpo/experiment/_throughput.py, "
        "its trainer's docs page, 'Tuning speed').", ("learning", "throughput")))
    throughput: ThroughputSpec = field(default_factory=ThroughputSpec, metadata=_meta(
        "kind throughput: warm-up, the re-measurement of picks and the same-math check."))
    speed_from: str | None = field(default=None, metadata=_meta(
        "A learning study: the name of a throughput study in the same storage whose confirmed pick's speed settings "
        "every trial runs with (verl-hpo best --study <it> --format overrides); null = none."))
    storage_retry_s: float = field(default=300.0, metadata=_meta(
        "Ride out an unreachable storage (a database restart, a full disk) this long (s): storage calls are "
        "retried with backoff and running trials go on; past it the driver exits with one line."))


@dataclass(frozen=True)
class TrialSpec:
    # "": the default trainer; which one that is, which names are accepted, and what each trainer's command, metric
    # names and held-out split are, is the backends' registry's (filled in when an experiment is loaded)
    backend: str = field(default="", metadata=_meta(
        "Trainer: a backend's name, a shipped one (each with its page under docs/) or an installed "
        "plugin's (entry point group verl_hpo.backends; docs/layout.md); unset: the default trainer (the project's "
        "own, docs/trainer.md). Checked against the backends' registry when the experiment is loaded."))
    python: str | None = field(default=None, metadata=_meta(
        "The trainer's interpreter, for backends that run in one of their own; null = the backend's default (its "
        "docs), else the driver's own."))
    command: tuple[str, ...] | None = field(default=None, metadata=_meta(
        "Trainer argv prefix; null = the backend's default command (its default_command)."))
    prepare_command: tuple[str, ...] | None = field(default=None, metadata=_meta("Run once before trials."))
    n_jobs: int = field(default=1, metadata={**_meta(
        f"Trials run in parallel (at most {MAX_N_JOBS}: each is a thread of the driver with its trial's; run more "
        "workers for more)."), "max": MAX_N_JOBS})
    timeout_s: float | None = field(default=None, metadata=_meta("Kill a trial after this many seconds."))
    memory_limit_gb: float | None = field(default=None, metadata=_meta(
        "Hard memory cap of a trial (a cgroup where possible, else a 0.1 s watchdog over peak RSS)."))
    preflight: bool = field(default=True, metadata=_meta(
        "Skip a trial whose memory estimate (its trainer's, where it has one) does not fit its budget "
        "(fail_reason=predicted_oom); a trainer that estimates from its composed config refuses the space at search "
        "when no corner fits."))
    preflight_margin: float = field(default=0.1, metadata=_meta(
        "Pre-flight safety margin: the estimate times (1 + margin) must fit."))
    on_failure: str = field(default="worst", metadata=_meta("worst value or FAIL state.", ("worst", "fail")))
    gpus_per_trial: int = field(default=1, metadata=_meta("Devices per trial (when any are visible)."))
    devices: tuple[str, ...] | None = field(default=None, metadata=_meta("Device ids; null = detect."))
    env: dict[str, str] = field(default_factory=dict, metadata=_meta("Extra environment of trials."))
    keep_checkpoints: int = field(default=0, metadata=_meta(
        "Keep the final checkpoints (a trial's checkpoints/ directory) of the best K finished trials; every other "
        "trial's are deleted once it can no longer be resumed (finished, not interrupted)."))
    executor: str = field(default="local", metadata=_meta(
        "Where trials run: local processes, or ray (each trial a job on a Ray cluster: trial.ray, docs/ray.md).",
        EXECUTORS))
    ray: RaySpec = field(default_factory=RaySpec, metadata=_meta(
        "executor ray: address, per-trial nodes, num_gpus, num_cpus, resources, runtime_env (docs/ray.md)."))


@dataclass(frozen=True)
class Param:
    """One tuned parameter: a readable name, the trainer key it sets and its distribution."""

    name: str
    key: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "categorical":
            assert self.choices is not None
            return CategoricalDistribution(list(self.choices))
        assert self.low is not None and self.high is not None
        if self.type == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def corner_values(self) -> list[Any]:
        """Values worth checking against the trainer config: the ends or every choice."""
        if self.type == "categorical":
            return list(self.choices or ())
        lo, hi = self.low, self.high
        if self.type == "int":
            assert lo is not None and hi is not None
            step = int(self.step or 1)
            return sorted({int(lo), int(lo) + (int(hi) - int(lo)) // step * step})
        return [lo, hi]


@dataclass(frozen=True)
class Space:
    """A parsed experiment file."""

    name: str
    source: str
    config: str
    overrides: dict[str, Any]
    params: tuple[Param, ...]
    objective: Objective = field(default_factory=Objective)
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    diagnosis: DiagnosisSpec = field(default_factory=DiagnosisSpec)
    study: StudySpec = field(default_factory=StudySpec)
    trial: TrialSpec = field(default_factory=TrialSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    # a tuned value is multiplied by this before it reaches the trainer: a proxy run's transfer rules (1 / factor,
    # hpo.experiment._fidelity); empty for every other run
    scale: dict[str, float] = field(default_factory=dict, compare=False)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def fixed_overrides(self) -> dict[str, Any]:
        """The fixed overrides as a trial's argv holds them: a secret's value replaced by a reference to the trial's
        environment variable that carries it (:mod:`hpo.experiment._secrets`)."""
        return {k: env_ref(secret_env_name(k)) if is_secret_key(k) and v is not None and not is_env_ref(v) else v
                for k, v in self.overrides.items()}

    def trainer_overrides(self, values: dict[str, Any]) -> list[str]:
        """Fixed overrides then ``key=value`` for each tuned parameter value (by param name); secrets as references
        (:meth:`fixed_overrides`)."""
        out = [f"{k}={format_value(v)}" for k, v in self.fixed_overrides().items()]
        out += [f"{p.key}={format_value(self.scaled(p, values[p.name]))}" for p in self.params if p.name in values]
        return out

    def scaled(self, p: Param, value: Any) -> Any:
        """``value`` of parameter ``p`` as the trainer gets it: times :attr:`scale` (a proxy run's transfer rule; float
        parameters only)."""
        factor = self.scale.get(p.name)
        if factor is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        return float(value) * factor


# The sections built field by field from the schema (objective, tracking and trial.ray are parsed by their modules).
SECTIONS: dict[str, type] = {
    "early_stopping": EarlyStopping, "diagnosis": DiagnosisSpec, "study": StudySpec, "trial": TrialSpec,
}
TOP_FIELDS = ("config", "overrides", "params", "objective", *SECTIONS, "tracking")
PARAM_FIELDS = ("key", "type", "low", "high", "log", "step", "choices")
ROLLBACK_LABELS = ("nan", "kl_blowup", "entropy_collapse")  # the collapse labels a study.pbt.rollback rule names


def format_value(value: Any) -> str:
    """A value as the right-hand side of a dotted override (YAML scalar syntax)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)
