"""A verl user's own experiment, in a directory of its own, checked before launch (issue 43 items 4 and 7, and the
reward on training rows): every prompt against ``data.max_prompt_length`` as verl 0.9.1 treats it (cut, whatever
``data.truncation`` says), the rehearsal keeping the longest prompts and scoring the training rows with the most
unusual ground truths, and a GPU study's interpreter refused at ``validate`` when its torch has no CUDA. Real verl
0.9.1's interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.hpo.backends.test_rehearse import ARITH, arith_space
from tests.hpo.backends.test_verl import VERL_PY, needs_verl
from tests.hpo.conftest import cli_env

LONG_ROW = 150


def _rows(n: int, long_row: int | None = LONG_ROW, empty_truth: int | None = None) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        question = f"{i}+1=" if i != long_row else "add these numbers: " + " + ".join(str(j) for j in range(60))
        truth = "" if i == empty_truth else str(i + 1)
        rows.append({"data_source": "mine", "prompt": [{"role": "user", "content": question}],
                     "reward_model": {"style": "rule", "ground_truth": truth}})
    return rows


def _experiment(tmp_path: Path, rows: list[dict[str, Any]], **overrides: Any) -> Path:
    """The user's own experiment: their parquet files and experiment file in ``tmp_path/mine`` (the arith model and
    tokenizer, prepared once as the shipped CPU experiment's prepare step writes them)."""
    arith_space(tmp_path)  # the model and tokenizer in ~/.cache/verl_hpo/verl_arith
    mine = tmp_path / "mine"
    mine.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), mine / "train.parquet", row_group_size=64)
    pq.write_table(pa.Table.from_pylist(_rows(16, None)), mine / "val.parquet")
    shipped = (Path(__file__).resolve().parents[3] / "search_spaces" / "verl_grpo_cpu.yaml").read_text()
    raw = yaml.safe_load(shipped.replace("synthetic/arith", "mine"))  # the user's data_source in the metric names
    raw["overrides"].update({"data.train_files": str(mine / "train.parquet"),
                             "data.val_files": str(mine / "val.parquet"), **overrides})
    raw["trial"]["prepare_command"] = None
    path = mine / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _validate(space: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", str(space), *extra], cwd=space.parent,
                          env=cli_env(), capture_output=True, text=True, timeout=600)


@needs_verl
def test_a_prompt_13x_longer_than_max_prompt_length_at_row_150_is_named(tmp_path: Path) -> None:
    """verl 0.9.1's agent loop cuts a text prompt over data.max_prompt_length to its last tokens, whatever
    data.truncation says (its RL path never reads that key): validate passes with a warning naming row 150, its
    length, the count and the longest (issue 52: a check of ours is never stricter than verl)."""
    space = _experiment(tmp_path, _rows(400))
    res = _validate(space)
    assert res.returncode == 0, (res.stdout, res.stderr)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("warning: 1 of 416 prompts"))
    assert "are longer than data.max_prompt_length=16 tokens (first: train.parquet row 150: " in line and \
        "keeps only their last 16 tokens" in line and "data.truncation=error is not read" in line, line
    tokens = int(line.split("row 150: ")[1].split()[0])
    assert tokens >= 13 * 16 and f"longest: train.parquet row 150, {tokens} tokens" in line, line  # 13x the limit


@needs_verl
def test_a_gpu_study_with_a_cpu_only_interpreter_is_refused_at_validate(tmp_path: Path) -> None:
    space = _experiment(tmp_path, _rows(64, None))
    res = _validate(space, "--override", "trial.gpus_per_trial=1")
    assert res.returncode == 2, (res.stdout, res.stderr)
    line, = res.stderr.strip().splitlines()
    assert "trial.python" in line and "without CUDA, so its trials need a GPU build" in line and \
        "trial.gpus_per_trial: 0" in line, line


@needs_verl
def test_the_rehearsal_keeps_the_longest_prompts_and_scores_unusual_training_truths(tmp_path: Path) -> None:
    """The shrink step (verl's interpreter, a few seconds) keeps the training rows with the longest prompts, not the
    first; the reward function is called on the training row whose ground truth is the odd one out (an empty string
    at row 300, which the user's int() cannot read), so the rehearsal names that row before any corner runs."""
    from hpo.backends.verl._rehearse_steps import SHRINK_SCRIPT

    space = _experiment(tmp_path, _rows(400, empty_truth=300))
    reward = space.parent / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                      "    return float(str(int(ground_truth)) in solution_str)\n")
    config = json.loads((ARITH / "model" / "config.json").read_text())
    request = {"config_dir": None, "config_name": "ppo_trainer", "out": str(tmp_path / "out"), "train_rows": 8,
               "val_rows": 4, "tokenizer": None, "models": {"actor_rollout_ref.model.path": config},
               "overrides": [f"actor_rollout_ref.model.path={ARITH / 'model'}",
                             f"data.train_files={space.parent / 'train.parquet'}",
                             f"data.val_files={space.parent / 'val.parquet'}",
                             f"reward.custom_reward_function.path={reward}"], "set_keys": []}
    res = subprocess.run([str(VERL_PY), str(SHRINK_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=300)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok", reply
    kept = pq.read_table(tmp_path / "out" / "data" / "train.parquet").to_pylist()
    questions = [r["prompt"][0]["content"] for r in kept]
    assert len(kept) == 8 and questions[kept.index(max(kept, key=lambda r: len(r["prompt"][0]["content"])))] \
        .startswith("add these numbers") and "0+1=" not in questions, questions  # the longest, not the first
    assert reply["data"]["train"]["picked"] == "longest" and reply["data"]["train"]["total"] == 400
    assert [p["check"] for p in reply["problems"]] == ["reward"], reply["problems"]
    line = reply["problems"][0]["message"]
    assert "raised on training row train.parquet:300" in line and "ValueError" in line, line


@needs_verl
def test_relative_paths_of_the_experiment_are_read_from_any_directory(tmp_path: Path) -> None:
    """issue 43 item 3: data and reward beside the experiment file, named relative to it: validate passes from the
    experiment's directory, its parent and an unrelated one, and the stored experiment holds absolute paths."""
    space = _experiment(tmp_path, _rows(64, None))
    raw = yaml.safe_load(space.read_text())
    raw["overrides"]["data.train_files"] = "train.parquet"
    raw["overrides"]["data.val_files"] = "./val.parquet"
    (space.parent / "reward.py").write_text((ARITH / "reward.py").read_text())
    raw["overrides"]["reward.custom_reward_function.path"] = "reward.py"
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd, name in ((space.parent, "experiment.yaml"), (tmp_path, "mine/experiment.yaml"),
                      (elsewhere, str(space))):
        res = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", name], cwd=cwd, env=cli_env(),
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0 and "All checks passed" in res.stdout, (cwd, res.stdout, res.stderr)
