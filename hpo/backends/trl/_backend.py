"""TRL's ``GRPOTrainer`` as a :class:`~hpo.backends._base.Backend` (``trial.backend: trl``).

A trial is ``<trl python> hpo/backends/trl/_train.py --config CONFIG --metrics-file METRICS <overrides>
output_dir=<trial dir>/checkpoints [resume_from_checkpoint=<checkpoint-N>]``, run in TRL's interpreter
(``trial.python``, else the driver's own when trl is installed there: ``make install`` puts trl==1.16.0 into
``.venv``). The driver reads the config file as YAML only and never imports trl, torch or transformers:

* keys: a flat key is a ``trl.GRPOConfig`` field (checked against :data:`~hpo.backends.trl._keys.GRPO_FIELDS`,
  with the nearest name for a typo), a dotted key the launcher's own (``model.path``, ``data.*``, ``reward.*``,
  ``eval.before_train``, ``runtime.threads``); ``output_dir`` and ``resume_from_checkpoint`` are the driver's.
  ``verify`` builds the ``GRPOConfig`` of the default point and of every corner in TRL's interpreter.
* steps: ``max_steps``; evaluations: the launcher's greedy pass over the validation split at step 0, every
  ``eval_steps`` and the last step (``eval/reward_mean``, ``eval/reward_std``, ``eval/response_length_mean``).
* retries: every attempt writes its own metrics file and saves ``checkpoint-N`` (Hugging Face's layout) into its own
  ``<trial dir>/checkpoints``; a retry continues from the newest complete one of its chain (``trainer_state.json`` is
  written last) and the curve its attempts logged up to N is replayed.
* confirmation: the seed is ``seed`` (TrainingArguments' default 42); the held-out split is ``data.test_files``
  (``study.confirm.test_files``, else the built-in task's test split), scored at the last step as ``test/*``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import yaml

from hpo.analysis import FileRefused, MetricNames, read_bounded
from hpo.backends._attempt import Attempt, Command, TrialConfig
from hpo.backends._base import Backend
from hpo.backends._features import Confirmation, Resumable
from hpo.backends._models import ModelFacts, builtin_facts_from
from hpo.backends._replay import (
    CheckpointLayout,
    CheckpointLost,
    ResumePoint,
    command_argv,
    note_lost,
    read_checkpoint_file,
    real_dir,
    step_number,
)
from hpo.backends._replay import resume_point as chain_resume_point
from hpo.backends.trl._keys import (
    DRIVER_KEYS,
    GRPO_FIELDS,
    LAUNCHER_KEYS,
    TEST_FILES,
    TRL_VERSION,
    flatten,
    load_mapping,
    load_value,
)
from hpo.experiment import Space, SpaceError, check_metrics, format_value, located_error

LAUNCHER = Path(__file__).with_name("_train.py")
INSTALL_HINT = (f"run `make install` (trl=={TRL_VERSION} into .venv), or set trial.python to an interpreter with "
                f"trl=={TRL_VERSION}")
EVAL_METRICS = ("eval/reward_mean", "eval/reward_std", "eval/response_length_mean")  # the launcher's greedy pass
DEFAULT_SEED = 42  # transformers.TrainingArguments.seed
CHECK_TIMEOUT_S = 300.0
MAX_CORNERS = 16
_CHECKPOINT = "checkpoint-"  # checkpoint-<step> (hpo.backends._replay.step_number)
MAX_STATE_BYTES = 64 << 20  # trainer_state.json: the log history, a few hundred bytes a logged step
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
           "adapter_model.safetensors")
TEST_KEY = TEST_FILES  # the launcher's held-out key, which the driver keeps out of a search (heldout_keys)
# the names the launcher logs: TRL's own train metrics as Hugging Face's trackers name them (train/<TRL key>), its
# greedy evaluation (EVAL_METRICS) and the step time it measures; TRL logs no gen/sync timings or GPU utilisation
METRICS = MetricNames(objective="eval/reward_mean", spread="eval/reward_std", score="train/reward",
                      entropy="train/entropy", kl=("train/kl",), clip_ratio="train/completions/clipped_ratio",
                      response_length="train/completions/mean_length", step_time="timing_s/step")


# ----------------------------------------------------------------------------- the config
def resolve_beside(path: str, source: str) -> str:
    """A relative ``path`` named in the experiment file ``source``: the file beside the experiment if there is one,
    else the one under the working directory; ``path`` unchanged when neither exists (``check`` names it). Beside
    the experiment means beside the real file when ``source`` is a symbolic link, as for every backend's relative
    paths (:func:`hpo.backends.verl._paths.resolve_user_paths`)."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return path
    real = Path(source).expanduser().resolve()
    here = real.parent / p
    if real.is_file() and here.is_file():
        return str(here.resolve())
    return str(p.resolve()) if p.is_file() else path


def read_config(path: str) -> dict[str, Any]:
    """The config file's keys (the launcher's sections as dotted keys); ValueError (one line) when unreadable: also
    when it is not a regular file (a FIFO, a device or a link to one: never opened through) or over
    :data:`~hpo.analysis._files.MAX_FILE_BYTES`."""
    try:
        raw = load_mapping(read_bounded(Path(path).expanduser(), path).decode()) or {}
    except FileRefused as err:
        raise ValueError(str(err)) from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply") from None
    except OSError as err:
        raise ValueError(f"cannot read {path} ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: invalid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of GRPOConfig fields and launcher keys, got "
                         f"{type(raw).__name__}")
    return flatten(raw)


def merged_config(space: Space, overrides: Sequence[str]) -> dict[str, Any]:
    """The config file's keys with ``key=value`` overrides applied (values in YAML syntax), as the launcher reads
    them; an unreadable config file counts as empty (``check`` names it)."""
    try:
        cfg = read_config(space.config)
    except ValueError:
        cfg = {}
    for text in overrides:
        key, _, rhs = text.partition("=")
        cfg[key.strip()] = load_value(rhs)
    return cfg


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a key of a TRL trial (None: it is)."""
    if key in DRIVER_KEYS:
        return f"{key} is set by the driver"
    known = LAUNCHER_KEYS if "." in key else GRPO_FIELDS
    if key in known:
        return None
    near = difflib.get_close_matches(key, list(known), n=1)
    kind = "launcher key (model.*, data.*, reward.*, eval.*, runtime.*)" if "." in key else \
        f"GRPOConfig field (trl {TRL_VERSION})"
    return f"unknown {kind} {key!r}" + (f"; did you mean {near[0]!r}?" if near else "")


def trl_python(space: Space) -> str:
    """TRL's interpreter: ``trial.python``, else the driver's own (``make install`` puts trl into ``.venv``)."""
    return space.trial.python or sys.executable


def _corner_sets(space: Space) -> list[tuple[str, list[str]]]:
    """(where, overrides) of the default point, the baseline, each parameter at its ends and the joint corners."""
    sets = [("overrides", space.trainer_overrides({}))]
    if space.study.baseline:
        sets.append(("study.baseline", [*sets[0][1], *(f"{k}={format_value(v)}"
                                                       for k, v in space.study.baseline.items())]))
    for p in space.params:
        sets += [(f"params.{p.name}", space.trainer_overrides({p.name: v})) for v in p.corner_values()]
    lows = {p.name: p.corner_values()[0] for p in space.params}
    highs = {p.name: p.corner_values()[-1] for p in space.params}
    sets += [("params", space.trainer_overrides(lows)), ("params", space.trainer_overrides(highs))]
    return sets[:MAX_CORNERS]


# ----------------------------------------------------------------------------- checkpoints
def _complete(folder: Path) -> bool:
    """Whether ``folder`` is a complete ``checkpoint-N`` (:func:`checkpoint_complete`); CheckpointLost when a file
    of it is refused or ``trainer_state.json`` names another step."""
    step = _step_of(folder)
    if step is None or not real_dir(folder):
        return False
    raw = read_checkpoint_file(folder / "trainer_state.json", MAX_STATE_BYTES)
    try:
        state = None if raw is None else json.loads(raw)
        names = {p.name for p in folder.iterdir()}
    except (OSError, ValueError, RecursionError):  # not written yet, or cut short
        return False
    if state is None:
        return False
    found = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(found, bool) or not isinstance(found, int) or found != step:
        raise CheckpointLost(f"{folder / 'trainer_state.json'}: global_step {str(found)[:40]!r} is not {step}")
    states = {"optimizer.pt", "scheduler.pt", "rng_state.pth"} & names
    return bool(names & set(WEIGHTS)) and (not states or {"optimizer.pt", "scheduler.pt"} <= names)


def checkpoint_complete(folder: Path) -> bool:
    """A ``checkpoint-N`` the Trainer resumes: ``trainer_state.json`` (written last) at step N, the weights, and the
    optimizer and scheduler states unless none of them was saved (``save_only_model``). The checkpoint's
    directory and ``trainer_state.json`` must be themselves (no link followed) and the latter a regular file of at
    most :data:`MAX_STATE_BYTES`; a checkpoint that fails that is lost (one line to
    :func:`~hpo.backends._replay.lost_checkpoints`), never read through."""
    try:
        return _complete(folder)
    except CheckpointLost as err:
        note_lost(f"{folder} not used: {err}")
        return False


def checkpoint_step(checkpoints: Path) -> int | None:
    """The step of the newest complete checkpoint in an ``output_dir``; None when there is none."""
    try:
        steps = sorted({s for d in checkpoints.iterdir() if (s := _step_of(d)) is not None}, reverse=True)
    except OSError:
        return None
    return next((s for s in steps if checkpoint_complete(checkpoints / f"checkpoint-{s}")), None)


def resumed_from(trial_dir: Path) -> Path | None:
    """The checkpoint an attempt started from (``resume_from_checkpoint=`` in its ``command.json``); CheckpointLost
    when that file is refused (:func:`~hpo.backends._replay.command_argv`)."""
    argv = command_argv(trial_dir) or []
    value = next((a.partition("=")[2] for a in argv if a.startswith("resume_from_checkpoint=")), None)
    return None if value in (None, "", "null") else Path(value)


def _step_of(checkpoint: Path) -> int | None:
    name = checkpoint.name
    return step_number(name[len(_CHECKPOINT):]) if name.startswith(_CHECKPOINT) else None


def resume_point(trials_dir: Path, history: Sequence[int]) -> ResumePoint | None:
    """The newest complete ``checkpoint-<step>`` along a retry chain and the attempts that led to it (the shared
    walk, :func:`hpo.backends._replay.resume_point`); None when no attempt left one."""
    return chain_resume_point(trials_dir, history, LAYOUT, metrics_file)


def metrics_file(trial_dir: Path, attempt: int) -> Path:
    """``metrics.jsonl`` for a first attempt, ``metrics.attempt<k>.jsonl`` for the k-th retry."""
    return trial_dir / ("metrics.jsonl" if attempt == 0 else f"metrics.attempt{attempt}.jsonl")


LAYOUT = CheckpointLayout(newest=checkpoint_step, step_dir=lambda d, step: d / f"checkpoint-{step}",
                          step_of=_step_of, resumed_from=resumed_from)


def resume_overrides(checkpoint: Path) -> list[str]:
    """A launcher run that continues from ``checkpoint`` (the Trainer's ``resume_from_checkpoint``: the weights, the
    optimizer, the scheduler and the step; the scheduler's base learning rate is the checkpoint's, which is why a
    TRL trial resumes retries but runs no PBT segment)."""
    return [f"resume_from_checkpoint={checkpoint.absolute()}"]


@dataclasses.dataclass(frozen=True)
class TrlConfirmation(Confirmation):
    """``seed`` (the config's, else TrainingArguments' default 42), ``data.test_files`` (else the built-in task's
    test split); no version known from the driver."""

    def default_seed(self, space: Space, key: str) -> int | None:
        """The config's value (the fixed overrides applied), else TrainingArguments' default for ``seed``."""
        value = merged_config(space, space.trainer_overrides({})).get(key, DEFAULT_SEED if key == "seed" else None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def heldout_overrides(self, space: Space) -> dict[str, Any]:
        """``study.confirm.test_files``, else the built-in task's test split when ``data.val_files`` is
        ``builtin:<task>`` (the launcher's default)."""
        extra = super().heldout_overrides(space)
        if extra:
            return extra
        val = merged_config(space, space.trainer_overrides({})).get("data.val_files",
                                                                   LAUNCHER_KEYS["data.val_files"])
        return {TEST_KEY: val} if isinstance(val, str) and val.startswith("builtin:") else {}

    def trainer_version(self, space: Space) -> str | None:
        """Unknown from the driver (TRL runs in its own interpreter): baseline runs are never reused across studies."""
        return None


# ----------------------------------------------------------------------------- the backend
class TrlBackend(Backend):
    name: ClassVar[str] = "trl"
    every_key_is_code: ClassVar[bool] = True  # reward.path, model.path, model_init_kwargs (trust_remote_code)
    metrics: ClassVar[MetricNames] = METRICS
    default_command: ClassVar[tuple[str, ...]] = ("python", str(LAUNCHER))  # in trial.python (trl_python)
    resumable = Resumable(LAYOUT, resume_overrides)  # checkpoint-<step> under output_dir; retries only, no PBT
    # the launcher's test pass: data.test_files, scored as test/*
    confirmation = TrlConfirmation(("seed",), (TEST_KEY,), {"eval/": "test/", "": "test/"})
    model_keys: ClassVar[tuple[str, ...]] = ("model.path",)  # the launcher's model (policy and reference)

    def model_path(self, space: Space, overrides: Mapping[str, Any]) -> str | None:
        """``model.path`` of the overrides, else of the config file, else the launcher's default."""
        merged = {**LAUNCHER_KEYS, **merged_config(space, [f"{k}={format_value(v)}" for k, v in overrides.items()])}
        model = merged.get("model.path")
        return model if isinstance(model, str) and model.strip() else None

    def model_facts(self, path: str) -> ModelFacts:
        """The launcher builds verl_core's built-in models (``builtin:<name>``, their facts asked of verl_core without
        torch: :func:`verl_core.resolve.builtin_model_facts`); else a local directory's."""
        if not path.startswith("builtin:"):
            return super().model_facts(path)
        from verl_core.resolve import builtin_model_facts

        return builtin_facts_from(path, builtin_model_facts())

    def normalize(self, space: Space) -> Space:
        """``config``, a relative path, resolved beside the experiment file (then the working directory, as before),
        so an experiment given by its absolute path from any directory finds its own config file."""
        resolved = resolve_beside(space.config, space.source)
        return space if resolved == space.config else dataclasses.replace(space, config=resolved)

    def check(self, space: Space, origin: Mapping[str, str]) -> None:
        """The command, every key (config file, overrides, parameters, baseline), the steps and the objective."""
        space = self.normalize(space)  # the config file beside the experiment, as the trials will read it

        def error(where: str, msg: str) -> SpaceError:
            return located_error(space, dict(origin), where, msg)

        if space.trial.command not in (None, self.default_command):
            raise error("trial.command", f"not used with trial.backend: trl (the command is {LAUNCHER.name} in "
                        "trial.python)")
        try:
            cfg = read_config(space.config)
        except ValueError as err:
            raise error("config", str(err)) from None
        for key in cfg:
            if (problem := key_problem(key)) is not None:
                raise error("config", f"{space.config}: {problem}")
        places = [(f"overrides.{k}", k) for k in space.overrides]
        places += [(f"params.{p.name}.key", p.key) for p in space.params]
        places += [(f"study.baseline.{k}", k) for k in space.study.baseline]
        for where, key in places:
            if (problem := key_problem(key)) is not None:
                raise error(where, problem)
        model = merged_config(space, space.trainer_overrides({})).get("model.path")
        if isinstance(model, str) and not model.startswith("builtin:") and \
                not (Path(model).expanduser() / "config.json").is_file():  # the launcher's rule, before a study
            where = "overrides.model.path" if "model.path" in space.overrides else "config"
            raise error(where, f"model.path={model!r}: not a local Hugging Face model directory (no config.json); "
                        "a directory of a saved model, or builtin:tiny_arith / builtin:smollm2")
        steps = merged_config(space, space.trainer_overrides({})).get("max_steps")
        if not any(p.key == "max_steps" for p in space.params) and (
                isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
            raise error("overrides.max_steps", f"a trial needs a positive max_steps (config or overrides), got "
                        f"{steps!r}")
        check_metrics(space.objective, lambda m: m in EVAL_METRICS or m.startswith(("train/", "eval/trl/")),
                      list(EVAL_METRICS), error)

    def verify(self, space: Space, origin: Mapping[str, str]) -> None:
        """``GRPOConfig`` of the default point, the baseline and the corners, built in TRL's interpreter (its own
        checks: batch sizes against ``num_generations``, exclusive keys, value types)."""
        self.check_launch(space)
        sets = _corner_sets(space)
        problems, why = None, "no answer"
        try:
            res = subprocess.run([trl_python(space), str(LAUNCHER), "--check", "--config", space.config],
                                 input=json.dumps([s for _, s in sets]), capture_output=True, text=True,
                                 timeout=CHECK_TIMEOUT_S, check=False)
            why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            problems = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
            why = f"{type(err).__name__}: {err}"
        if not isinstance(problems, list) or len(problems) != len(sets):
            raise located_error(space, dict(origin), "trial.python", f"the GRPOConfig check in {trl_python(space)} "
                                f"failed: {why[:300]}")
        for (where, overrides), problem in zip(sets, problems, strict=True):
            if problem:
                shown = " ".join(o for o in overrides if o not in space.trainer_overrides({})) or "the fixed keys"
                named = next((k for k in space.overrides if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", problem)),
                             None)  # a fixed key the problem names (deepspeed=/etc/passwd) is the place to look
                raise located_error(space, dict(origin), f"overrides.{named}" if named else where,
                                    f"rejected by TRL with {shown}: {problem}")

    def check_launch(self, space: Space, *, as_planned: bool = False) -> None:
        python = trl_python(space)
        if python == sys.executable:
            if importlib.util.find_spec("trl") is None:
                raise SpaceError(f"{space.source}: trial.backend: trl is not installed in {python}; {INSTALL_HINT}")
            return
        if not Path(python).exists():
            raise SpaceError(f"{space.source}: trial.python: {python} does not exist; {INSTALL_HINT}")
        try:
            probe = "import importlib.util as u; print('trl', u.find_spec('trl') is not None)"
            found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
        except OSError as err:  # not executable, not a program: the interpreter's fault, never the storage's
            raise SpaceError(f"{space.source}: trial.python: cannot run {python} ({err.strerror}): not a Python "
                             f"interpreter; {INSTALL_HINT}") from None
        except subprocess.TimeoutExpired:
            raise SpaceError(f"{space.source}: trial.python: {python} did not answer in 60 s") from None
        answer = found.stdout.strip().splitlines()[-1:] if found.returncode == 0 else []
        if answer not in (["trl True"], ["trl False"]):
            raise SpaceError(f"{space.source}: trial.python: {python} is not a Python interpreter (exit "
                             f"{found.returncode}, it printed {found.stdout.strip()[:60]!r} for `-c`); {INSTALL_HINT}")
        if answer != ["trl True"]:
            raise SpaceError(f"{space.source}: trial.python: trl is not installed in {python}; {INSTALL_HINT}")

    def prepare_argv(self, space: Space) -> list[str] | None:
        """The launcher's ``--prepare`` (builds ``builtin:`` models and writes ``builtin:`` data once), unless the
        experiment names its own ``trial.prepare_command``."""
        if space.trial.prepare_command:
            return super().prepare_argv(space)
        return [trl_python(space), str(LAUNCHER), "--prepare", "--config", space.config, *space.trainer_overrides({})]

    def configure(self, attempt: Attempt) -> TrialConfig:
        """Fixed, tuned, ``extra`` (a confirmation run's seed and held-out split) and ``tail``; a search trial never
        scores the held-out split (``data.test_files=null``)."""
        space, extra = attempt.space, dict(attempt.extra)
        tuned = [o for o in space.trainer_overrides(dict(attempt.values)) if o.partition("=")[0] not in extra]
        overrides = [*tuned, *(f"{k}={format_value(v)}" for k, v in extra.items())]
        if TEST_KEY not in extra:
            overrides.append(f"{TEST_KEY}=null")
        overrides += attempt.tail
        merged = merged_config(space, overrides)
        merged["output_dir"] = str(attempt.trial_dir.absolute() / "checkpoints")
        steps = merged.get("max_steps")
        total = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
        text = f"# {space.config} with the trial's overrides (hpo/backends/trl/_train.py reads it so)\n" + \
            yaml.safe_dump(merged, sort_keys=False)
        return TrialConfig(overrides, total, text, loaded=merged)

    def metrics_path(self, trial_dir: Path, attempt: int) -> Path:
        return metrics_file(trial_dir, attempt)

    def command_line(self, space: Space, overrides: Sequence[str]) -> list[str]:
        """The launcher as a trial ran it, outside the driver: TRL's interpreter, the config, a metrics file (the
        launcher trains only with one; checkpoints go beside it, into ``./checkpoints``), the overrides and, as a search
        trial, no held-out split (unless ``overrides`` name one)."""
        test = [] if any(o.partition("=")[0].lstrip("+") == TEST_KEY for o in overrides) else [f"{TEST_KEY}=null"]
        return [trl_python(space), str(LAUNCHER), "--config", space.config, "--metrics-file", "metrics.jsonl",
                *overrides, *test]

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        space = attempt.space
        argv = [trl_python(space), str(LAUNCHER), "--config", space.config, "--metrics-file", str(attempt.metrics),
                *config.overrides, f"output_dir={attempt.trial_dir.absolute() / 'checkpoints'}"]
        if attempt.resume_from is not None:
            argv += resume_overrides(attempt.resume_from)
        env = dict(attempt.env)
        env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_DATASETS_OFFLINE="1")
        return Command(argv, env)
