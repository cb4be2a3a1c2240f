"""verl's own data path and the user's reward on the rows of a verl experiment, before launch, in verl's interpreter:
:func:`check_rows`, which ``_compose.py`` runs for ``validate`` and the rehearsal's first step.

1. Every row of each train and val file is read once by columns (``_compose_rows.SplitScan``: message shapes,
   ``data_source``, distinct ground truths, the rows to check row by row).
2. **verl's own data path** (:func:`verl_data_path`) on those rows, as far as :data:`ROWS_BUDGET_S` allows (what was
   left is said): written to a scratch file and loaded by verl's own dataset class (``get_dataset_class(data)``:
   ``RLHFDataset`` unless ``data.custom_cls``), each row taken as the trainer takes it (``dataset[i]``), its
   multimodal parts extracted and its prompt built by the continuous-token builder the agent loop uses
   (``create_continuous_token_builder`` with the model's ``model_type``, ``build_initial_tokens``: the chat
   template, ``data.apply_chat_template_kwargs``), with the tokenizer loaded as verl's ``HFModelConfig`` loads it
   (:func:`verl_tokenizer`). A row that raises there is named by file and row with verl's own exception: verl 0.9.1
   drops it (``data.filter_overlong_prompts``: at load; else the agent loop logs ``Error in _run_prompt`` and leaves
   the prompt out), so a study would train and validate on fewer prompts without a word.
3. **The reward** (``_compose_reward.call_reward``) on every distinct ground truth of both splits, validation first
   (up to ``_compose_rows.MAX_TRUTHS`` a split, then the random sample's rows); a raise names the rows that hold the
   value.

Reply: ``{"problems": [ONE LINE, ...], "notes": [...], "reward": {...}, "splits": {split: {...}}, "seconds": s}``;
each problem line starts with the key it is about (``data.val_files: ...``, ``reward.custom_reward_function: ...``).
Imports nothing of the project (runs in verl's interpreter beside its neighbours).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

if __package__:
    from ._compose_data import _files, _get, _one_line, _tokenizer_source
    from ._compose_reward import BUDGET_S, CALL_S, call_reward
    from ._compose_rows import SplitScan
else:  # run in verl's interpreter: the neighbours are on sys.path
    from _compose_data import _files, _get, _one_line, _tokenizer_source  # type: ignore[no-redef]
    from _compose_reward import BUDGET_S, CALL_S, call_reward  # type: ignore[no-redef]
    from _compose_rows import SplitScan  # type: ignore[no-redef]

ROWS_BUDGET_S = 20.0  # verl's data path, all splits together (validate; the rows left unchecked are said)
REWARD_SAMPLE = 1_024  # rows of the random sample scored when a split has more distinct ground truths than recorded
SPLITS = (("val", "validation"), ("train", "training"))  # validation first: usually small, checked whole


def verl_tokenizer(cfg: Any) -> tuple[Any, Any, str | None, str | None]:
    """(tokenizer, processor, source directory, the model's ``model_type``) as verl's ``HFModelConfig`` loads them
    (``hf_tokenizer``, ``hf_processor``, the processor given the tokenizer's chat template, then
    ``actor_rollout_ref.model.custom_chat_template``), from a local directory or the Hugging Face cache (never
    downloaded). ValueError (one line) when there is none here."""
    from verl.utils import hf_processor, hf_tokenizer

    model = "actor_rollout_ref.model"
    path = str(_get(cfg, f"{model}.tokenizer_path") or _get(cfg, f"{model}.path"))
    source = _tokenizer_source(path)
    if source is None:
        raise ValueError(f"no tokenizer of {path!r} here (no local directory, not in the Hugging Face cache)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    trust = bool(_get(cfg, f"{model}.trust_remote_code"))
    tokenizer = hf_tokenizer(source, trust_remote_code=trust)
    processor = hf_processor(source, trust_remote_code=trust)
    if processor is not None and not getattr(processor, "chat_template", None) and tokenizer.chat_template:
        processor.chat_template = tokenizer.chat_template
    custom = _get(cfg, f"{model}.custom_chat_template")
    if custom:
        for each in (tokenizer, processor):
            if each is not None:
                each.chat_template = custom
    model_dir = _tokenizer_source(str(_get(cfg, f"{model}.path"))) or source
    try:
        with open(os.path.join(model_dir, "config.json")) as fh:
            model_type = json.load(fh).get("model_type")
    except (OSError, ValueError):
        model_type = None
    return tokenizer, processor, source, model_type if isinstance(model_type, str) else None


def _scratch_file(folder: str, split: str, rows: list[dict[str, Any]]) -> str:
    """The picked rows (each with ``__hpo_pick``, its index) as a parquet file; JSON lines when pyarrow cannot put
    them in one table (columns of mixed types), which verl's loader reads as it reads the user's JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    labelled = [{**row, "__hpo_pick": i} for i, row in enumerate(rows)]
    try:
        path = os.path.join(folder, f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(labelled), path)
    except (pa.ArrowException, TypeError, ValueError):
        path = os.path.join(folder, f"{split}.jsonl")
        with open(path, "w") as fh:
            fh.writelines(json.dumps(r, default=str) + "\n" for r in labelled)
    return path


def verl_data_path(cfg: Any, scans: list[SplitScan], deadline: float) -> dict[str, Any]:
    """Each split's picked rows through verl's own dataset and agent-loop prompt builder (see the module
    docstring), until ``deadline`` (``time.monotonic()``). ``{split: {"checked": N, "bad": [(file, row, error,
    prompt)], "bad_count": K}}``; ``{"error": ONE LINE}`` when verl's data path cannot be set up here."""
    from omegaconf import OmegaConf, open_dict

    def plain(value: Any) -> dict[str, Any]:
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else dict(value or {})

    data = OmegaConf.create(OmegaConf.to_container(cfg.data, resolve=True))
    with open_dict(data):
        data.filter_overlong_prompts = False  # every row kept, so each is named (the filter is said in the line)
    try:
        tokenizer, processor, source, model_type = verl_tokenizer(cfg)
        import datasets
        from verl.utils.dataset.rl_dataset import get_dataset_class
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

        builder = create_continuous_token_builder(tokenizer, hf_model_type=model_type,
                                                  chat_template_kwargs=plain(data.get("apply_chat_template_kwargs")),
                                                  mm_processor_kwargs=plain(data.get("mm_processor_kwargs")),
                                                  processor=processor)
    except Exception as err:  # noqa: BLE001 - no tokenizer here, or verl's modules do not load
        return {"error": f"{type(err).__name__}: {_one_line(str(err))[:300]}"}
    out: dict[str, Any] = {"tokenizer": source, "chat_template": bool(getattr(tokenizer, "chat_template", None))}
    folder = tempfile.mkdtemp(prefix="verl-hpo-rows-")
    cache, datasets.config.HF_DATASETS_CACHE = datasets.config.HF_DATASETS_CACHE, folder
    datasets.disable_progress_bars()
    try:
        for scan in scans:
            picks = scan.ordered_picks()
            result = out[scan.split] = {"checked": 0, "bad": [], "bad_count": 0, "picked": len(picks)}
            if not picks or time.monotonic() >= deadline:
                continue
            dataset_cls = get_dataset_class(data)
            ds = dataset_cls(data_files=[_scratch_file(folder, scan.split, [r for _, r in picks])],
                             tokenizer=tokenizer, processor=processor, config=data, max_samples=-1)
            for j in range(len(ds)):
                if time.monotonic() >= deadline:
                    break
                error, pick = _one_row(ds, dataset_cls, data, builder, j)
                result["checked"] += 1
                if error is not None:
                    result["bad_count"] += 1
                    if len(result["bad"]) < 3:
                        (f, row), prompt = picks[pick]
                        result["bad"].append((scan.files[f], row, error, str(prompt.get(scan.prompt_key))[:120]))
    except Exception as err:  # noqa: BLE001 - verl's loader refused the scratch file: said, not blamed on the data
        out["error"] = f"{type(err).__name__}: {_one_line(str(err))[:300]}"
    finally:
        datasets.config.HF_DATASETS_CACHE = cache
        shutil.rmtree(folder, ignore_errors=True)
    return out


def _one_row(ds: Any, dataset_cls: Any, data: Any, builder: Any, j: int) -> tuple[str | None, int]:
    """(verl's exception on row ``j`` as one line or None, the row's index among the picks)."""
    pick = j
    try:
        row = ds[j]  # RLHFDataset.__getitem__: raw_prompt, multimodal placeholders
        pick = int(row.get("__hpo_pick", j))
        messages = list(row["raw_prompt"])  # SingleTurnAgentLoop.run
        images = videos = audios = None
        if hasattr(dataset_cls, "_process_multi_modal_info"):
            images, videos, audios = dataset_cls._process_multi_modal_info(
                messages, getattr(ds, "image_patch_size", 14), data)
        builder.build_initial_tokens(messages, images=images, videos=videos, audios=audios)
    except Exception as err:  # noqa: BLE001 - what verl raises on this row is what is looked for
        return f"{type(err).__name__}: {_one_line(str(err))[:300]}", pick
    return None, pick


# ----------------------------------------------------------------------------- the check and its lines
def check_rows(cfg: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Steps 1-3 of the module docstring for one composed config; ``options``: ``{"rows_s", "reward_call_s",
    "reward_s", "reward": bool}`` (the time limits; ``reward``: call the reward too)."""
    started = time.monotonic()
    prompt_key = str(_get(cfg, "data.prompt_key") or "prompt")
    out: dict[str, Any] = {"problems": [], "notes": [], "splits": {}}
    scans = []
    for i, (split, _) in enumerate(SPLITS):
        files = [f for f in _files(_get(cfg, f"data.{split}_files")) if os.path.isfile(os.path.expanduser(f))]
        if not files:
            continue  # not there yet (a prepare step's), or missing: the driver's file check names it
        scan = SplitScan(split, files, prompt_key, seed=i)
        try:
            scan.scan()
        except Exception as err:  # noqa: BLE001 - a file that is not what its name says, a column of mixed types
            out["problems"].append(f"data.{split}_files: reading every row as verl does: {type(err).__name__}: "
                                   f"{_one_line(str(err))[:300]}")
            continue
        scans.append(scan)
    path = verl_data_path(cfg, scans, time.monotonic() + float(options.get("rows_s") or ROWS_BUDGET_S))
    _path_lines(cfg, scans, path, out)
    if options.get("reward", True):  # whatever the rows said: both are reported
        targets = [t for scan in scans for t in _targets(scan, dict(SPLITS)[scan.split])]
        out["reward"] = call_reward(cfg, targets, float(options.get("reward_call_s") or CALL_S),
                                    float(options.get("reward_s") or BUDGET_S))
        out["reward"]["other_truth_rows"] = sum(scan.untracked_truth_rows for scan in scans)
    out["seconds"] = round(time.monotonic() - started, 3)
    return out


def _path_lines(cfg: Any, scans: list[SplitScan], path: dict[str, Any], out: dict[str, Any]) -> None:
    """The problems and notes of verl's data path on each split."""
    if "error" in path and not any(s.split in path for s in scans):
        out["notes"].append(f"verl's own data path could not be run here ({path['error']}); every row's columns "
                            "were read")
        return
    filtered = bool(_get(cfg, "data.filter_overlong_prompts"))
    why = ("verl drops such rows when it loads the data (data.filter_overlong_prompts)" if filtered else
           "verl's agent loop raises on it in every batch it is in and leaves the prompt out ('Error in _run_prompt' "
           "in the trial's log): a study would train and validate on fewer prompts without a word")
    results = [(s, dict(SPLITS)[s.split], path.get(s.split) or {}) for s in scans]
    every = [r for _, _, r in results if r.get("checked")]
    if every and not path.get("chat_template") and all(r["bad_count"] == r["checked"] for r in every):
        file, row, error, _ = next(r["bad"][0] for r in every)
        out["problems"].append(f"actor_rollout_ref.model.path: the tokenizer in {path.get('tokenizer')} has no chat "
                               f"template (and actor_rollout_ref.model.custom_chat_template is not set): verl's own "
                               f"data path raises {error} on every row checked (first: {file} row {row}); add one to "
                               "its tokenizer_config.json or set actor_rollout_ref.model.custom_chat_template")
        return
    for scan, name, result in results:
        for file, row, error, prompt in result.get("bad", [])[:1]:
            rows = ", ".join(str(b[1]) for b in result["bad"])
            out["problems"].append(
                f"data.{scan.split}_files: {file} row {row}: verl's own data path raises {error} ({scan.prompt_key}="
                f"{prompt}); {result['bad_count']} of the {result['checked']} {name} rows checked fail (rows "
                f"{rows}{', ...' if result['bad_count'] > len(result['bad']) else ''}): {why}")
        out["notes"].append(_coverage(scan, name, result))
        out["splits"][scan.split] = {"rows": scan.rows, "shapes": len(scan.shapes), "checked": result.get("checked"),
                                     "sources": sorted(scan.sources)}
    if "error" in path:
        out["notes"].append(f"verl's own data path stopped early: {path['error']}")


def _coverage(scan: SplitScan, name: str, result: dict[str, Any]) -> str:
    checked, picked = int(result.get("checked") or 0), int(result.get("picked") or 0)
    if scan.whole and checked == scan.rows:
        how = f"every one of its {scan.rows} rows"
    else:
        how = (f"{checked} of its {scan.rows} rows (the first rows of each of its {len(scan.shapes)} message shapes, "
               f"its first rows, then a seeded random sample"
               + (f"; stopped by the check's time limit after {checked} of the {picked} planned" if checked < picked
                  else "") + ")")
    more = f" and {scan.more_shapes} rows of further shapes" if scan.more_shapes else ""
    return (f"{name} data: verl's own data path (its dataset class, the agent loop's chat template) on {how}; every "
            f"row's messages read ({len(scan.shapes)} message shape(s){more})")


def _targets(scan: SplitScan, name: str) -> list[dict[str, Any]]:
    """The reward check's targets of one split: each distinct ground truth's first row, then (when there were
    more distinct values than recorded) the random sample's rows."""
    out = []
    for entry in scan.truths.values():
        (f1, r1), (f2, r2), count = entry["first"], entry["last"], entry["count"]
        base = os.path.basename(scan.files[f1])
        span = (f"rows {r1} to {r2} of {base}" if f1 == f2 else
                f"row {r1} of {base} to row {r2} of {os.path.basename(scan.files[f2])}")
        label = f"{name} row {r1} of {base}" if count == 1 else f"the {count} {name} rows holding it ({span})"
        out.append({"label": label, "truth": entry["truth"], "data_source": entry["data_source"],
                    "extra_info": entry["extra_info"]})
    if scan.untracked_truth_rows:  # more distinct values than recorded: a part of the random sample's rows
        for f, r in sorted(scan.sampled)[:REWARD_SAMPLE]:
            row = scan.picks[(f, r)]
            truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"),
                                                                                     dict) else None
            if row and truth is not None:
                out.append({"label": f"{name} row {r} of {os.path.basename(scan.files[f])} (random sample)",
                            "truth": truth, "data_source": row.get("data_source"),
                            "extra_info": row.get("extra_info")})
    return out
