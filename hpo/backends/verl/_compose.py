"""Compose and validate verl configs in verl's own interpreter: what ``_composer.compose_corners`` runs.

    <verl's python> hpo/backends/verl/_compose.py < request.json

Request: ``{"config_dir": DIR or null, "config_name": NAME, "corners": [[override, ...], ...]}`` (null: the
installed package's ``verl/trainer/config``, as ``python -m verl.trainer.main_ppo`` uses), optionally
``"select": [dotted key, ...]``: the values of those keys in each composed corner (interpolations resolved; a
key the config lacks is null), what the memory estimate reads (``_memory_model.VERL_MEMORY_KEYS``), and
``"measure_prompts": N``: the token counts of the first N training prompts, in the first corner's result as
``"prompt_lengths"`` (:func:`measure_prompts`: the model's own tokenizer and chat template, from a local directory or
the Hugging Face cache, never downloaded), and ``"check_rows": {"rows_s", "reward_call_s", "reward_s"}``: verl's
own data path on the rows of every data file and the reward on every distinct ground truth, in the first corner's
result as ``"rows"`` (``_compose_datapath.check_rows``, within those time limits). The reply is the one line on
stdout (everything verl prints goes to stderr):

* ``{"status": "ok", "results": [one per corner]}``, each ``{"ok": true, "info": {...}, "seconds": s}`` (with
  ``"selected": {key: value}`` when the request selects keys) or
  ``{"ok": false, "key": KEY or null, "value": VALUE or null, "message": ONE LINE, "seconds": s}`` for a corner
  that hydra cannot compose, that :func:`extra_checks` rejects, or that verl's own
  ``verl.utils.config.validate_config`` rejects (in this order: ours name the key and value in verl's terms)
* ``{"status": "missing", "message": ...}`` when this interpreter has no verl or hydra, ``{"status": "error",
  "message": ...}`` when the config does not exist (or anything unexpected happens).

Each corner: hydra's ``compose(config_name, overrides)`` (the overrides ``main_ppo`` would get), then
:func:`extra_checks`, then ``validate_config(cfg, use_reference_policy=need_reference_policy(cfg),
use_critic=need_critic(cfg))`` from ``verl.trainer.ppo.utils``, as ``main_ppo.main`` calls it. Only the CPU is used.
This file imports nothing of the project, so that it runs in any interpreter that has verl: only its neighbours,
``_compose_checks`` (:func:`extra_checks`, :func:`describe`) and ``_compose_data`` (:func:`measure_prompts`), on
``sys.path`` when it runs as a script.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import time
from typing import Any

if __package__:  # imported as hpo.backends.verl._compose
    from ._compose_checks import ReasonedLoadError, describe, extra_checks
    from ._compose_data import _one_line, measure_prompts
    from ._compose_datapath import check_rows
else:  # run in verl's interpreter: the neighbours beside it (its directory is on sys.path, unless PYTHONSAFEPATH)
    if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _compose_checks import ReasonedLoadError, describe, extra_checks  # type: ignore[no-redef]
    from _compose_data import _one_line, measure_prompts  # type: ignore[no-redef]
    from _compose_datapath import check_rows  # type: ignore[no-redef]


# ----------------------------------------------------------------------------- compose + validate
def _culprit(message: str, overrides: list[str]) -> tuple[str | None, str | None]:
    """The override a hydra error message names (``'key'`` in quotes), as (key, value)."""
    for o in overrides:
        key, _, value = o.partition("=")
        bare = key.lstrip("+~")
        if re.search(rf"['\"]{re.escape(bare)}['\"]", message) or re.search(rf"\b{re.escape(o)}\b", message):
            return bare, value
    return None, None


def _compose_error(err: Exception, overrides: list[str]) -> dict[str, Any]:
    """Hydra's composition error as one line naming the override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    text = _one_line(f"{err} {err.__cause__ or ''}")
    text = re.sub(r"\s*full_key: \S+", "", text)
    key, value = _culprit(text, overrides)
    if key is None:  # a syntax error names no key: find the override hydra cannot parse
        parser = OverridesParser.create()
        for o in overrides:
            try:
                parser.parse_override(o)
            except Exception as bad:  # noqa: BLE001 - hydra's OverrideParseException
                key, _, value = o.partition("=")
                return {"ok": False, "key": key.lstrip("+~"), "value": value,
                        "message": f"override '{o}': not hydra override syntax ({_one_line(str(bad))})"}
        return {"ok": False, "key": None, "value": None, "message": text}
    if "is not in struct" in text:
        text = f"{key} is not a key of verl's config (add a new key with +{key}={value})"
    elif "already at" in text:
        text = f"{key} is already in verl's config: set it without '+' (or with '++')"
    return {"ok": False, "key": key, "value": value, "message": f"override '{key}={value}': {text}"}


def select(cfg: Any, keys: list[str]) -> dict[str, Any]:
    """``{key: value}`` of the composed config, as plain JSON values (a missing or unresolvable key is None)."""
    from omegaconf import OmegaConf

    out: dict[str, Any] = {}
    for key in keys:
        try:
            value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
            if OmegaConf.is_config(value):
                value = OmegaConf.to_container(value, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve: unknown to the estimate
            value = None
        out[key] = value if value != "???" else None
    return out


def check_corner(compose: Any, validate: Any, name: str, overrides: list[str],
                 keys: list[str] | None = None, measure_rows: int = 0,
                 rows: dict[str, Any] | None = None) -> dict[str, Any]:
    """One corner: ``{"ok": true, "info": ...[, "selected": ...]}`` or ``{"ok": false, "key", "value", "message"}``."""
    try:
        cfg = compose(config_name=name, overrides=overrides)
    except Exception as err:  # noqa: BLE001 - hydra's errors: unknown key, bad syntax, bad value type
        return _compose_error(err, overrides)
    validate_config, need_critic, need_reference_policy = validate()
    try:
        use_critic, use_ref = bool(need_critic(cfg)), bool(need_reference_policy(cfg))
        problem = extra_checks(cfg, use_critic, use_ref)
        if problem is None:
            validate_config(cfg, use_reference_policy=use_ref, use_critic=use_critic)
    except Exception as err:  # noqa: BLE001 - verl raises AssertionError, ValueError, InstantiationException
        cause = err.__cause__ or err.__context__
        text = _one_line(f"{err}" + (f" ({cause})" if cause and str(cause) not in str(err) else ""))
        text = re.sub(r"^Error in call to target '[\w.]+': ", "", text)  # hydra's InstantiationException
        return {"ok": False, "key": None, "value": None,
                "message": f"verl's validate_config: {type(err).__name__}: {text}"}
    if problem is not None:
        key, value, message = problem
        return {"ok": False, "key": key, "value": json.dumps(value), "message": message}
    try:
        result = {"ok": True, "info": describe(cfg, use_critic, use_ref)}
    except ReasonedLoadError as err:
        return {"ok": False, "key": "reward.custom_reward_function.path", "value": None, "message": str(err)}
    if keys:
        result["selected"] = select(cfg, keys)
    if measure_rows:
        result["prompt_lengths"] = measure_prompts(cfg, measure_rows)
    if rows is not None:
        try:
            result["rows"] = check_rows(cfg, rows)
        except Exception as err:  # noqa: BLE001 - the check's own failure is a note, never the corner's
            result["rows"] = {"problems": [], "notes": [f"the rows were not checked with verl's own data path: "
                                                        f"{type(err).__name__}: {_one_line(str(err))[:300]}"]}
    return result


def probe_interpreter() -> dict[str, Any]:
    """What this interpreter can run a verl trial with, found without importing anything heavy: torch's CUDA
    build (``cuda = '12.8'`` in ``torch/version.py``; None for a CPU wheel), whether vLLM, SGLang and
    flash-attn are installed, the version verl reads for vLLM (the ``vllm`` distribution's: ``+cpu`` for the CPU
    build's alias) and whether the CPU platform plugin (``plugins/verl-cpu``) is there."""
    def has(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    torch_version, cuda = None, None
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = open(os.path.join(folder, "version.py")).read()
        except OSError:
            continue
        m = re.search(r"^__version__\s*=\s*'([^']*)'", text, re.M)
        torch_version = m.group(1) if m else None
        m = re.search(r"^cuda(?::[^=]*)?=\s*'([^']*)'", text, re.M)
        cuda = m.group(1) if m else None
        break
    try:
        vllm_version: str | None = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm_version = None
    return {"python": sys.executable, "torch": torch_version, "torch_cuda": cuda, "vllm": has("vllm"),
            "vllm_version": vllm_version, "sglang": has("sglang"), "flash_attn": has("flash_attn"),
            "verl": has("verl"), "verl_cpu_platform": has("verl_cpu_platform")}


def run(request: dict[str, Any]) -> dict[str, Any]:
    if request.get("probe_only"):
        return {"status": "ok", "results": [], "interpreter": probe_interpreter()}
    spec = importlib.util.find_spec("verl")
    if spec is None or importlib.util.find_spec("hydra") is None:
        return {"status": "missing", "message": "verl is not installed in this interpreter"}
    from hydra import compose, initialize_config_dir

    config_dir = request.get("config_dir") or os.path.join(list(spec.submodule_search_locations or [])[0],
                                                           "trainer", "config")
    name = request["config_name"]
    if not any(os.path.isfile(os.path.join(config_dir, name + ext)) for ext in (".yaml", ".yml", "")):
        return {"status": "error", "message": f"config {name!r}: not found in {config_dir}"}
    imported: list[Any] = []

    def validate() -> Any:  # verl's own checks import torch: once, after the first compose
        if not imported:
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            imported.extend((validate_config, need_critic, need_reference_policy))
        return imported

    results = []
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for i, overrides in enumerate(request["corners"]):
            started = time.monotonic()
            # the prompts are the same in every corner unless a corner sets the data or the model: measured once
            result = check_corner(compose, validate, name, list(overrides), request.get("select"),
                                  int(request.get("measure_prompts") or 0) if i == 0 else 0,
                                  request.get("check_rows") if i == 0 else None)
            result["seconds"] = round(time.monotonic() - started, 3)
            results.append(result)
    return {"status": "ok", "results": results, "interpreter": probe_interpreter()}


def serve(handler: Any) -> int:
    """Answer the JSON request on stdin with ``handler(request)`` as the one line on the real stdout (verl, hydra and
    transformers print to stderr meanwhile); anything unexpected is still one ``{"status": "error"}`` line."""
    reply_to = sys.stdout
    sys.stdout = sys.stderr
    try:
        reply = handler(json.load(sys.stdin))
    except Exception as err:  # noqa: BLE001 - anything unexpected is still one line for the driver
        reply = {"status": "error", "message": f"{type(err).__name__}: {_one_line(str(err))[:500]}"}
    reply_to.write(json.dumps(reply) + "\n")
    reply_to.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(run))
