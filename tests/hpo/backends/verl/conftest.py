"""Shared by the tests of the verl backend (``hpo/backends/verl/``): real verl 0.9.1's interpreter (``.venv-verl``,
``make install-verl``; tests that need it are skipped without it), the shipped verl experiments, the stand-in for
``python -m verl.trainer.main_ppo`` (``tests/hpo/fake_verl_main_ppo.py``: it behaves like verl toward the driver:
argv, env, ``"wb"`` file logger, checkpoints, ``resume_mode=auto``; installed as ``verl.trainer.main_ppo`` in verl's
interpreter so that the exact argv of :func:`verl_argv` runs), and a verl user's own experiments in a directory of
their own (their data, reward and model)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
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

from hpo.backends import backend_of, load_space
from hpo.backends import verl as _verl
from hpo.backends.verl import ComposedConfig, resume_checkpoints, verl_argv, verl_env, verl_metrics_path
from hpo.execution import MetricsTail
from hpo.experiment._space import Space, TrialSpec, parse_space, read_yaml
from tests.hpo.conftest import ROOT, cli_env

VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
needs_verl = pytest.mark.skipif(not VERL_PY.exists(),
                                reason="real verl is not installed: run `make install-verl` (creates .venv-verl)")
STAND_IN = ROOT / "tests" / "hpo" / "fake_verl_main_ppo.py"
SPACE_FILE = ROOT / "search_spaces" / "verl_grpo_gsm8k.yaml"
CPU_SPACE = ROOT / "search_spaces" / "verl_grpo_cpu.yaml"
VAL = "val-core/openai/gsm8k/acc/mean@1"  # verl 0.9.1: `acc` is the core variable
ARITH = Path.home() / ".cache" / "verl_hpo" / "verl_arith"


def load_verl_space(path: Path = SPACE_FILE, **changes: Any) -> Space:
    """The shipped verl space as a Space; the fields the driver adds for verl (trial.backend, trial.python) are
    dropped while TrialSpec does not know them yet. ``changes``: raw sections replaced."""
    raw = read_yaml(path)
    raw.update(changes)
    known = {f.name for f in dataclasses.fields(TrialSpec)}
    raw["trial"] = {k: v for k, v in (raw.get("trial") or {}).items() if k in known}
    return parse_space(raw, str(path), path.stem)


def small_verl_space(**changes: Any) -> Space:
    """The shipped GPU space with one parameter at two values (two corners: quick to compose)."""
    raw = read_yaml(SPACE_FILE)
    changes.setdefault("overrides", {**raw["overrides"], "actor_rollout_ref.actor.ppo_mini_batch_size": 16})
    return load_verl_space(params={"actor_lr": raw["params"]["actor_lr"]}, **changes)


def composed(val_n: int = 1, sources: tuple[str, ...] | None = ("openai/gsm8k",), **more: Any) -> ComposedConfig:
    """What verl's interpreter says of one composed corner, as a GRPO run on one GPU would give it (``more``:
    fields changed)."""
    return ComposedConfig(**{**dict(val_n=val_n, data_sources=sources, total_training_steps=10, test_freq=2,
                                    save_freq=2, val_before_train=True, n_gpus=1, use_critic=False,
                                    use_reference_policy=True, adv_estimator="grpo", train_files=(), val_files=()),
                             **more})


# ----------------------------------------------------------------------------- the stand-in main_ppo
# A sys.meta_path finder (in a sitecustomize on PYTHONPATH) maps `verl.trainer.main_ppo` to the stand-in, while
# the rest of `verl` stays the real 0.9.1 package: the stand-in logs, checkpoints and names metrics with it.
_SITECUSTOMIZE = """
import importlib.util, sys


class _StandInMainPpo:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "verl.trainer.main_ppo":
            return importlib.util.spec_from_file_location(name, {stand_in!r})
        return None


sys.meta_path.insert(0, _StandInMainPpo)
"""


@pytest.fixture
def fake_verl(tmp_path: Path) -> dict[str, str]:
    """The environment in which ``python -m verl.trainer.main_ppo`` runs the stand-in (in verl's interpreter)."""
    if not VERL_PY.exists():
        pytest.skip("the stand-in runs with real verl's code: run `make install-verl` (creates .venv-verl)")
    site = tmp_path / "fake-verl"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(stand_in=str(STAND_IN)))
    return {**os.environ, "PYTHONPATH": str(site)}


BASE = {"trainer.total_training_steps": 10, "trainer.test_freq": 2, "trainer.save_freq": 3, "+fake.step_s": 0.02,
        "algorithm.adv_estimator": "grpo"}


def launch(fake_env: dict[str, str], trials: Path, number: int, extra: list[str], history: tuple[int, ...] = (),
           fixed: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str], Path]:
    """What the driver does for trial ``number`` (a retry of ``history``): argv, env, its metrics file."""
    trial_dir = trials / str(number)
    trial_dir.mkdir(parents=True, exist_ok=True)
    overrides = _verl.verl_overrides({**BASE, **(fixed or {})}, {"+fake.x": 0.5})
    argv = verl_argv(str(VERL_PY), "ppo_trainer", [*overrides, *extra], "study", number, trial_dir, n_gpus=1,
                     resume_from=resume_checkpoints(trials, history))
    env = verl_env(fake_env, trial_dir, attempt=len(history))
    (trial_dir / "command.json").write_text(json.dumps({"argv": argv}))  # as the driver writes it
    return argv, env, verl_metrics_path(trial_dir, len(history))


def steps(path: Path) -> list[int]:
    return [s for s, _ in MetricsTail(path).read()]


def run_until(argv: list[str], env: dict[str, str], tracker: Path, step: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tracker.is_file() and tracker.read_text() == step) and time.monotonic() < deadline:
        assert proc.poll() is None, "the stand-in exited before the checkpoint"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the host dies: no clean exit, no last checkpoint
    assert proc.wait(timeout=30) == -signal.SIGKILL
    return proc


# ----------------------------------------------------------------------------- the shipped CPU arith experiment
def arith_space(tmp_path: Path, **changes: Any) -> Path:
    """The shipped CPU arith experiment with ``changes`` (dotted paths into the YAML; None deletes), its prepare step
    run as the driver runs it (model, data and reward into ``~/.cache/verl_hpo/verl_arith``, what is missing)."""
    shipped = load_space(str(CPU_SPACE), check=False)
    prepare = backend_of(shipped).prepare_argv(shipped)
    assert prepare is not None
    subprocess.run(prepare, cwd=ROOT, check=True, capture_output=True)
    raw = yaml.safe_load(CPU_SPACE.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("/")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- a user's arith experiment of their own
def arith_rows(n: int, long_row: int | None = 150, empty_truth: int | None = None) -> list[dict[str, Any]]:
    """``n`` rows of the user's data (source ``mine``): row ``long_row`` a prompt over a hundred tokens, row
    ``empty_truth`` an empty ground truth."""
    rows = []
    for i in range(n):
        question = f"{i}+1=" if i != long_row else "add these numbers: " + " + ".join(str(j) for j in range(60))
        truth = "" if i == empty_truth else str(i + 1)
        rows.append({"data_source": "mine", "prompt": [{"role": "user", "content": question}],
                     "reward_model": {"style": "rule", "ground_truth": truth}})
    return rows


def arith_experiment(tmp_path: Path, rows: list[dict[str, Any]], **overrides: Any) -> Path:
    """The user's own experiment: their parquet files and experiment file in ``tmp_path/mine`` (the arith model and
    tokenizer, prepared once as the shipped CPU experiment's prepare step writes them)."""
    arith_space(tmp_path)  # the model and tokenizer in ~/.cache/verl_hpo/verl_arith
    mine = tmp_path / "mine"
    mine.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), mine / "train.parquet", row_group_size=64)
    pq.write_table(pa.Table.from_pylist(arith_rows(16, None)), mine / "val.parquet")
    raw = yaml.safe_load(CPU_SPACE.read_text().replace("synthetic/arith", "mine"))  # the user's source in the metrics
    raw["overrides"].update({"data.train_files": str(mine / "train.parquet"),
                             "data.val_files": str(mine / "val.parquet"), **overrides})
    raw["trial"]["prepare_command"] = None
    path = mine / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def validate(space: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``verl-hpo validate --space <its name>`` from the experiment's own directory."""
    return subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", space.name, *extra], cwd=space.parent,
                          env=cli_env(**env), capture_output=True, text=True, timeout=900)


# ----------------------------------------------------------------------------- a user's own model, data and reward
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
def user_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's own model directories (config.json + a tokenizer trained here; no weights: nothing before launch
    loads them), with and without a chat template."""
    if not VERL_PY.exists():
        pytest.skip("real verl is not installed: run `make install-verl` (creates .venv-verl)")
    out = tmp_path_factory.mktemp("user_models")
    subprocess.run([str(VERL_PY), "-c", MODEL_SCRIPT, str(out)], check=True, capture_output=True, timeout=300)
    return out


def user_row(i: int, source: str = "mine/a", truth: str | None = None, content: Any = "") -> dict[str, Any]:
    return {"data_source": source, "ability": "math", "extra_info": {"index": i},
            "prompt": [{"role": "user", "content": f"what is {i} plus 1?" if content == "" else content}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1) if truth is None else truth}}


def user_experiment(folder: Path, model: Path, reward: str = INT_REWARD, train: list[dict[str, Any]] | None = None,
                    val: list[dict[str, Any]] | None = None, changes: dict[str, Any] | None = None,
                    train_name: str = "train.parquet", val_name: str = "val.jsonl") -> Path:
    """The user's experiment in ``folder``: ``train.parquet`` (400 rows), ``val.jsonl`` (64 rows, data source
    ``mine/b`` from row 8 on, which the objective names; other names: ``.parquet`` is parquet, else JSON lines),
    ``reward.py``, and ``experiment.yaml`` naming them relative to itself (the shipped CPU experiment's settings
    otherwise)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in ((train_name, train or [user_row(i) for i in range(400)]),
                       (val_name, val or [user_row(i, "mine/b" if i >= 8 else "mine/a") for i in range(64)])):
        if name.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(rows), folder / name, row_group_size=64)
        else:
            (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "reward.py").write_text(textwrap.dedent(reward))
    raw = yaml.safe_load(CPU_SPACE.read_text())
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


def errors(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in res.stderr, res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("error: ")]
