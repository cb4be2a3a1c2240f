"""The experiment file: ``search_spaces/<name>.yaml`` parsed into a typed, validated :class:`Space`.

One file defines one experiment: the trainer config it starts from, fixed trainer overrides, the
parameters to tune (Optuna's short distribution form, each mapped to a dotted trainer key), the
objective, early stopping, the study settings (sampler, pruner, heartbeats) and how trials run.

Every problem raises :class:`SpaceError`, whose message is one line naming the file (or the
``--override`` it came from), the field and the value. Nothing here touches a study or the disk
beyond reading the file. Trainer keys are checked with ``verl_core.config`` (torch-free) when the
default trial command is used; other commands are trusted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpo.analysis._diagnosis import DiagnosisSpec
from hpo.analysis._files import MAX_FILE_BYTES, FileRefused, check_regular, read_bounded
from hpo.experiment._heldout import check_no_test_split, parse_baseline
from hpo.experiment._objective import Objective, parse_objective
from hpo.experiment._ray_spec import EXECUTORS, RaySpec, parse_ray, split_ray
from hpo.experiment._secrets import env_ref, is_env_ref, is_secret_key, secret_env_name
from hpo.experiment._throughput import ThroughputSpec, check_throughput, throughput_defaults
from hpo.experiment._tracking import TrackingSpec, parse_tracking

SPACES_DIR = Path("search_spaces")
DEFAULT_COMMAND = ("python", "-m", "verl_core", "train")
DEFAULT_PREPARE_COMMAND = ("python", "-m", "verl_core", "prepare")
# The names trial.backend accepts: the trainers hpo.backends knows (hpo.backends.register adds one).
BACKEND_NAMES = ["verl_core", "verl", "trl"]
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class SpaceError(ValueError):
    """A bad experiment file or override; ``str(err)`` is one line for the user."""


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
    metric: str = field(default="eval/reward_std", metadata=_meta("Spread metric watched at evaluations."))
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
        "race: differences smaller than this do not matter (the candidates left are tied); null = "
        "early_stopping.plateau_min_delta, else 1% of the leader's mean."))
    seed_key: str | None = field(default=None, metadata=_meta(
        "Trainer key of the run's seed; null = trainer.seed (verl_core) or data.seed (verl)."))
    seed_base: int = field(default=1000, metadata=_meta("First confirmation seed."))
    test_files: str | None = field(default=None, metadata=_meta(
        "Held-out test data of confirmation runs (never seen by the search). verl_core: data.test_files, evaluated "
        "once at the last step (test/*); null = the built-in task's test split when data.val_files is builtin:<task>, "
        "else none. verl: validated beside data.val_files when test_metric is set, else it replaces data.val_files "
        "in confirmation runs (whose values, the ones the race picks on, are then test values); null = none."))
    test_metric: str | None = field(default=None, metadata=_meta(
        "The metric a confirmation run's held-out value is read from; null = the trainer's name for the objective's "
        "metric on the test split (verl_core, TRL: test/..., test-core/...). verl names validation metrics by each "
        "row's data_source (val-core/<data_source>/acc/mean@1): set it to the test file's, and confirmation runs "
        "validate on data.val_files and test_files together, so the race and the ranking use the validation metric "
        "and only the report reads the test one."))
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
        "docs/verl.md 'Tuning speed').", ("learning", "throughput")))
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
    backend: str = field(default="verl_core", metadata=_meta(
        "Trainer: verl_core (python -m verl_core train), verl (python -m verl.trainer.main_ppo in trial.python, "
        "hydra overrides; see docs/verl.md) or trl (TRL's GRPOTrainer in trial.python; see docs/trl.md); a "
        "registered backend's name (docs/layout.md).", BACKEND_NAMES))
    python: str | None = field(default=None, metadata=_meta(
        "backend verl: verl's interpreter; null = .venv-gpu-verl/bin/python (make install-verl-gpu), else "
        ".venv-verl/bin/python (make install-verl), else the driver's own. backend trl: TRL's interpreter "
        "(docs/trl.md)."))
    command: tuple[str, ...] = field(default=DEFAULT_COMMAND, metadata=_meta("Trainer argv prefix."))
    prepare_command: tuple[str, ...] | None = field(default=None, metadata=_meta("Run once before trials."))
    n_jobs: int = field(default=1, metadata=_meta("Trials run in parallel."))
    timeout_s: float | None = field(default=None, metadata=_meta("Kill a trial after this many seconds."))
    memory_limit_gb: float | None = field(default=None, metadata=_meta(
        "Hard memory cap of a trial (a cgroup where possible, else a 0.1 s watchdog over peak RSS)."))
    preflight: bool = field(default=True, metadata=_meta(
        "Default trainer: skip a trial whose memory estimate does not fit its budget (fail_reason=predicted_oom); "
        "verl backend: the space is refused at search when no corner fits (estimated with verl's composed config)."))
    preflight_margin: float = field(default=0.1, metadata=_meta(
        "Pre-flight safety margin: the estimate times (1 + margin) must fit."))
    on_failure: str = field(default="worst", metadata=_meta("worst value or FAIL state.", ("worst", "fail")))
    gpus_per_trial: int = field(default=1, metadata=_meta("Devices per trial (when any are visible)."))
    devices: tuple[str, ...] | None = field(default=None, metadata=_meta("Device ids; null = detect."))
    env: dict[str, str] = field(default_factory=dict, metadata=_meta("Extra environment of trials."))
    keep_checkpoints: int = field(default=0, metadata=_meta(
        "backend verl: keep the final checkpoint of the best K finished trials; every other checkpoint is "
        "deleted once its trial can no longer be resumed (finished, not interrupted)."))
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
        out += [f"{p.key}={format_value(values[p.name])}" for p in self.params if p.name in values]
        return out


_SECTIONS: dict[str, type] = {
    "early_stopping": EarlyStopping, "diagnosis": DiagnosisSpec, "study": StudySpec, "trial": TrialSpec,
}
# Parameters a space may tune: Optuna stores every suggested value in a transaction of its own (measured on SQLite:
# 4 ms a parameter idle, 13-16 ms on a busy 2-core host), so a trial of 7,500 parameters spent 30-120 s being
# suggested before it started.
MAX_PARAMS = 1000
_TOP_FIELDS = ("config", "overrides", "params", "objective", *_SECTIONS, "tracking")
_PARAM_FIELDS = ("key", "type", "low", "high", "log", "step", "choices")


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


# ----------------------------------------------------------------------------- YAML
MAX_YAML_NODES = 100_000  # scalars, sequences and mappings once every alias is expanded ("billion laughs")
MAX_ARG_BYTES = 128 * 1024 - 1  # Linux MAX_ARG_STRLEN: the longest single argv entry execve accepts
MAX_ARGV_BYTES = 512 * 1024  # argv + the trial's own env entries: well under ARG_MAX (2 MiB by default)


class YamlTooComplex(yaml.composer.ComposerError):
    """A document refused by :class:`_StrictLoader` before anything is built from it: too large once its aliases
    are expanded, or an alias inside the value it names (a cycle)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader (no object construction) that rejects duplicate mapping keys, an alias inside the value its
    anchor names (``&a [*a]``: a cycle that every later walk of the value would follow for ever), and a document
    that expands past :data:`MAX_YAML_NODES` nodes through its aliases (each alias counts its whole subtree)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded = 0
        self._sizes: dict[int, int] = {}
        self._open: list[str] = []  # anchors of the collections being composed (the current node's ancestors)

    def _size(self, node: yaml.Node) -> int:
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(self._size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(self._size(k) + self._size(v) for k, v in node.value)
        self._sizes[id(node)] = n
        return n

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()
        anchor: str | None = getattr(event, "anchor", None)
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent) and anchor in self._open:
            raise YamlTooComplex(None, None, f"alias *{anchor} inside the value of &{anchor} (a cycle)", mark)
        if isinstance(event, yaml.AliasEvent) and anchor in self.anchors:
            self._expanded += self._size(self.anchors[anchor])
        else:
            self._expanded += 1
        if self._expanded > MAX_YAML_NODES:
            raise YamlTooComplex(
                None, None, f"more than {MAX_YAML_NODES} values once its aliases are expanded", mark)
        opened = anchor is not None and isinstance(event, yaml.CollectionStartEvent)
        if anchor is not None and opened:
            self._open.append(anchor)
        node = super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        if opened:
            self._open.pop()
        assert node is not None
        return node


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def resolve_space_path(name_or_path: str, spaces_dir: Path = SPACES_DIR) -> Path:
    """``kl_lr`` -> ``search_spaces/kl_lr.yaml``; anything with a suffix or a slash is a path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return p
    return spaces_dir / f"{name_or_path}.yaml"


def load_yaml_text(text: str) -> Any:
    """Parse YAML with :class:`_StrictLoader`: yaml.YAMLError, :class:`YamlTooComplex` for a bomb or a cycle."""
    return yaml.load(text, Loader=_StrictLoader)


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" line {mark.line + 1}:" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where} invalid YAML ({problem})"


def read_yaml(path: Path) -> dict[str, Any]:
    """An experiment file as a mapping: a regular file of at most :data:`MAX_FILE_BYTES` (never a FIFO or a device,
    even through a symlink), strict YAML (:class:`_StrictLoader`); SpaceError otherwise."""
    try:
        data = read_bounded(path, str(path), MAX_FILE_BYTES)
    except FileNotFoundError:
        raise SpaceError(f"{path}: no such experiment file") from None
    except FileRefused as err:
        raise SpaceError(f"{err}; an experiment file must be a regular file of at most {MAX_FILE_BYTES} bytes") \
            from None
    except OSError as err:
        raise SpaceError(f"{path}: cannot read ({err.strerror})") from None
    try:
        raw = load_yaml_text(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SpaceError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        raise SpaceError(f"{path}:{_yaml_problem(err)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpaceError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
    return raw


# ----------------------------------------------------------------------------- parsing
MAX_SHOWN_OVERRIDE = 60  # characters of an --override text an error line repeats


def shown_override(text: str) -> str:
    """An ``--override`` text as an error line shows it: a long one cut, with its size."""
    if len(text) <= MAX_SHOWN_OVERRIDE:
        return text
    return f"{text[:MAX_SHOWN_OVERRIDE]}... ({len(text.encode('utf-8', 'surrogateescape'))} bytes)"


class _Ctx:
    """Names the origin of a field in error messages (the file, or the --override that set it)."""

    def __init__(self, source: str, overridden: dict[str, str]) -> None:
        self.source = source
        self.overridden = overridden

    def error(self, where: str, msg: str) -> SpaceError:
        for path, text in self.overridden.items():
            if where == path or where.startswith(path + ".") or path.startswith(where + "."):
                return SpaceError(f"--override '{shown_override(text)}': {where}: {msg}")
        return SpaceError(f"{self.source}: {where}: {msg}" if where else f"{self.source}: {msg}")


def _type_label(tp: Any) -> str:
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    return str(tp)


def _check_scalar(value: Any, tp: Any, where: str, ctx: _Ctx) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = next(a for a in args if a is not type(None))
        return _check_scalar(value, inner, where, ctx)
    if origin is tuple:
        if not isinstance(value, list) or not value or not all(isinstance(v, (str, int)) for v in value):
            raise ctx.error(where, f"expected a non-empty list of strings, got {value!r}")
        return tuple(str(v) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ctx.error(where, f"expected a mapping, got {value!r}")
        return {str(k): format_value(v) for k, v in value.items()}
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        raise ctx.error(where, f"expected {_type_label(tp)}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ctx.error(where, f"expected a finite number, got {value!r}")
    return float(value) if tp is float else value


def _build(cls: type, raw: Any, where: str, ctx: _Ctx) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ctx.error(where, f"expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            raise ctx.error(f"{where}.{key}", f"unknown field (value {raw[key]!r}); known: {', '.join(names)}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        tp, sub = hints[f.name], f"{where}.{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, raw[f.name], sub, ctx)
            continue
        value = _check_scalar(raw[f.name], tp, sub, ctx)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ctx.error(sub, f"{value!r} is not one of {', '.join(choices)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0 and f.name not in (
            "seed", "n_warmup_steps", "n_startup_trials", "max_retry", "gpus_per_trial", "threshold", "min_value",
            "preflight_margin", "n_warmup_evals", "min_delta", "seed_base", "hacking_min_drop", "plateau_min_delta",
            "keep_checkpoints", "burn_in_steps", "resample_probability", "max_rollbacks", "warmup_steps",
        ):
            raise ctx.error(sub, f"must be positive, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0 and f.name != "min_value":
            raise ctx.error(sub, f"must be >= 0, got {value!r}")
        kwargs[f.name] = value
    return cls(**kwargs)


def _number(raw: dict[str, Any], name: str, where: str, ctx: _Ctx, integer: bool) -> float | None:
    if name not in raw or raw[name] is None:
        return None
    v = raw[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        kind = "an integer" if integer else "a number"
        raise ctx.error(f"{where}.{name}", f"expected {kind}, got {v!r}")
    if not math.isfinite(v):
        raise ctx.error(f"{where}.{name}", f"expected a finite number, got {v!r}")
    return v


def _parse_param(name: str, raw: Any, ctx: _Ctx) -> Param:
    where = f"params.{name}"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ctx.error(where, "parameter names start with a letter and use letters, digits, _ . -")
    if not isinstance(raw, dict):
        raise ctx.error(where, f"expected a mapping like {{key: ..., type: float, low: ..., high: ...}}, got {raw!r}")
    for k in raw:
        if k not in _PARAM_FIELDS:
            raise ctx.error(f"{where}.{k}", f"unknown field (value {raw[k]!r}); known: {', '.join(_PARAM_FIELDS)}")
    key, kind = raw.get("key"), raw.get("type")
    if not isinstance(key, str) or not key:
        raise ctx.error(f"{where}.key", f"expected a dotted trainer key, got {key!r}")
    if kind not in ("float", "int", "categorical"):
        raise ctx.error(f"{where}.type", f"{kind!r} is not one of float, int, categorical")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ctx.error(f"{where}.log", f"expected true or false, got {log!r}")
    if kind == "categorical":
        for k in ("low", "high", "log", "step"):
            if k in raw:
                raise ctx.error(f"{where}.{k}", f"not allowed with type categorical (value {raw[k]!r})")
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ctx.error(f"{where}.choices", f"expected a non-empty list, got {choices!r}")
        for c in choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise ctx.error(f"{where}.choices", f"choice {c!r} is not a scalar (null, bool, number, string)")
        if len(set(map(repr, choices))) != len(choices):
            raise ctx.error(f"{where}.choices", f"duplicate choices in {choices!r}")
        return Param(name, key, kind, choices=tuple(choices))
    if "choices" in raw:
        raise ctx.error(f"{where}.choices", f"only for type categorical (value {raw['choices']!r})")
    integer = kind == "int"
    low, high = _number(raw, "low", where, ctx, integer), _number(raw, "high", where, ctx, integer)
    step = _number(raw, "step", where, ctx, integer)
    if low is None or high is None:
        missing = "low" if low is None else "high"
        raise ctx.error(f"{where}.{missing}", f"required for type {kind}")
    if low > high:
        raise ctx.error(where, f"low={low!r} is greater than high={high!r}")
    if log and low <= 0:
        raise ctx.error(f"{where}.low", f"log scale needs low > 0, got low={low!r}")
    if log and step is not None:
        raise ctx.error(f"{where}.step", f"log and step are exclusive (step={step!r})")
    if step is not None and step <= 0:
        raise ctx.error(f"{where}.step", f"must be positive, got {step!r}")
    return Param(name, key, kind, low=low, high=high, log=log, step=step)


def _set_path(raw: dict[str, Any], path: list[str], value: Any) -> None:
    node = raw
    for p in path[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    node[path[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, str]:
    """Apply ``--override`` texts in place: space fields (``study.n_trials=4``, ``params.x.high=1``)
    or, for any other dotted key, a fixed trainer override. Returns {field path: override text}."""
    origin: dict[str, str] = {}
    for text in overrides:
        key, sep, rhs = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpaceError(f"--override '{shown_override(text)}': expected key=value")
        try:
            value = load_yaml_text(rhs) if rhs.strip() else ""
        except (YamlTooComplex, yaml.constructor.ConstructorError) as err:  # a bomb, a cycle, a duplicate key
            raise SpaceError(f"--override '{shown_override(text)}':{_yaml_problem(err)}") from None
        except yaml.YAMLError:
            value = rhs
        head = key.split(".")[0]
        if head in _TOP_FIELDS and head != "overrides":
            _set_path(raw, key.split("."), value)
            origin[key] = text
        else:
            key = key.removeprefix("overrides.")
            if not isinstance(raw.get("overrides"), dict):
                raw["overrides"] = {} if raw.get("overrides") is None else raw["overrides"]
            if isinstance(raw["overrides"], dict):
                raw["overrides"][key] = value
            origin[f"overrides.{key}"] = text
    return origin


def parse_space(raw: dict[str, Any], source: str, name: str, origin: dict[str, str] | None = None) -> Space:
    """Validate a raw mapping into a :class:`Space` against the schema (the trainer's keys and defaults are its
    backend's: :mod:`hpo.backends`)."""
    ctx = _Ctx(source, origin or {})
    for key in raw:
        if key not in _TOP_FIELDS:
            raise ctx.error(str(key), f"unknown field (value {raw[key]!r}); known: {', '.join(_TOP_FIELDS)}")
    config = raw.get("config")
    if not isinstance(config, str) or not config:
        raise ctx.error("config", f"expected a trainer config name or path, got {config!r}")
    throughput_defaults(raw)  # study.kind throughput: no pruner, no early stopping, the mean of measured steps
    fixed = raw.get("overrides") or {}
    if not isinstance(fixed, dict):
        raise ctx.error("overrides", f"expected a mapping of dotted trainer keys to values, got {fixed!r}")
    for k, v in fixed.items():
        if not isinstance(k, str) or not k:
            raise ctx.error("overrides", f"key {k!r} is not a dotted trainer key")
        if isinstance(v, dict):
            raise ctx.error(f"overrides.{k}", f"expected a value, got a mapping {v!r}")
    params_raw = raw.get("params")
    if not params_raw and isinstance(raw.get("study"), dict) and raw["study"].get("kind") == "throughput":
        raise ctx.error("params", "a throughput study needs at least one speed knob to tune (a micro-batch size, a "
                        "token budget, offload, gradient checkpointing, the rollout engine's batching)")
    if not isinstance(params_raw, dict) or not params_raw:
        raise ctx.error("params", f"expected a non-empty mapping of parameters, got {params_raw!r}")
    if len(params_raw) > MAX_PARAMS:
        raise ctx.error("params", f"{len(params_raw)} parameters; at most {MAX_PARAMS} (Optuna's storage writes each "
                        "parameter of each trial in its own transaction: 4-16 ms each on SQLite, 30-120 s per trial "
                        "at 7,500)")
    params = tuple(_parse_param(n, p, ctx) for n, p in params_raw.items())
    seen: dict[str, str] = {}
    for p in params:
        if is_secret_key(p.key):
            raise ctx.error(f"params.{p.name}.key", f"{p.key!r} names a secret (a token, password or key): it is "
                            "not tuned (Optuna stores every parameter value in clear); set it as a fixed override")
        if p.key in seen:
            raise ctx.error(f"params.{p.name}.key", f"{p.key!r} is already tuned by parameter {seen[p.key]!r}")
        if p.key in fixed:
            raise ctx.error(f"params.{p.name}.key", f"{p.key!r} is also a fixed override ({fixed[p.key]!r})")
        seen[p.key] = p.name
    objective = parse_objective(raw.get("objective"), ctx.error)
    check_no_test_split(fixed, {p.key: p.name for p in params}, objective.metrics, ctx.error)
    study_raw = raw.get("study")
    baseline = parse_baseline(study_raw.get("baseline"), ctx.error) if isinstance(study_raw, dict) else {}
    trial_raw, ray_raw = split_ray(raw.get("trial"))  # trial.ray is free-form in places: parsed on its own
    section_raw = {"trial": trial_raw, "study": {k: v for k, v in study_raw.items() if k != "baseline"}
                   if isinstance(study_raw, dict) else study_raw}
    sections = {s: _build(cls, section_raw[s] if s in section_raw else raw.get(s), s, ctx)
                for s, cls in _SECTIONS.items()}
    sections["trial"] = dataclasses.replace(sections["trial"], ray=parse_ray(ray_raw, ctx.error))
    sections["study"] = dataclasses.replace(sections["study"], baseline=baseline)
    study: StudySpec = sections["study"]
    if study.grace_period < 2 * study.heartbeat_interval:
        raise ctx.error("study.grace_period", f"{study.grace_period} is under twice study.heartbeat_interval="
                        f"{study.heartbeat_interval}: a live driver's trial would be taken for dead between beats")
    if study.budget is not None and not (math.isfinite(study.budget) and study.budget >= 1):
        raise ctx.error("study.budget", f"{study.budget}: must be at least 1 full-run equivalent (one trial's full "
                        "length); below it no trial and no confirmation run fits")
    conf = study.confirm
    if conf.race and not 2 <= conf.min_seeds <= conf.seeds:
        raise ctx.error("study.confirm.min_seeds", f"{conf.min_seeds}: a race needs 2 <= min_seeds <= "
                        f"study.confirm.seeds={conf.seeds} (an interval needs 2 seeds)")
    if conf.resolution is not None and not (math.isfinite(conf.resolution) and conf.resolution >= 0):
        raise ctx.error("study.confirm.resolution", f"{conf.resolution}: must be a finite number >= 0")
    if conf.test_metric is not None and (not conf.test_metric.strip() or conf.test_metric in objective.metrics):
        raise ctx.error("study.confirm.test_metric", f"{conf.test_metric!r}: must name the held-out metric, not the "
                        "objective's (trials are scored on validation data; the test value is only reported)")
    if study.sampler.type == "gp":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise ctx.error("study.sampler.type", "gp needs torch in the driver's environment (Optuna's GPSampler "
                            "uses it); install torch or use tpe")
    if objective.multi and study.pruner.patience is not None:
        raise ctx.error("study.pruner.patience", "not supported with objective mode pareto (its median rule is the "
                        "driver's own); use n_warmup_evals")
    if objective.multi and sections["study"].pruner.type not in ("median", "none"):
        raise ctx.error("study.pruner.type", f"{sections['study'].pruner.type!r} is not supported with objective "
                        "mode pareto (Optuna cannot report multi-objective curves); use median or none")
    trial: TrialSpec = sections["trial"]
    early: EarlyStopping = sections["early_stopping"]
    if trial.devices is not None and not trial.devices:
        raise ctx.error("trial.devices", "expected a non-empty list or null")
    for where, msg in sections["diagnosis"].validate():
        raise ctx.error(f"diagnosis.{where}", msg)
    _check_argv_sizes(fixed, params, trial, ctx)
    _check_code_files(fixed, ctx)
    tracking = parse_tracking(raw.get("tracking"), ctx.error)  # MLflow / W&B (hpo.experiment._tracking)
    if study.strategy == "pbt":
        _check_pbt(study.pbt, params, objective.multi, ctx)
    if study.kind == "throughput":
        check_throughput(objective, study.pruner.type, early.enabled, study.strategy, study.speed_from,
                         study.throughput, ctx.error)
    return Space(name=name, source=source, config=config, overrides=dict(fixed), params=params,
                 objective=objective, early_stopping=early, diagnosis=sections["diagnosis"],
                 study=sections["study"], trial=trial, tracking=tracking, raw=raw)


def _check_pbt(pbt: PbtSpec, params: tuple[Param, ...], multi: bool, ctx: _Ctx) -> None:
    """study.strategy pbt: the knobs' ranges, explored and rollback parameters that exist (hpo.samplers._pbt; whether
    the trainer resumes checkpoints is its backend's check)."""
    names = {p.name for p in params}
    if multi:
        raise ctx.error("study.strategy", "pbt needs a single objective (it ranks members by one value)")
    if pbt.population < 2:
        raise ctx.error("study.pbt.population", f"at least 2 members, got {pbt.population}")
    if not 0 < pbt.quantile <= 0.5:
        raise ctx.error("study.pbt.quantile", f"must be in (0, 0.5], got {pbt.quantile}")
    if pbt.resample_probability > 1:
        raise ctx.error("study.pbt.resample_probability", f"must be in [0, 1], got {pbt.resample_probability}")
    if not pbt.perturb_down < 1 < pbt.perturb_up:
        raise ctx.error("study.pbt", f"perturb_down={pbt.perturb_down} must be < 1 < perturb_up={pbt.perturb_up}")
    for n in pbt.explore or ():
        if n not in names:
            raise ctx.error("study.pbt.explore", f"{n!r} is not a parameter (known: {', '.join(sorted(names))})")
    for label, rule in (pbt.rollback or {}).items():
        where = f"study.pbt.rollback.{label}"
        if label not in ROLLBACK_LABELS:
            raise ctx.error(where, f"unknown collapse label (value {rule!r}); known: {', '.join(ROLLBACK_LABELS)}")
        try:
            terms = parse_rollback_rule(rule)
        except ValueError:
            raise ctx.error(where, f"expected 'name*factor ...' with positive factors, got {rule!r}") from None
        for n, _ in terms:
            if n not in names:
                raise ctx.error(where, f"{n!r} is not a parameter (known: {', '.join(sorted(names))})")


ROLLBACK_LABELS = ("nan", "kl_blowup", "entropy_collapse")


def parse_rollback_rule(rule: str) -> list[tuple[str, float]]:
    """``'lr*0.5 kl*2'`` -> [('lr', 0.5), ('kl', 2.0)]; ValueError when malformed or a factor is not > 0."""
    out = []
    for term in rule.replace(",", " ").split():
        name, star, factor = term.partition("*")
        value = float(factor) if star else math.nan
        if not name or not math.isfinite(value) or value <= 0:
            raise ValueError(term)
        out.append((name, value))
    return out


def _check_argv_sizes(fixed: dict[str, Any], params: tuple[Param, ...], trial: TrialSpec, ctx: _Ctx) -> None:
    """Every trial must be launchable: no argument over Linux's 128 KiB per-argument limit, and the trainer's argv
    (with the longest choice of each parameter) plus the trial's own environment well under ``ARG_MAX``;
    otherwise ``execve`` fails with "Argument list too long" only once a study exists. The errors give sizes and
    the field, never the (long) value."""
    def size(text: str) -> int:
        return len(text.encode("utf-8", "surrogateescape")) + 1

    sizes: list[tuple[int, str, str]] = []  # (bytes, field, what a single one of them may have)
    for k, v in fixed.items():
        sizes.append((size(f"{k}={format_value(v)}"), f"overrides.{k}", "one argument of a trial"))
    for p in params:
        longest = max((size(f"{p.key}={format_value(c)}") for c in p.choices), default=0) if p.choices else 64
        sizes.append((longest, f"params.{p.name}.choices", "one argument of a trial (its longest choice)"))
    sizes += [(size(c), f"trial.command[{i}]", "one argument") for i, c in enumerate(trial.command)]
    sizes += [(size(f"{k}={v}"), f"trial.env.{k}", "one variable") for k, v in trial.env.items()]
    for n, where, what in sizes:
        if n > MAX_ARG_BYTES:
            raise ctx.error(where, f"{n} bytes; {what} may have at most {MAX_ARG_BYTES} (Linux MAX_ARG_STRLEN)")
    total = sum(n for n, _, _ in sizes)
    if total > MAX_ARGV_BYTES:
        n, where, _ = max(sizes, key=lambda s: s[0])  # the first of the largest
        raise ctx.error(where, f"a trial's arguments and trial.env add up to {total} bytes, the largest being this "
                        f"one ({n} bytes); at most {MAX_ARGV_BYTES} fit beside the environment under Linux's ARG_MAX")


def _check_code_files(fixed: dict[str, Any], ctx: _Ctx) -> None:
    """A user-code file that a fixed override names (``custom_reward_function.path``, the files of
    ``evaluation.custom``) and that exists here must be a regular file: importing a FIFO blocks, and ``/dev/zero``
    is read without end, in the trainer and in verl's config check alike. (A missing file is the trainer's to
    report: it may exist only where the trials run.)"""
    for key, value in fixed.items():
        if key.endswith("custom_reward_function.path") and isinstance(value, str):
            paths = [value]
        elif key.endswith("evaluation.custom") and isinstance(value, list):
            paths = [str(v).partition("=")[2].rpartition(":")[0] for v in value]
        else:
            continue
        for path in paths:
            try:
                if path and os.path.exists(os.path.expanduser(path)):
                    check_regular(os.path.expanduser(path), path)
            except FileRefused as err:
                raise ctx.error(f"overrides.{key}", f"{err}; user code must be a regular .py file") from None
            except OSError:
                pass  # unreadable here: the trainer says why where it runs


def load_space_origin(name_or_path: str, overrides: typing.Sequence[str] = (), spaces_dir: Path = SPACES_DIR
                      ) -> tuple[Space, dict[str, str]]:
    """:func:`read_space`, and which fields the ``--override`` texts set (for errors that name them)."""
    path = resolve_space_path(name_or_path, spaces_dir)
    raw = read_yaml(path)
    origin = apply_overrides(raw, overrides)
    return parse_space(raw, str(path), path.stem, origin), origin


def read_space(name_or_path: str, overrides: typing.Sequence[str] = (), spaces_dir: Path = SPACES_DIR) -> Space:
    """Read, override and parse an experiment file against the schema. What its trainer gives it and refuses is
    its backend's: :func:`hpo.backends.load_space` (what the driver runs)."""
    return load_space_origin(name_or_path, overrides, spaces_dir)[0]


def located_error(space: Space, origin: dict[str, str], where: str, msg: str) -> SpaceError:
    """A one-line error about field ``where`` of ``space``, naming the ``--override`` that set it if one did."""
    return _Ctx(space.source, origin).error(where, msg)


def space_from_stored(raw: dict[str, Any], source: str, name: str) -> Space:
    """Rebuild the space stored in a study against the schema (the driver's: :func:`hpo.backends.stored_space`)."""
    return parse_space(raw, source, name)
