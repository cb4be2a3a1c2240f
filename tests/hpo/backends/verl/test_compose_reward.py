"""The user's reward function called before launch as verl 0.9.1's reward managers call it
(``hpo/backends/verl/_compose_reward.py``, in verl's interpreter): the responses it is called with, what counts as a
score (a finite number, or a dict with a finite ``"score"``), what it prints kept up to a cap and the rest counted,
and, with real verl, a call that raises or returns no score named with the row's label, or the calls' range and cost
when every one returns. Its time limits: ``test_shrink.py``'s reward check."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from hpo.backends.verl._compose_reward import OUTPUT_CAP, _CappedSink, responses, score_of
from tests.hpo.backends.verl.conftest import VERL_PY, needs_verl
from tests.hpo.conftest import ROOT


def test_the_responses_are_empty_the_truth_and_two_answer_formats() -> None:
    assert responses(42) == ["", "42", "The answer is 42.\n#### 42", "\\boxed{42}"]


@pytest.mark.parametrize(("result", "score", "wrong"), [
    (1, 1.0, None), (0.25, 0.25, None), ({"score": 0.5, "acc": True}, 0.5, None),
    (True, None, "bool 'True'"), ("1.0", None, "str '1.0'"), (None, None, "NoneType 'None'"),
    (math.nan, None, "nan"), ({"score": math.inf}, None, "inf"),
    ({"acc": 1.0}, None, "a dict without 'score' (keys acc)"),
])
def test_a_score_is_a_finite_number_or_a_dict_holding_one(result: object, score: float | None,
                                                          wrong: str | None) -> None:
    assert score_of(result) == (score, wrong)


def test_what_the_function_prints_is_kept_up_to_the_cap_and_the_rest_counted() -> None:
    sink = _CappedSink()
    assert sink.write("x" * (OUTPUT_CAP - 10)) == OUTPUT_CAP - 10
    sink.write("é" * 20)  # 40 bytes: the cap falls inside it
    sink.write("y" * 1000)
    assert sink.size == OUTPUT_CAP - 10 + 40 + 1000 and sink.dropped == 1000
    assert "".join(sink.kept).startswith("x") and "y" not in "".join(sink.kept)


CALL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from omegaconf import OmegaConf
import _compose_reward as r
cfg = OmegaConf.create({"reward": {"custom_reward_function": {"path": sys.argv[2], "name": "compute_score"}},
                        "data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {"n": 2}}})
targets = [{"label": f"validation row {i}", "data_source": "mine", "truth": t, "extra_info": {"index": i}}
           for i, t in enumerate(["3", "4", "NA"])]
print(json.dumps(r.call_reward(cfg, targets, call_s=30, budget_s=60)))
"""


@needs_verl
@pytest.mark.parametrize(("body", "fails"), [("    return float(ground_truth in solution_str)\n", False),
                                            ("    return float(str(int(ground_truth)) in solution_str)\n", True)])
def test_real_verl_calls_each_row_and_names_the_one_it_fails_on(tmp_path: Path, body: str, fails: bool) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                      "    print('scoring', ground_truth)\n" + body)
    res = subprocess.run([str(VERL_PY), "-c", CALL, str(ROOT / "hpo" / "backends" / "verl"), str(reward)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["where"] == f"{reward}:compute_score" and out["targets"] == 3 and out["printed_bytes"] > 0
    if not fails:
        assert "problem" not in out and out["calls"] == 12 and (out["min"], out["max"]) == (0.0, 1.0)
        return
    assert out["calls"] == 9 and out["problem"].startswith(  # 8 scores on the first two rows, then the raise
        f"reward function {reward}:compute_score raised on validation row 2 (data_source='mine', ground truth 'NA', "
        "response ''): ValueError: "), out["problem"]
