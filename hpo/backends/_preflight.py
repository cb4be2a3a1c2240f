"""Will a trial fit? The memory estimate of :mod:`verl_core.memory` (pure arithmetic on the config and the
model's ``config.json``: no torch, no weights) against the trial's budget, before anything is launched.

* Per trial (``trial.preflight: true``, default-command studies): a trial whose estimate times
  ``1 + trial.preflight_margin`` exceeds its budget is not launched; it is recorded with the worst value
  and ``fail_reason=predicted_oom`` (``predicted_memory_gb``, ``memory_budget_gb``, ``memory_problem``).
* Per space: when every corner of the space is predicted not to fit, the search is refused before the
  study is created (one line naming the smallest corner's culprit).
* ``verl-hpo validate --space``: every corner's checks, warnings and estimate, exit 0 / 2.

The budget of a trial: on its GPUs the free memory (nvidia-smi) of the tightest one, lowered to
``trial.memory_limit_gb`` when set; on the CPU the available RAM, lowered to the cgroup limit and to
``trial.memory_limit_gb``.

Real verl spaces (``trial.backend: verl``) are estimated by :func:`predict_verl`: each corner is composed by
hydra in verl's interpreter (``hpo/backends/verl/_compose.py``, the keys of ``verl_core.memory_verl.VERL_MEMORY_KEYS``
selected) and ``verl_core.memory_verl.judge_verl`` does the arithmetic here (its module docstring has the mapping
and its limits), twice: at the expected sequence lengths and in the worst case (every sequence at its maximum). A
corner is refused only when its expected peak does not fit; when only the worst case does not, it passes with a
warning that names the lengths it assumed. The expected lengths are a previous run's (``lengths``: ``verl-hpo
validate --metrics`` of its metrics file); without one, the mean prompt length measured from the user's data (the
first :data:`MEASURED_PROMPTS` training prompts, tokenized with the model's own tokenizer and chat template in verl's
interpreter, before anything is launched; ``data.max_prompt_length`` when the tokenizer is not here) and a short
response of :data:`SHORT_RESPONSE_TOKENS` (prompts that cannot be measured here: ``data.max_prompt_length``, and a
corner is then never refused, only warned about). Until the estimate is checked against measured GPU peaks, it
refuses only what cannot fit even then: judged at the worst case, it refused verl's own device_tuning minimum
configs (Qwen2-7B on 2 GPUs, Qwen2.5-Coder-14B on 4, Qwen2-72B on 32), which verl documents as running.
verl always trains on GPUs: with none visible (``validate`` on a laptop) the budget is ``trial.memory_limit_gb``,
else a GPU of :data:`ASSUMED_GPU_GB` GiB, whose size also sets vLLM's ``gpu_memory_utilization`` share.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpo.backends._registry import backend_of
from hpo.experiment._space import Space, SpaceError

if TYPE_CHECKING:
    from verl_core.memory_verl import SequenceLengths

MAX_CORNERS = 64
GiB = 2**30
ASSUMED_GPU_GB = 80  # an A100/H100 80 GB: the GPU a verl estimate assumes when none is visible
MEASURED_PROMPTS = 256  # verl: training prompts tokenized for the expected prompt length
SHORT_RESPONSE_TOKENS = 64  # verl: the response length a corner must fit at when no previous run's lengths are known


@dataclass(frozen=True)
class Prediction:
    """One config's estimate against its budget."""

    total: int
    budget: int
    budget_source: str
    device: str
    problem: str | None  # None when it fits (margin included)
    table: str
    worst_total: int | None = None  # verl: the worst-case peak (every sequence at its maximum length)
    warning: str | None = None  # verl: set when the expected peak fits but the worst case does not

    @property
    def fits(self) -> bool:
        return self.problem is None


def _gpu_budget(devices: Sequence[str]) -> tuple[int, str] | None:
    from verl_core import memory

    gpus = memory.gpu_memory()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = [d.strip() for d in visible.split(",")] if visible is not None else [str(i) for i in range(len(gpus))]
    free = [gpus[order.index(d)][0] for d in devices if d in order and order.index(d) < len(gpus)]
    if not free:
        return None
    return min(free), f"free memory of GPU {','.join(devices)} (nvidia-smi)"


def predict(space: Space, overrides: Sequence[str], devices: Sequence[str] = (), loaded: Any = None) -> Prediction:
    """The estimate of ``space.config`` with ``overrides`` on ``devices`` (none: CPU) against the budget; ``loaded``:
    that config already loaded (a trial's, :class:`~hpo.backends._base.TrialConfig`)."""
    from verl_core import memory
    from verl_core.config import ConfigError, load_config

    try:
        cfg = loaded if loaded is not None else load_config(space.config, list(overrides))
        device = cfg.trainer.device if cfg.trainer.device in ("cpu", "cuda") else ("cuda" if devices else "cpu")
        est = memory.estimate(cfg, device=device)
    except ConfigError as err:
        raise SpaceError(f"{space.source}: memory estimate: {err}") from None
    cap = space.trial.memory_limit_gb
    gpu = _gpu_budget(devices) if device == "cuda" else None
    if gpu is not None:
        budget, source = gpu
        if cap is not None and cap * GiB < budget:
            budget, source = int(cap * GiB), f"trial.memory_limit_gb={cap}"
    else:
        avail = memory.available_bytes("cpu" if device == "cpu" else "cuda", cap)
        budget, source = avail.bytes, avail.source.replace("--memory-limit-gb ", "trial.memory_limit_gb=")
    margin = space.trial.preflight_margin
    return Prediction(est.total, budget, source, device, est.not_fitting(budget, margin),
                      est.render(budget, source))


# ----------------------------------------------------------------------------- real verl
def _verl_budget(space: Space, devices: Sequence[str], gpu_total_bytes: int | None) -> tuple[int, str, int]:
    """(budget, where it comes from, the GPU's total memory) of a verl trial on ``devices``."""
    from verl_core import memory

    cap = space.trial.memory_limit_gb
    gpus = memory.gpu_memory()
    total = gpu_total_bytes or (gpus[0][1] if gpus else ASSUMED_GPU_GB * GiB)
    gpu = _gpu_budget(devices) if devices else None
    if gpu is not None and (cap is None or gpu[0] <= cap * GiB):
        return gpu[0], gpu[1], total
    if cap is not None:
        return int(cap * GiB), f"trial.memory_limit_gb={cap}", total
    if gpu_total_bytes is not None:
        return gpu_total_bytes, f"a GPU of {gpu_total_bytes / GiB:.0f} GiB", total
    if space.trial.gpus_per_trial == 0:  # the trials train on the CPU: this is the estimate for a GPU, said so
        return total, (f"trials run on the CPU (trial.gpus_per_trial: 0): the estimate is for a {total / GiB:.0f} GiB "
                       "GPU, for when they get one"), total
    return total, (f"no GPU visible: an {ASSUMED_GPU_GB} GiB GPU assumed" if not gpus else
                   "total memory of GPU 0 (nvidia-smi; no device of the trial visible)"), total


def verl_memory_inputs(space: Space, corner_overrides: Sequence[Sequence[str]], n_gpus: int,
                       python: str | None = None, measure_prompts: int = 0,
                       extra_select: Sequence[str] = ()) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Compose each corner in verl's interpreter (as ``hpo.backends.verl.compose_corners`` does, with
    ``trainer.n_gpus_per_node=<n_gpus> trainer.nnodes=1`` last) and return per corner verl's ``info`` (use of a
    critic / reference) and the values of ``VERL_MEMORY_KEYS``. SpaceError for a corner verl rejects.
    ``measure_prompts``: the first corner's ``info["prompt_lengths"]`` holds the token counts of that many training
    prompts (``{"mean", "max", "rows", "tokenizer"}``, or ``{"error": ...}`` when they cannot be measured here).
    ``extra_select``: more keys whose values are returned beside ``VERL_MEMORY_KEYS``'."""
    import json
    import subprocess
    from pathlib import Path

    from hpo.backends.verl._check import COMPOSE_SCRIPT
    from hpo.backends.verl._launch import INSTALL_HINT, default_python, format_override, is_config_path
    from verl_core.memory_verl import VERL_MEMORY_KEYS

    python = python or space.trial.python or default_python()
    config_dir, name = None, space.config
    if is_config_path(space.config):
        path = Path(space.config).expanduser().resolve()
        config_dir, name = str(path.parent), path.stem
    gpus = [format_override("trainer.n_gpus_per_node", max(1, n_gpus)), format_override("trainer.nnodes", 1)]
    request = {"config_dir": config_dir, "config_name": name, "corners": [[*c, *gpus] for c in corner_overrides],
               "select": list(dict.fromkeys([*VERL_MEMORY_KEYS, *extra_select])), "measure_prompts": measure_prompts}
    try:
        res = subprocess.run([python, str(COMPOSE_SCRIPT)], input=json.dumps(request), capture_output=True,
                             text=True, timeout=600, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
        reply = json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError) as err:
        raise SpaceError(f"{space.source}: memory estimate: composing the verl config with {python} failed "
                         f"({type(err).__name__}); {INSTALL_HINT}") from None
    if reply["status"] != "ok":
        raise SpaceError(f"{space.source}: memory estimate: {reply['message']}")
    out = []
    for overrides, r in zip(corner_overrides, reply["results"], strict=True):
        if not r["ok"]:
            raise SpaceError(f"{space.source}: memory estimate: {' '.join(overrides)}: {r['message']}")
        info = r["info"] if "prompt_lengths" not in r else {**r["info"], "prompt_lengths": r["prompt_lengths"]}
        out.append((info, r["selected"]))
    return out


def data_lengths(values: dict[str, Any], measured: dict[str, Any] | None) -> SequenceLengths:
    """The lengths a verl corner must fit at when no previous run's are known: the mean prompt measured from the
    data (``measured``: :func:`verl_memory_inputs`' ``prompt_lengths``), else ``data.max_prompt_length``, and a
    response of :data:`SHORT_RESPONSE_TOKENS` (at most ``data.max_response_length``)."""
    from verl_core.memory_verl import SequenceLengths

    max_prompt = float(values.get("data.max_prompt_length") or 512)
    response = float(min(SHORT_RESPONSE_TOKENS, int(values.get("data.max_response_length") or SHORT_RESPONSE_TOKENS)))
    if measured and "mean" in measured:
        return SequenceLengths(min(float(measured["mean"]), max_prompt), response,
                               f"prompts measured from {measured.get('rows')} rows of the training data, a "
                               f"{response:.0f}-token response assumed")
    why = (measured or {}).get("error") or "the data was not measured"
    return SequenceLengths(max_prompt, response, f"prompts at data.max_prompt_length ({why}), a {response:.0f}-token "
                                                 "response assumed")


def _verl_prediction(space: Space, info: dict[str, Any], values: dict[str, Any], devices: Sequence[str],
                     gpu_total_bytes: int | None, lengths: SequenceLengths | None, refuse: bool = True) -> Prediction:
    """One corner's verdict; ``refuse=False`` (lengths assumed, not measured) turns a refusal into a warning."""
    from verl_core.config import ConfigError
    from verl_core.memory_verl import ModelConfigUnavailable, judge_verl

    budget, source, total = _verl_budget(space, devices, gpu_total_bytes)
    margin = space.trial.preflight_margin
    try:
        v = judge_verl(values, use_critic=bool(info["use_critic"]), use_ref=bool(info["use_reference_policy"]),
                       lengths=lengths, gpu_total_bytes=total)
    except ModelConfigUnavailable:
        raise
    except ConfigError as err:
        raise SpaceError(f"{space.source}: memory estimate: {err}") from None
    table = v.expected.render(budget, source)
    if v.lengths is not None:
        table = (f"at the expected lengths: {v.lengths.describe()}\n{table}\nworst case (every sequence at "
                 f"max_prompt_length + max_response_length): {v.worst.total / GiB:.2f} GiB in phase "
                 f"{v.worst.peak_phase}")
    # Refused only when the expected peak does not fit the GPU itself: verl's largest phase is vLLM's reserved
    # slice (gpu_memory_utilization), which is already a fraction of the GPU, so a margin on top would refuse verl's
    # own quickstart (21.8 of 22.5 GiB). The margin (and the worst case) only warn.
    problem = v.expected.not_fitting(budget, 0.0)
    if problem and not refuse:
        assumed = v.lengths.describe() if v.lengths else "unknown"
        return Prediction(v.expected.total, budget, source, "cuda", None, table, v.worst.total,
                          f"not refused, since its prompts could not be measured ({assumed}): {problem}")
    return Prediction(v.expected.total, budget, source, "cuda", problem, table,
                      v.worst.total, v.warning(budget, margin) or (
                          None if v.expected.fits(budget, margin) else
                          f"the expected peak is within trial.preflight_margin={margin} of the GPU's memory"))


def predict_verl_corners(space: Space, corner_overrides: Sequence[Sequence[str]], devices: Sequence[str] = (),
                         gpu_total_bytes: int | None = None, python: str | None = None, *,
                         lengths: SequenceLengths | None = None) -> list[Prediction]:
    """:func:`predict_verl` of several corners with one verl subprocess."""
    n_gpus = len(devices) or space.trial.gpus_per_trial
    inputs = verl_memory_inputs(space, corner_overrides, n_gpus, python, 0 if lengths else MEASURED_PROMPTS)
    return predictions_from_inputs(space, inputs, devices, lengths, gpu_total_bytes)


def predictions_from_inputs(space: Space, inputs: Sequence[tuple[dict[str, Any], dict[str, Any]]],
                            devices: Sequence[str], lengths: SequenceLengths | None,
                            gpu_total_bytes: int | None = None) -> list[Prediction]:
    """The verdicts of corners already composed by :func:`verl_memory_inputs` (at the measured prompts when
    ``lengths`` is None; see the module docstring)."""
    measured = inputs[0][0].get("prompt_lengths") if inputs else None
    refuse = lengths is not None or bool(measured and "mean" in measured)
    return [_verl_prediction(space, info, values, devices, gpu_total_bytes, lengths or data_lengths(values, measured),
                             refuse) for info, values in inputs]


def predict_verl(space: Space, overrides: Sequence[str], devices: Sequence[str] = (),
                 gpu_total_bytes: int | None = None, python: str | None = None, *,
                 lengths: SequenceLengths | None = None) -> Prediction:
    """The estimate of a real verl trial (``space.config`` composed with ``overrides``, FSDP over the trial's
    ``devices``, else ``trial.gpus_per_trial`` GPUs) against its budget (see the module docstring).

    ``gpu_total_bytes``: the GPU's size when no GPU is visible (default :data:`ASSUMED_GPU_GB`). ``lengths``: the
    expected mean prompt / response lengths (None: :func:`data_lengths`). Raises
    ``verl_core.memory_verl.ModelConfigUnavailable`` when the model's ``config.json`` cannot be found without a
    download (a hub id not in the cache), SpaceError when verl rejects the config."""
    return predict_verl_corners(space, [overrides], devices, gpu_total_bytes, python, lengths=lengths)[0]


def corners(space: Space) -> list[dict[str, Any]]:
    """Every parameter at its ends (or each choice), jointly; at most MAX_CORNERS."""
    combos = itertools.islice(itertools.product(*(p.corner_values() for p in space.params)), MAX_CORNERS)
    return [{p.name: v for p, v in zip(space.params, combo, strict=True)} for combo in combos]


def _shown(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items())


def check_space_fits(space: Space, devices: Sequence[str], *, lengths: SequenceLengths | None = None) -> None:
    """SpaceError when no corner of the space is predicted to fit (a study that could only record failures); for
    verl, at the expected ``lengths`` when given."""
    backend = backend_of(space).name
    if not (space.trial.preflight and backend in ("verl_core", "verl")):
        return
    per_trial = list(devices[: space.trial.gpus_per_trial])
    cs = corners(space)
    if backend == "verl":
        from verl_core.memory_verl import ModelConfigUnavailable

        try:
            verl = predict_verl_corners(space, [space.trainer_overrides(c) for c in cs], per_trial, lengths=lengths)
        except ModelConfigUnavailable:
            return  # the trial downloads the model; nothing to estimate it from here
        predictions = list(zip(cs, verl, strict=True))
    else:
        predictions = [(c, predict(space, space.trainer_overrides(c), per_trial)) for c in cs]
    if predictions and not any(p.fits for _, p in predictions):
        values, smallest = min(predictions, key=lambda cp: cp[1].total)
        raise SpaceError(f"{space.source}: every corner of the space is predicted not to fit in memory (smallest: "
                         f"{_shown(values)} {smallest.problem}); lower the batch sizes or raise "
                         "trial.memory_limit_gb, or set trial.preflight: false")


def validate_space(space: Space, devices: Sequence[str], out: Any, *, lengths: SequenceLengths | None = None) -> int:
    """Print every corner's verdict (and the largest corner's table); 0 when all fit, else 2 with one line.
    ``lengths``: expected sequence lengths for verl spaces (``verl-hpo validate --metrics``)."""
    from verl_core.config import ConfigError, load_config
    from verl_core.validate import best_practice_warnings

    backend = backend_of(space).name
    if backend == "verl":
        return _validate_verl(space, devices, out, lengths)
    if backend != "verl_core":
        what = ("trial.command is not the default trainer: only the space itself was checked" if backend == "command"
                else f"trial.backend {backend}: keys and corners checked by the trainer; no memory estimate")
        print(f"{space.source}: {what}", file=out)
        print("All checks passed", file=out)
        return 0
    per_trial = list(devices[: space.trial.gpus_per_trial])
    results = []
    warnings: set[str] = set()
    for values in corners(space):
        overrides = space.trainer_overrides(values)
        try:
            warnings.update(best_practice_warnings(load_config(space.config, overrides)))
        except ConfigError as err:
            raise SpaceError(f"{space.source}: {_shown(values)}: {err}") from None
        results.append((values, predict(space, overrides, per_trial)))
    return _report(space, results, sorted(warnings), out)


def _validate_verl(space: Space, devices: Sequence[str], out: Any, lengths: SequenceLengths | None) -> int:
    """The verl branch of :func:`validate_space`: the corners were composed and checked by verl when the space was
    loaded; here each is estimated (one more verl subprocess)."""
    from hpo.backends.verl._data import overlong_verdict
    from verl_core.memory_verl import ModelConfigUnavailable

    print(f"{space.source}: every corner composed and checked with verl's own config code "
          f"({space.trial.python or 'the verl venv'})", file=out)
    from hpo.backends.verl._resume import retry_note

    note = retry_note(space)
    if note:
        print(f"note: {note}", file=out)
    per_trial = list(devices[: space.trial.gpus_per_trial])
    values = corners(space)
    # every prompt of the data against data.max_prompt_length, in the same verl subprocess as the estimate
    inputs = verl_memory_inputs(space, [space.trainer_overrides(c) for c in values],
                                len(per_trial) or space.trial.gpus_per_trial, None, MEASURED_PROMPTS)
    verdict = overlong_verdict(((inputs[0][0].get("prompt_lengths") or {}) if inputs else {}).get("overlong"))
    if verdict is not None and verdict[0] == "problem":
        print(f"error: {space.source}: overrides.data.max_prompt_length: {verdict[1]}", file=sys.stderr)
        return 2
    if verdict is not None:
        print(f"{verdict[0]}: {verdict[1]}", file=out)
    try:
        preds = predictions_from_inputs(space, inputs, per_trial, lengths)
    except ModelConfigUnavailable as err:
        print(f"memory estimate skipped: {err}", file=out)
        print("All checks passed", file=out)
        return 0
    return _report(space, list(zip(values, preds, strict=True)), [], out)


def _report(space: Space, results: list[tuple[dict[str, Any], Prediction]], warnings: list[str], out: Any) -> int:
    """Every corner's verdict, the warnings, the largest corner's table; 0 when all fit, else 2 with one line."""
    worst: tuple[dict[str, Any], Prediction] | None = None
    bad: list[tuple[dict[str, Any], Prediction]] = []
    for values, pred in results:
        verdict = "DOES NOT FIT" if not pred.fits else "fits (worst case does not)" if pred.warning else "fits"
        worst_case = (f", worst case {pred.worst_total / GiB:.3f} GiB" if pred.worst_total is not None
                      and pred.worst_total != pred.total else "")
        device = ("a GPU, when the trials get one" if pred.device == "cuda" and space.trial.gpus_per_trial == 0
                  else pred.device)  # a CPU study's trial is never said to run "on cuda"
        print(f"corner {_shown(values)}: {pred.total / GiB:.3f} GiB{worst_case} of {pred.budget / GiB:.3f} GiB "
              f"({pred.budget_source}) on {device}: {verdict}", file=out)
        if pred.warning:
            warnings = [*warnings, f"corner {_shown(values)}: {pred.warning}"]
        if worst is None or pred.total > worst[1].total:
            worst = (values, pred)
        if not pred.fits:
            bad.append((values, pred))
    for w in warnings:
        print(f"warning: {w}", file=out)
    if worst is not None:
        print(f"\nlargest corner ({_shown(worst[0])}):\n{worst[1].table}\n", file=out)
    if bad:
        values, pred = bad[0]
        print(f"error: {space.source}: {len(bad)} corner(s) predicted not to fit in memory; first: {_shown(values)} "
              f"{pred.problem}", file=sys.stderr)
        return 2
    print("All checks passed", file=out)
    return 0
