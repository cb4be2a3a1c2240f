"""The memory pre-flight of real verl trials (``trial.backend: verl``; :mod:`hpo.backends._preflight` says when it
runs): :func:`predict_verl` estimates a trial. Each corner is composed by hydra in verl's interpreter
(``hpo/backends/verl/_compose.py``, the keys of :data:`~hpo.backends.verl._memory_model.VERL_MEMORY_KEYS` selected) and
:func:`~hpo.backends.verl._memory_model.judge_verl` does the arithmetic here (its module docstring has the mapping and
its limits), twice: at the expected sequence lengths and in the worst case (every sequence at its maximum). A corner is
refused only when its expected peak does not fit; when only the worst case does not, it passes with a warning that names
the lengths it assumed. The expected lengths are a previous run's (``lengths``: ``verl-hpo validate --metrics`` of its
metrics file); without one, the mean prompt length measured from the user's data (the first :data:`MEASURED_PROMPTS`
training prompts, tokenized with the model's own tokenizer and chat template in verl's interpreter, before anything is
launched; ``data.max_prompt_length`` when the tokenizer is not here) and a short response of
:data:`SHORT_RESPONSE_TOKENS` (prompts that cannot be measured here: ``data.max_prompt_length``, and a corner is then
never refused, only warned about). Until the estimate is checked against measured GPU peaks, it refuses only what cannot
fit even then: judged at the worst case, it refused verl's own device_tuning minimum configs (Qwen2-7B on 2 GPUs,
Qwen2.5-Coder-14B on 4, Qwen2-72B on 32), which verl documents as running. verl always trains on GPUs: with none visible
(``validate`` on a laptop) the budget is ``trial.memory_limit_gb``, else a GPU of :data:`ASSUMED_GPU_GB` GiB, whose size
also sets vLLM's ``gpu_memory_utilization`` share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from hpo.backends._preflight import GiB, Prediction, corners, gpu_budget, report_corners, shown
from hpo.backends._shapes import EstimateError, SequenceLengths
from hpo.backends.verl._batch import feasible_corners
from hpo.backends.verl._check import COMPOSE_SCRIPT, ComposeTimeout, compose_timed_out, compose_timeout
from hpo.backends.verl._data import overlong_verdict
from hpo.backends.verl._launch import INSTALL_HINT, default_python, format_override, is_config_path, verl_overrides
from hpo.backends.verl._memory_model import VERL_MEMORY_KEYS, judge_verl
from hpo.backends.verl._model_config import ModelConfigUnavailable
from hpo.backends.verl._resume import retry_note
from hpo.experiment import Space, SpaceError

ASSUMED_GPU_GB = 80  # an A100/H100 80 GB: the GPU a verl estimate assumes when none is visible
MEASURED_PROMPTS = 256  # verl: training prompts tokenized for the expected prompt length
SHORT_RESPONSE_TOKENS = 64  # verl: the response length a corner must fit at when no previous run's lengths are known
MAX_REASON = 500  # characters of verl's reason for rejecting a corner in an error line


def corner_overrides_of(space: Space, values: dict[str, Any]) -> list[str]:
    """A corner's hydra overrides as a verl trial gets them (:func:`~hpo.backends.verl._launch.verl_overrides`: a
    string hydra cannot read bare, e.g. ``~/x.parquet`` or ``a b``, quoted), secrets as references."""
    return verl_overrides(space.fixed_overrides(), {p.key: values[p.name] for p in space.params if p.name in values})


def _verl_budget(space: Space, devices: Sequence[str], gpu_total_bytes: int | None) -> tuple[int, str, int]:
    """(budget, where it comes from, the GPU's total memory) of a verl trial on ``devices``."""
    from hpo.backends._shapes import gpu_memory  # looked up at each call (the tests replace it)

    cap = space.trial.memory_limit_gb
    gpus = gpu_memory()
    total = gpu_total_bytes or (gpus[0][1] if gpus else ASSUMED_GPU_GB * GiB)
    gpu = gpu_budget(devices) if devices else None
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
                       extra_select: Sequence[str] = (),
                       check_rows: dict[str, Any] | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Compose each corner in verl's interpreter (as :func:`hpo.backends.verl._check.compose_corners` does, with
    ``trainer.n_gpus_per_node=<n_gpus> trainer.nnodes=1`` last) and return per corner verl's ``info`` (use of a
    critic / reference) and the values of ``VERL_MEMORY_KEYS``. SpaceError for a corner verl rejects.
    ``measure_prompts``: the first corner's ``info["prompt_lengths"]`` holds the token counts of that many training
    prompts (``{"mean", "max", "rows", "tokenizer"}``, or ``{"error": ...}`` when they cannot be measured here).
    ``extra_select``: more keys whose values are returned beside ``VERL_MEMORY_KEYS``'. ``check_rows``
    (:func:`hpo.backends.verl._rows.row_check_request`): the first corner's ``info["rows"]`` holds what verl's own
    data path and the reward found on every row (:func:`hpo.backends.verl._rows.row_lines` reads it)."""
    python = python or space.trial.python or default_python()
    config_dir, name = None, space.config
    if is_config_path(space.config):
        path = Path(space.config).expanduser().resolve()
        config_dir, name = str(path.parent), path.stem
    gpus = [format_override("trainer.n_gpus_per_node", max(1, n_gpus)), format_override("trainer.nnodes", 1)]
    request = {"config_dir": config_dir, "config_name": name, "corners": [[*c, *gpus] for c in corner_overrides],
               "select": list(dict.fromkeys([*VERL_MEMORY_KEYS, *extra_select])), "measure_prompts": measure_prompts,
               "check_rows": check_rows}
    limit = compose_timeout()
    try:
        res = subprocess.run([python, str(COMPOSE_SCRIPT)], input=json.dumps(request), capture_output=True,
                             text=True, timeout=limit, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
        reply = json.loads(res.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired as slow:  # a busy host, not a missing verl, unless the reward hung
        from hpo.backends.verl._rows import hung_reward

        if hung_reward(slow.stderr):
            raise SpaceError(f"{space.source}: reward.custom_reward_function: the reward function did not return: "
                             f"calling it before launch took the rest of the {limit:g} s the check may take (does it "
                             "loop, or wait on something, beyond the reach of a signal?)") from None
        raise ComposeTimeout(f"{space.source}: memory estimate: " + compose_timed_out(
            f"composing {len(corner_overrides)} verl configs", python, limit), "config") from None
    except (OSError, subprocess.SubprocessError, IndexError, ValueError) as err:
        raise SpaceError(f"{space.source}: memory estimate: composing the verl config with {python} failed "
                         f"({type(err).__name__}); {INSTALL_HINT}") from None
    if reply["status"] != "ok":
        raise SpaceError(f"{space.source}: memory estimate: {str(reply['message'])[:MAX_REASON]}")
    out = []
    for r in reply["results"]:
        if not r["ok"]:  # the message names the override (never every override of the corner: kilobytes)
            raise SpaceError(f"{space.source}: memory estimate: {str(r['message'])[:MAX_REASON]}")
        info = {**r["info"], **{k: r[k] for k in ("prompt_lengths", "rows") if k in r}}
        out.append((info, r["selected"]))
    return out


def data_lengths(values: dict[str, Any], measured: dict[str, Any] | None) -> SequenceLengths:
    """The lengths a verl corner must fit at when no previous run's are known: the mean prompt measured from the
    data (``measured``: :func:`verl_memory_inputs`' ``prompt_lengths``), else ``data.max_prompt_length``, and a
    response of :data:`SHORT_RESPONSE_TOKENS` (at most ``data.max_response_length``)."""
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
    budget, source, total = _verl_budget(space, devices, gpu_total_bytes)
    margin = space.trial.preflight_margin
    try:
        v = judge_verl(values, use_critic=bool(info["use_critic"]), use_ref=bool(info["use_reference_policy"]),
                       lengths=lengths, gpu_total_bytes=total)
    except ModelConfigUnavailable:
        raise
    except EstimateError as err:
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
    :class:`~hpo.backends.verl._model_config.ModelConfigUnavailable` when the model's ``config.json`` cannot be found
    without a download (a hub id not in the cache), SpaceError when verl rejects the config."""
    return predict_verl_corners(space, [overrides], devices, gpu_total_bytes, python, lengths=lengths)[0]


def corner_predictions(space: Space, devices: Sequence[str],
                       lengths: SequenceLengths | None = None) -> list[tuple[dict[str, Any], Prediction]] | None:
    """Each corner of the space with its verdict on one trial's ``devices`` (one verl subprocess for all), at the
    expected ``lengths`` when given; None when the model's ``config.json`` cannot be read here without a download
    (the trial downloads the model; nothing to estimate it from here). A corner verl refuses while each of its values
    runs in another is left out: a trial drawing it is not launched
    (:func:`~hpo.backends.verl._batch.feasible_corners`)."""
    cs, _ = feasible_corners(space, corners(space))
    try:
        verl = predict_verl_corners(space, [corner_overrides_of(space, c) for c in cs], devices, lengths=lengths)
    except ModelConfigUnavailable:
        return None
    return list(zip(cs, verl, strict=True))


def validate_verl(space: Space, devices: Sequence[str], out: TextIO, lengths: SequenceLengths | None) -> int:
    """``verl-hpo validate`` of a verl space on one trial's ``devices``: the corners were composed and checked by verl
    when the space was loaded; here every prompt of the data is checked against ``data.max_prompt_length`` and each
    corner is estimated (one more verl subprocess)."""
    print(f"{space.source}: every corner composed and checked with verl's own config code "
          f"({space.trial.python or 'the verl venv'})", file=out)
    note = retry_note(space)
    if note:
        print(f"note: {note}", file=out)
    from hpo.backends.verl._rows import field_of, row_check_request, row_lines

    per_trial = list(devices)
    values, skipped = feasible_corners(space, corners(space))
    for corner, why in skipped:  # each of its values runs in another corner (hpo.experiment._combos)
        print(f"corner {shown(corner)}: infeasible, skipped (a trial drawing it is not launched): {why}", file=out)
    # every row of the data through verl's own data path, the reward on every distinct ground truth, every prompt
    # against data.max_prompt_length: in the same verl subprocess as the estimate
    inputs = verl_memory_inputs(space, [corner_overrides_of(space, c) for c in values],
                                len(per_trial) or space.trial.gpus_per_trial, None, MEASURED_PROMPTS,
                                check_rows=row_check_request())
    first = inputs[0][0] if inputs else {}
    lines = row_lines(space, first.get("rows"))
    verdict = overlong_verdict((first.get("prompt_lengths") or {}).get("overlong"))
    if verdict is not None:
        lines.append((verdict[0], field_of(space, "data.max_prompt_length"), verdict[1]))
    for level, where, line in lines:
        if level == "problem":
            print(f"error: {space.source}: {where}: {line}", file=sys.stderr)
        else:
            print(f"{level}: {line}" if level != "ok" else line, file=out)
    if any(level == "problem" for level, _, _ in lines):
        return 2
    try:
        preds = predictions_from_inputs(space, inputs, per_trial, lengths)
    except ModelConfigUnavailable as err:
        print(f"memory estimate skipped: {err}", file=out)
        print("All checks passed", file=out)
        return 0
    return report_corners(space, list(zip(values, preds, strict=True)), [], out)
