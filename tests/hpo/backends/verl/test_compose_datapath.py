"""Every row, verl's own way, before launch (issue 52; ``hpo/backends/verl/_compose_datapath.py``, run in verl's
interpreter): a verl user's own experiment in a directory of its own (a Llama-architecture model of theirs: its
config.json and a BPE tokenizer trained here with a SmolLM2-style chat template that concatenates each message's
content; their data in parquet and in JSON lines; their reward; ``conftest.py``), checked by ``validate`` and
``rehearse`` with real verl 0.9.1's interpreter.

One experiment holds several planted faults and one ``validate`` must report each: a validation row 40 whose user
message has ``content: null`` (verl's agent loop raises on it and drops the prompt), training rows 120-130 whose
ground truth is ``"NA"`` for a reward doing ``int(ground_truth)``; its objective's ``data_source`` appears only after
validation row 7 and is no fault. A second one has a tokenizer without a chat template and a reward that is slow
(a note with its cost per step) and hangs on one ground truth (named as the reward). Where verl's interpreter is not
needed, the checks run without it: JSON lines read as verl reads them (``test_compose_data.py``), each message shape
and ground truth found by columns (``test_compose_rows.py``), a reward path that does not exist (``test_data.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hpo.backends.verl.conftest import errors, needs_verl, user_experiment, user_row, validate
from tests.hpo.conftest import cli_env


# ----------------------------------------------------------------------------- with verl's interpreter
@needs_verl
def test_validate_names_a_bad_row_and_the_ground_truth_the_reward_raises_on(user_models: Path,
                                                                             tmp_path: Path) -> None:
    """Both faults in one run, each one line naming the user's file, row and verl's (or the reward's) own exception;
    the JSON-lines training file is read as verl reads it (no 'Parquet magic bytes' from the memory estimate), and
    the objective's source, which first appears at validation row 8, is known from every row."""
    train = [user_row(i, truth="NA" if 120 <= i <= 130 else None) for i in range(400)]
    val = [user_row(i, "mine/b" if i >= 8 else "mine/a", content=None if i == 40 else "") for i in range(64)]
    res = validate(user_experiment(tmp_path / "mine", user_models / "model", train=train, val=val,
                                   train_name="train.jsonl", val_name="val.parquet"))
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
def test_no_chat_template_and_a_reward_that_hangs_on_one_ground_truth(user_models: Path, tmp_path: Path) -> None:
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
    res = validate(user_experiment(tmp_path / "mine", user_models / "model_no_template", reward=slow),
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
    assert "All checks passed" not in res.stdout


@needs_verl
@pytest.mark.slow
def test_rehearse_names_the_user_s_file_and_row(user_models: Path, tmp_path: Path) -> None:
    """The rehearsal reads every row of the user's own files with verl's data path before it shrinks anything: no
    chat template is named at the user's val.jsonl row 0, not at its shrunk copy, and nothing is run."""
    space = user_experiment(tmp_path / "mine", user_models / "model_no_template")
    res = subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", space.name, "--quick",
                          "--studies-dir", str(tmp_path / "studies")], cwd=space.parent, env=cli_env(),
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 1, (res.stdout, res.stderr)
    problems = [ln for ln in res.stdout.splitlines() if ln.lstrip().startswith("PROBLEM")]
    assert len(problems) == 1 and "has no chat template" in problems[0] and \
        f"{space.parent / 'val.jsonl'} row 0" in problems[0] and "shrunk" not in problems[0], res.stdout
    assert not (tmp_path / "studies" / "rehearsals" / "experiment" / "shrunk").exists()
