"""What verl's data path and the reward found on every row, read back by the driver (``hpo/backends/verl/_rows.py``):
each time limit from its environment variable (one line naming a bad value), the reply of the row check turned into
problem, note and ok lines naming the experiment field that sets the key, and a check that ran out of its time while
it called the reward blamed on the reward. Nothing here runs verl."""

from __future__ import annotations

import pytest

from hpo.backends import load_space
from hpo.backends.verl._rows import (
    REWARD_CALL_ENV,
    REWARD_ENV,
    ROWS_ENV,
    env_seconds,
    hung_reward,
    row_check_request,
    row_lines,
)
from hpo.experiment import SpaceError
from tests.hpo.backends.verl.conftest import CPU_SPACE

SPACE = load_space(str(CPU_SPACE), check=False)


def test_each_limit_comes_from_its_variable_and_a_bad_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ROWS_ENV, REWARD_CALL_ENV, REWARD_ENV):
        monkeypatch.delenv(name, raising=False)
    default = row_check_request()
    assert default["reward_call_s"] <= default["reward_s"] and default["rows_s"] > 0
    monkeypatch.setenv(ROWS_ENV, "7.5")
    monkeypatch.setenv(REWARD_CALL_ENV, "900")
    assert row_check_request(reward_s=4.0) == {"rows_s": 7.5, "reward_call_s": 4.0, "reward_s": 4.0}  # a call <= all
    assert env_seconds(ROWS_ENV, 1.0, "x") == 7.5 and env_seconds("VERL_HPO_NOT_SET_HERE", 3.0, "x") == 3.0
    for bad in ("0", "-1", "nan", "1e400", "forever", "86401"):
        monkeypatch.setenv(REWARD_ENV, bad)
        with pytest.raises(SpaceError) as err:
            row_check_request()
        assert str(err.value) == (f"{REWARD_ENV}={bad!r}: must be a number of seconds above 0 and at most 86400 "
                                  "(what the reward's calls may take in all before launch)")


def test_the_reply_becomes_lines_naming_the_field_that_sets_each_key() -> None:
    reply = {"problems": ["data.val_files: /d/val.parquet row 40: verl's own data path raises TypeError",
                          "actor_rollout_ref.actor.optim.lr: a key of a parameter", "no.such.key: said as is"],
             "notes": ["2 of 64 rows not checked in the time"],
             "reward": {"where": "/d/reward.py:compute_score", "calls": 12, "targets": 6, "min": 0.0, "max": 1.0,
                        "seconds": 0.002, "note": "slow", "printed_bytes": 9000, "printed_dropped_bytes": 10}}
    lines = row_lines(SPACE, reply)
    assert lines[:3] == [
        ("problem", "overrides.data.val_files", "/d/val.parquet row 40: verl's own data path raises TypeError"),
        ("problem", "params.actor_lr", "a key of a parameter"),
        ("problem", "no.such.key", "said as is")]
    assert lines[3] == ("note", "", "2 of 64 rows not checked in the time")
    level, field, ok = lines[4]
    assert (level, field) == ("ok", "") and ok.startswith("reward: /d/reward.py:compute_score returned finite "
                                                          "numbers in 12 calls on 6 rows") and "2 ms a call" in ok
    assert lines[5:] == [("note", "", "reward: slow"),
                         ("note", "", "reward: /d/reward.py:compute_score printed 9000 bytes in 12 calls: a trial's "
                                      "logs grow with every call")]
    failed = row_lines(SPACE, {"reward": {"problem": "raised KeyError on row 3", "calls": 1}})
    assert failed == [("problem", "overrides.reward.custom_reward_function.path", "raised KeyError on row 3")]
    assert row_lines(SPACE, None) == [] and row_lines(SPACE, {}) == []


def test_a_check_out_of_time_while_calling_the_reward_blames_the_reward() -> None:
    marker = "verl-hpo: calling the reward function"
    assert hung_reward(f"dataset len: 64\n{marker}\n".encode()) and not hung_reward(f"{marker}\n{marker} done\n")
    assert not hung_reward("composing the config\n") and not hung_reward(None) and not hung_reward(b"")
