"""Rule scorers follow verl's contract; scores land on the last valid token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl_core.config import ConfigError
from verl_core.rewards import (
    arith_score,
    default_compute_score,
    gsm8k_score,
    load_custom_function,
    token_level_scores,
)


def test_arith_score() -> None:
    assert arith_score("synthetic/arith", "19", "19") == 1.0
    assert arith_score("synthetic/arith", " 19 ", "19") == 1.0
    assert arith_score("synthetic/arith", "191", "19") == 0.0
    assert arith_score("synthetic/arith", "x19", "19") == 0.0
    assert arith_score("synthetic/arith", "", "19") == 0.0


def test_gsm8k_score_takes_last_answer() -> None:
    assert gsm8k_score("openai/gsm8k", "so #### 12 wait #### 1,234", "1234") == 1.0
    assert gsm8k_score("openai/gsm8k", "#### 12", "13") == 0.0
    assert gsm8k_score("openai/gsm8k", "12", "12") == 0.0


def test_dispatch_by_data_source() -> None:
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    with pytest.raises(ConfigError, match="no rule-based scorer for data_source='unknown'"):
        default_compute_score("unknown", "x", "y")


def test_custom_function_file(tmp_path: Path) -> None:
    f = tmp_path / "r.py"
    f.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    return float(solution_str == ground_truth)\n")
    assert load_custom_function(str(f), "my_score")("d", "a", "a", None) == 1.0
    with pytest.raises(ConfigError, match="custom_reward_function.name='nope'"):
        load_custom_function(str(f), "nope")
    with pytest.raises(ConfigError, match="no such file"):
        load_custom_function(str(tmp_path / "missing.py"), "x")


def test_token_level_scores_on_last_valid_token() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).float()
    out = token_level_scores(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert out.tolist() == [[0, 1, 0], [0, 0, 2], [3, 0, 0]]
