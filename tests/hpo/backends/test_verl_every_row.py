"""Every row, verl's own way, before launch (issue 52): a verl user's own experiment in a directory of its own (a
Llama-architecture model of theirs: its config.json and a BPE tokenizer trained here with a SmolLM2-style chat template
that concatenates each message's content; their data in parquet and in JSON lines; their reward), checked by
``validate`` and ``rehearse`` with real verl 0.9.1's interpreter.

One experiment holds several planted faults and one ``validate`` must report each: a validation row 40 whose user
message has ``content: null`` (verl's agent loop raises on it and drops the prompt), training rows 120-130 whose
ground truth is ``"NA"`` for a reward doing ``int(ground_truth)``; its objective's ``data_source`` appears only after
validation row 7 and is no fault. A second one has a tokenizer without a chat template and a reward that is slow
(a note with its cost per step) and hangs on one ground truth (named as the reward). Where verl's interpreter is not
needed (JSON lines read as verl reads them, a reward path that does not exist) the checks run here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.hpo.backends.test_verl import VERL_PY, needs_verl
from tests.hpo.conftest import cli_env

ROOT = Path(__file__).resolve().parents[3]
MODEL_SCRIPT = r'''
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out = Path(sys.argv[1])
raw = Tokenizer(models.BPE(unk_token="<unk>"))
raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
raw.decoder = decoders.ByteLevel()
text = [f"what is {i} plus {j}? the answer is {i + j}" for i in range(60) for j in range(20)]
raw.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|im_start|>",
                        "<|im_end|>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
for name, chat in (("model", template), ("model_no_template", None)):
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<pad>",
                                  **({"chat_template": chat} if chat else {}))
    tok.save_pretrained(out / name)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 32, "max_position_embeddings": 512, "vocab_size": len(tok), "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
              "torch_dtype": "float32"}
    (out / name / "config.json").write_text(json.dumps(config))
'''
INT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
    return float(str(int(ground_truth)) in solution_str)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's own model directories (config.json + a tokenizer trained here; no weights: nothing before launch
    loads them), with and without a chat template."""
    if not VERL_PY.exists():
        pytest.skip("real verl is not installed: run `make install-verl` (creates .venv-verl)")
    out = tmp_path_factory.mktemp("user_models")
    subprocess.run([str(VERL_PY), "-c", MODEL_SCRIPT, str(out)], check=True, capture_output=True, timeout=300)
    return out


def _row(i: int, source: str = "mine/a", truth: str | None = None, content: Any = "") -> dict[str, Any]:
    return {"data_source": source, "ability": "math", "extra_info": {"index": i},
            "prompt": [{"role": "user", "content": f"what is {i} plus 1?" if content == "" else content}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1) if truth is None else truth}}


def experiment(folder: Path, model: Path, reward: str = INT_REWARD, train: list[dict[str, Any]] | None = None,
               val: list[dict[str, Any]] | None = None, changes: dict[str, Any] | None = None,
               train_name: str = "train.parquet", val_name: str = "val.jsonl") -> Path:
    """The user's experiment in ``folder``: ``train.parquet`` (400 rows), ``val.jsonl`` (64 rows, data source
    ``mine/b`` from row 8 on, which the objective names; other names: ``.parquet`` is parquet, else JSON lines),
    ``reward.py``, and ``experiment.yaml`` naming them relative to itself (the shipped CPU experiment's settings
    otherwise)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in ((train_name, train or [_row(i) for i in range(400)]),
                       (val_name, val or [_row(i, "mine/b" if i >= 8 else "mine/a") for i in range(64)])):
        if name.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(rows), folder / name, row_group_size=64)
        else:
            (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "reward.py").write_text(textwrap.dedent(reward))
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_cpu.yaml").read_text())
    raw["overrides"].update({"data.train_files": train_name, "data.val_files": val_name,
                             "actor_rollout_ref.model.path": str(model), "data.max_prompt_length": 64,
                             "reward.custom_reward_function.path": "reward.py"})
    raw["objective"]["metric"] = "val-core/mine/b/acc/mean@1"
    raw["trial"]["prepare_command"] = None
    raw["study"].pop("confirm")
    for dotted, value in (changes or {}).items():
        *parents, last = dotted.split("/")
        node = raw
        for p in parents:
            node = node[p]
        node[last] = value
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def validate(space: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", space.name], cwd=space.parent,
                          env=cli_env(**env), capture_output=True, text=True, timeout=900)


def errors(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in res.stderr, res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("error: ")]


# ----------------------------------------------------------------------------- with verl's interpreter
@needs_verl
def test_validate_names_a_bad_row_and_the_ground_truth_the_reward_raises_on(models: Path, tmp_path: Path) -> None:
    """Both faults in one run, each one line naming the user's file, row and verl's (or the reward's) own exception;
    the JSON-lines training file is read as verl reads it (no 'Parquet magic bytes' from the memory estimate), and
    the objective's source, which first appears at validation row 8, is known from every row."""
    train = [_row(i, truth="NA" if 120 <= i <= 130 else None) for i in range(400)]
    val = [_row(i, "mine/b" if i >= 8 else "mine/a", content=None if i == 40 else "") for i in range(64)]
    res = validate(experiment(tmp_path / "mine", models / "model", train=train, val=val, train_name="train.jsonl",
                              val_name="val.parquet"))
    assert res.returncode == 2, (res.stdout, res.stderr)
    data, reward = errors(res)
    assert data.startswith("error: experiment.yaml: overrides.data.val_files: ") and "val.parquet row 40: verl's " \
        "own data path raises TypeError" in data and "'content': None" in data and "1 of the 64 validation rows" in \
        data and "Error in _run_prompt" in data, data
    assert reward.startswith("error: experiment.yaml: overrides.reward.custom_reward_function.path: reward function ") \
        and "the 11 training rows holding it (rows 120 to 130 of train.jsonl)" in reward and \
        "ground truth 'NA'" in reward and "ValueError: invalid literal for int()" in reward, reward
    assert "validation data: verl's own data path" in res.stdout and "every one of its 64 rows" in res.stdout, \
        res.stdout
    assert "magic bytes" not in res.stdout + res.stderr and "mine/b" not in res.stderr


@needs_verl
def test_no_chat_template_and_a_reward_that_hangs_on_one_ground_truth(models: Path, tmp_path: Path) -> None:
    """No chat template: a problem naming the user's own file and row 0 (not "All checks passed" with the error in
    the memory table's header). A reward taking 0.1 s a call is a note with its cost per training step; the call
    that hangs (ground truth '7') is named as the reward's, after the limit of one call, not 10 minutes later as
    "composing 4 verl configs"."""
    slow = """
        import time
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
            if ground_truth == "7" and solution_str:
                while True:
                    time.sleep(1)
            time.sleep(0.1)
            return float(ground_truth in solution_str)
    """
    started = time.monotonic()
    res = validate(experiment(tmp_path / "mine", models / "model_no_template", reward=slow),
                   VERL_HPO_REWARD_CALL_TIMEOUT_S="3")
    assert res.returncode == 2, (res.stdout, res.stderr)
    template, hung = errors(res)
    assert "overrides.actor_rollout_ref.model.path: the tokenizer in" in template and "has no chat template" in \
        template and f"{tmp_path / 'mine' / 'val.jsonl'} row 0" in template, template
    assert "overrides.reward.custom_reward_function.path: reward function" in hung and "did not return within 3 s" \
        in hung and "ground truth '7'" in hung and "the limit of one call" in hung, hung
    note = next(ln for ln in res.stdout.splitlines() if ln.startswith("note: reward: "))
    assert "s a call" in note and "128 calls a training step (data.train_batch_size=16 x " \
        "actor_rollout_ref.rollout.n=8)" in note, note
    assert "All checks passed" not in res.stdout and time.monotonic() - started < 300


@needs_verl
def test_gae_s_lambda_tuned_under_grpo_is_refused(models: Path, tmp_path: Path) -> None:
    """verl 0.9.1's compute_advantage gives algorithm.lam to GAE only: under GRPO every trial would spend a dimension
    of the search on a value nothing reads."""
    space = experiment(tmp_path / "mine", models / "model",
                       changes={"params/lam": {"key": "algorithm.lam", "type": "float", "low": 0.9, "high": 1.0}})
    res = validate(space)
    assert res.returncode == 2, (res.stdout, res.stderr)
    line, = errors(res)
    assert "params.lam" in line and "algorithm.lam: algorithm.adv_estimator=grpo does not read it" in line, line


@needs_verl
def test_the_rehearsal_keeps_a_validation_row_of_every_data_source(models: Path, tmp_path: Path) -> None:
    """The objective's data source first appears at validation row 8: the shrunk validation set keeps the first rows
    and a row of each source they lack, so verl logs the objective (not "was never logged" and another task's
    metric)."""
    from hpo.backends.verl._rehearse_steps import SHRINK_SCRIPT

    space = experiment(tmp_path / "mine", models / "model", val_name="val.parquet")
    config = json.loads((models / "model" / "config.json").read_text())
    request = {"config_dir": None, "config_name": "ppo_trainer", "out": str(tmp_path / "out"), "train_rows": 8,
               "val_rows": 4, "tokenizer": None, "models": {"actor_rollout_ref.model.path": config},
               "overrides": [f"actor_rollout_ref.model.path={models / 'model'}",
                             f"data.train_files={space.parent / 'train.parquet'}",
                             f"data.val_files={space.parent / 'val.parquet'}",
                             f"reward.custom_reward_function.path={space.parent / 'reward.py'}"], "set_keys": []}
    res = subprocess.run([str(VERL_PY), str(SHRINK_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=600)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok" and not reply["problems"], reply
    kept = pq.read_table(tmp_path / "out" / "data" / "val.parquet").to_pylist()
    assert [r["data_source"] for r in kept] == ["mine/a"] * 4 + ["mine/b"], kept
    assert kept[-1]["extra_info"]["index"] == 8


@needs_verl
@pytest.mark.slow
def test_rehearse_names_the_user_s_file_and_row(models: Path, tmp_path: Path) -> None:
    """The rehearsal reads every row of the user's own files with verl's data path before it shrinks anything: no
    chat template is named at the user's val.jsonl row 0, not at its shrunk copy, and nothing is run."""
    space = experiment(tmp_path / "mine", models / "model_no_template")
    res = subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", space.name, "--quick",
                          "--studies-dir", str(tmp_path / "studies")], cwd=space.parent, env=cli_env(),
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 1, (res.stdout, res.stderr)
    problems = [ln for ln in res.stdout.splitlines() if ln.lstrip().startswith("PROBLEM")]
    assert len(problems) == 1 and "has no chat template" in problems[0] and \
        f"{space.parent / 'val.jsonl'} row 0" in problems[0] and "shrunk" not in problems[0], res.stdout
    assert not (tmp_path / "studies" / "rehearsals" / "experiment" / "shrunk").exists()


# ----------------------------------------------------------------------------- here
def test_jsonl_json_and_parquet_rows_are_read_as_verl_reads_them(tmp_path: Path) -> None:
    """The three formats verl 0.9.1's RLHFDataset loads give the same rows, in batches; any other name is refused
    with verl's reason, and the row checks name a JSON line's row."""
    from hpo.backends.verl._compose_data import iter_batches
    from hpo.backends.verl._data import bad_rows

    rows = [_row(i) for i in range(300)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", row_group_size=64)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps(rows))
    for name in ("d.parquet", "d.jsonl", "d.json"):
        read = [r for b in iter_batches(str(tmp_path / name), ["prompt", "reward_model"], 100) for r in b.to_pylist()]
        assert read == [{"prompt": r["prompt"], "reward_model": r["reward_model"]} for r in rows], name
        assert bad_rows("data.train_files", str(tmp_path / name)) is None
    rows[150]["reward_model"]["ground_truth"] = None
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "bad.jsonl row 150: reward_model.ground_truth is null" in (bad_rows("data.val_files",
                                                                               str(tmp_path / "bad.jsonl")) or "")
    (tmp_path / "d.csv").write_text("prompt\n")
    assert "reads .parquet, .json and .jsonl files only" in (bad_rows("data.train_files", str(tmp_path / "d.csv"))
                                                            or "")


def test_a_reward_path_that_does_not_exist_is_refused_before_verl_starts(tmp_path: Path) -> None:
    """A typo in the reward's file name (relative to the experiment file) is one line naming the path and the .py
    files beside it, as a data path is: before verl's interpreter is started."""
    folder = tmp_path / "mine"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([_row(i, "synthetic/arith") for i in range(16)]), folder / "train.parquet")
    (folder / "reward.py").write_text(INT_REWARD)
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_cpu.yaml").read_text())
    raw["overrides"].update({"data.train_files": "train.parquet", "data.val_files": "train.parquet",
                             "reward.custom_reward_function.path": "rewrd.py", "data.max_prompt_length": 64})
    raw["trial"]["prepare_command"] = None
    (folder / "experiment.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    started = time.monotonic()
    res = validate(folder / "experiment.yaml")
    assert res.returncode == 2, (res.stdout, res.stderr)
    line, = errors(res)
    assert "overrides.reward.custom_reward_function.path" in line and f"{folder / 'rewrd.py'} does not exist" in \
        line and f"{folder} holds reward.py" in line, line
    assert time.monotonic() - started < 60


def test_every_row_is_read_by_columns_across_files_and_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The columnar pass of the check (the part that reads every row): each message shape with its first rows, each
    distinct ground truth with the rows holding it, across a parquet and a JSON-lines file of one split; the rows
    verl's own data path then takes, most telling first, and a seeded sample that does not depend on the batches."""
    from hpo.backends.verl import _compose_rows
    from hpo.backends.verl._compose_rows import SplitScan

    monkeypatch.setattr(_compose_rows, "ALL_ROWS", 500)  # the split is "large": a sample, not every row
    monkeypatch.setattr(_compose_rows, "SAMPLE_ROWS", 50)
    first = [_row(i, truth="NA" if 120 <= i <= 130 else None) for i in range(1000)]
    second = [_row(1000 + i, content=None if i == 40 else "") for i in range(600)]
    pq.write_table(pa.Table.from_pylist(first), tmp_path / "a.parquet", row_group_size=128)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in second))
    from hpo.backends.verl._compose_data import iter_batches

    scans = []
    for batch_rows in (64, 65_536):  # what is found does not depend on how the rows are batched
        monkeypatch.setattr(_compose_rows, "iter_batches", lambda path, n=batch_rows: iter_batches(path, batch_rows=n))
        scan = SplitScan("train", [str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")], "prompt", seed=1)
        scan.scan()
        scans.append(scan)
    scan = scans[0]
    assert scan.rows == 1600 and scan.shapes["user"][0] == 1599 and scan.shapes["user|-content"] == [1, [(1, 40)]]
    na = next(t for t in scan.truths.values() if t["truth"] == "NA")
    assert na["count"] == 11 and na["first"] == (0, 120) and na["last"] == (0, 130)
    picks = [k for k, _ in scan.ordered_picks()]
    assert picks[:3] == [(0, 0), (0, 1), (1, 40)] and len(scan.sampled) == 50  # each shape's first rows first
    assert sorted(scans[1].sampled) == sorted(scan.sampled) and scans[1].picks.keys() == scan.picks.keys()


def test_gamma_and_lambda_are_dead_only_where_the_estimator_reads_neither() -> None:
    from hpo.backends.verl._check import unread_tuned
    from hpo.backends.verl._rows import hung_reward

    keys = [("params.lam", "algorithm.lam"), ("params.gamma", "algorithm.gamma")]
    def dead(info: dict[str, Any]) -> list[str]:
        return [where for where, _ in unread_tuned(keys, info)]

    assert dead({"adv_estimator": "grpo", "adv_reads": ()}) == ["params.lam", "params.gamma"]
    assert dead({"adv_estimator": "reinforce_plus_plus", "adv_reads": ("gamma",)}) == ["params.lam"]
    assert unread_tuned(keys, {"adv_estimator": "gae", "adv_reads": ("gamma", "lam")}) == []
    assert unread_tuned(keys, {"adv_estimator": "mine", "adv_reads": None}) == []  # not known: not decided
    # a check that ran out of its time while the reward was being called blames the reward, not composing
    marker = "verl-hpo: calling the reward function"
    assert hung_reward(f"dataset len: 64\n{marker}\n".encode()) and not hung_reward(f"{marker}\n{marker} done\n")
