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


def _reward_model(tmp_path: Path, tok: object, name: str = "rm") -> Path:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    rm = Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=1,  # type: ignore[arg-type]
        num_attention_heads=1, num_key_value_heads=1, head_dim=64, num_labels=1,
        pad_token_id=tok.pad_token_id))  # type: ignore[attr-defined]
    rm.save_pretrained(tmp_path / name)
    tok.save_pretrained(tmp_path / name)  # type: ignore[attr-defined]
    return tmp_path / name


def test_reward_model_scores_token_ids_as_if_each_row_were_unpadded(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Same tokenizer: the rollout's ids are scored directly, at each row's last attended token (EOS included)."""
    from transformers import AutoTokenizer

    from verl_core.rewards import ModelReward

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    reward = ModelReward(str(_reward_model(tmp_path, tok)), torch.device("cpu"), 3, None, tok)
    assert reward.on_token_ids
    g = torch.Generator().manual_seed(0)
    prompt_len = [5, 3, 5, 4, 2]
    resp_len = [4, 2, 1, 4, 3]  # rows 1 and 2 end with EOS
    rows = []
    for p, r in zip(prompt_len, resp_len):
        seq = torch.randint(10, len(tok), (p + r,), generator=g)
        if r < 4:
            seq[-1] = tok.eos_token_id
        rows.append(seq)
    ids = torch.full((5, 9), tok.pad_token_id)
    mask = torch.zeros(5, 9, dtype=torch.long)
    for i, (seq, p, r) in enumerate(zip(rows, prompt_len, resp_len)):
        ids[i, 5 - p : 5 + r] = seq
        mask[i, 5 - p : 5 + r] = 1
    ids[2, 6:] = 7  # garbage after EOS must not matter: it is masked
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    got = reward([], [], [], batch=batch)
    with torch.no_grad():
        want = [float(reward.model(input_ids=seq[None]).logits[0, 0]) for seq in rows]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(x, 4) for x in got)) == 5


def test_reward_model_with_another_tokenizer_scores_text(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from verl_core.rewards import ModelReward

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    other = AutoTokenizer.from_pretrained(tiny_model_dir)
    other.add_tokens(["<extra>"])
    reward = ModelReward(str(_reward_model(tmp_path, other)), torch.device("cpu"), None, None, tok)
    assert not reward.on_token_ids
    with torch.no_grad():
        want = float(reward.model(**other("ab" + "cd", return_tensors="pt", add_special_tokens=False)).logits[0, 0])
    assert reward(["cd"], [None], ["ab"], batch={}) == pytest.approx([want], abs=1e-5)
    # the same tokenizer but max_length truncation: text path too
    assert not ModelReward(str(_reward_model(tmp_path, tok, "rm2")), torch.device("cpu"), None, 8, tok).on_token_ids
