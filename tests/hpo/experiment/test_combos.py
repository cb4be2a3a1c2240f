"""Tuned keys that interact (issue 54, item 2), with the real verl_core trainer from a directory of the user's own: a
value is valid when some combination of the other tuned keys' values makes it valid (not against the base config
alone); a combination the trainer refuses is skipped when a trial draws it (never launched, ``fail_reason=infeasible``
with the trainer's reason); a space where some value has no valid combination is one line naming the two values,
exit 2, before any study exists."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.experiment import Param, SpaceError
from hpo.experiment._combos import MAX_PER_VALUE, check_combinations
from tests.hpo.conftest import PY, cli_env, load

MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
MINI = "actor_rollout_ref.actor.ppo_mini_batch_size"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(cwd / "studies")], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=900)


def _space(cwd: Path, name: str, micro: list[int], n: int, **overrides: Any) -> Path:
    """verl's guide's pair: the micro-batch and the mini-batch tuned together (tiny_arith cut to one step of 8
    prompts and 16 validation prompts)."""
    raw = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 1, "trainer.test_freq": 1, "trainer.val_before_train": False,
                      "actor_rollout_ref.rollout.n": n, "data.train_batch_size": 8, "data.val_max_samples": 16,
                      "trainer.cpu_threads": 1, **overrides},
        "params": {"micro": {"key": MICRO, "type": "categorical", "choices": micro},
                   "mini": {"key": MINI, "type": "categorical", "choices": [2, 4]}},
        "study": {"n_trials": 2, "sampler": {"type": "random", "seed": 4}},
    }
    path = cwd / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_micro_and_mini_batch_tuned_together_validate_and_run(tmp_path: Path) -> None:
    """micro [2, 4, 8] x mini [2, 4] with rollout.n 2: each value is valid with some other (8 needs mini 4: 8 <= 4 x
    2), so the space validates (before: 'params.mini: value 2 is rejected by the trainer: ...=16 is larger than ... x
    rollout.n=4', the base config's micro-batch of 16), and (8, 2), the one combination verl_core refuses, is skipped
    when drawn (random seed 4: (8, 2), then (4, 4)), never launched, while the other trial runs."""
    path = _space(tmp_path, "pair", [2, 4, 8], n=2)
    check = _cli(tmp_path, "validate", "--space", str(path))
    assert check.returncode == 0, check.stderr
    assert "corner micro=8, mini=2: infeasible, skipped" in check.stdout and "All checks passed" in check.stdout

    search = _cli(tmp_path, "search", "--space", str(path))
    assert search.returncode == 0, search.stderr
    skipped, ran = load(tmp_path / "studies", "pair").trials
    assert skipped.params == {"micro": 8, "mini": 2} and skipped.user_attrs["fail_reason"] == "infeasible"
    assert skipped.values == [-math.inf] and "is larger than" in skipped.user_attrs["error"]
    assert "exit_code" not in skipped.user_attrs  # never launched
    assert not (Path(skipped.user_attrs["trial_dir"]) / "stdout.log").exists()
    assert ran.params == {"micro": 4, "mini": 4} and "fail_reason" not in ran.user_attrs and ran.values[0] >= 0
    assert "infeasible: 1 trial(s) not launched" in search.stdout, search.stdout


def test_a_space_where_a_value_fits_no_combination_is_one_line(tmp_path: Path) -> None:
    """A micro-batch of 16 against mini-batches of 2 and 4 prompts x rollout.n 1: no combination is valid."""
    path = _space(tmp_path, "clash", [16], n=1)
    check = _cli(tmp_path, "validate", "--space", str(path))
    lines = check.stderr.strip().splitlines()
    assert check.returncode == 2 and len(lines) == 1, check.stderr
    assert lines[0].startswith(f"error: {path}: params.micro: value 16 conflicts with params.mini=4"), lines[0]
    assert "16 is larger than" in lines[0] and "Traceback" not in check.stderr
    assert not (tmp_path / "studies").exists() or not list((tmp_path / "studies").iterdir())


def _batch_rule(values: dict[str, Any]) -> str | None:
    """verl_core's rule in small: the micro-batch at most the mini-batch (x rollout.n = 1) and dividing it."""
    micro, mini = values.get("micro", 1), values.get("mini", 1)
    if micro > mini:
        return f"{MICRO}={micro} is larger than {MINI} x rollout.n={mini}"
    return None if mini % micro == 0 else f"{MINI} x rollout.n={mini} is not divisible by {MICRO}={micro}"


def _refused(params: list[Param]) -> str | None:
    def error(where: str, msg: str) -> Exception:
        return SpaceError(f"{where}: {msg}")

    try:
        check_combinations(params, _batch_rule, error)
    except SpaceError as err:
        return str(err)
    return None


def test_each_value_needs_one_valid_combination_of_the_others() -> None:
    """Integer ranges are tried at each value (divisibility), categorical choices at each; a large space at the
    others' corners and draws, per value."""
    micro = Param("micro", MICRO, "categorical", choices=(2, 4, 8))
    assert _refused([micro, Param("mini", MINI, "categorical", choices=(2, 8))]) is None  # 4 and 8 with 8
    one_or_8 = Param("micro", MICRO, "categorical", choices=(1, 8))  # 8 only with 8: not a corner of 7..9
    assert _refused([one_or_8, Param("mini", MINI, "int", low=7, high=9)]) is None
    assert _refused([micro, Param("mini", MINI, "int", low=6, high=8)]) == (  # 7: no micro-batch divides it
        f"params.mini: value 7 conflicts with params.micro=8, and with every other combination of the tuned keys' "
        f"values: {MICRO}=8 is larger than {MINI} x rollout.n=7")
    line = _refused([Param("micro", MICRO, "categorical", choices=(2, 16)),
                     Param("mini", MINI, "categorical", choices=(4, 8))])
    assert line == (f"params.micro: value 16 conflicts with params.mini=8, and with every other combination of the "
                    f"tuned keys' values: {MICRO}=16 is larger than {MINI} x rollout.n=8")
    lr = [Param(f"lr{i}", f"optim.lr{i}", "float", low=1e-6, high=1e-3) for i in range(9)]  # 2^9 x 2 x 2 > 512
    assert _refused([micro, Param("mini", MINI, "categorical", choices=(4, 8)), *lr]) is None
    line = _refused([Param("micro", MICRO, "categorical", choices=(16,)),
                     Param("mini", MINI, "categorical", choices=(4, 8)), *lr])
    assert line is not None and f"each of the {MAX_PER_VALUE} combinations" in line and "params.mini=" in line
    with pytest.raises(SpaceError, match="value 0 is rejected by the trainer with every combination"):
        check_combinations([Param("micro", MICRO, "categorical", choices=(0, 2)), *lr[:1]],
                           lambda v: "must be positive" if v["micro"] == 0 else None,
                           lambda where, msg: SpaceError(f"{where}: {msg}"))
