"""``verl-hpo validate`` (``hpo/commands/_validate.py``) through the real CLI: the shipped verl_core experiment checked
corner by corner with each corner's memory estimate, a value the trainer refuses in every corner named in one line,
an experiment whose trainer is a command of its own checked as a space only, and ``--metrics`` read only from a
regular file."""

from __future__ import annotations

import os
from pathlib import Path

from tests.hpo.conftest import fake_space, run_cli


def test_the_shipped_experiment_passes_corner_by_corner(tmp_path: Path) -> None:
    res = run_cli(["validate", "--space", "kl_lr"], tmp_path / "studies")
    assert res.returncode == 0, res.stderr
    corners = [line for line in res.stdout.splitlines() if line.startswith("corner ")]
    assert len(corners) == 4 and all(line.endswith(": fits") for line in corners), res.stdout
    assert "TOTAL (peak)" in res.stdout and res.stdout.rstrip().endswith("All checks passed")
    assert not (tmp_path / "studies").exists()  # nothing is made


def test_a_value_the_trainer_refuses_is_one_line_naming_the_parameter(tmp_path: Path) -> None:
    res = run_cli(["validate", "--space", "kl_lr", "--override", "trainer.total_training_steps=0"],
                  tmp_path / "studies")
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert "params.kl_coef: value 0.01 is rejected by the trainer" in line and \
        "trainer.total_training_steps=0 must be positive" in line, line


def test_a_command_of_its_own_is_checked_as_a_space_and_metrics_must_be_a_regular_file(tmp_path: Path) -> None:
    space = fake_space(tmp_path)
    res = run_cli(["validate", "--space", str(space)], tmp_path / "studies")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"{space}: trial.command is not the default trainer: only the space itself "
                                       "was checked", "All checks passed"]
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    res = run_cli(["validate", "--space", str(space), "--metrics", str(fifo)], tmp_path / "studies")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"error: --metrics {fifo}: is a FIFO, not a "
                                                                       "regular file"]
