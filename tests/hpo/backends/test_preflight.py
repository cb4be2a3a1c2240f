"""Will a trial fit (``hpo/backends/_preflight.py``)? Every corner of a space (each parameter at its ends, jointly,
at most 64), a search refused before its study exists when no corner fits (one line naming the smallest corner's
culprit), ``validate``'s report of every corner (a CPU study's estimate never said to run on a GPU it does not have),
and the sequence lengths a previous run's metrics file gives (in the trainer's metric names). The estimates are the
shipped ``kl_lr`` experiment's (verl_core's arithmetic, no torch)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from hpo.backends import load_space
from hpo.backends._preflight import (
    MAX_CORNERS,
    Prediction,
    check_space_fits,
    corners,
    read_lengths,
    report_corners,
    validate_space,
)
from hpo.experiment import Space, SpaceError

GiB = 2**30


def capped(space: Space, gb: float, preflight: bool = True) -> Space:
    return dataclasses.replace(space, trial=dataclasses.replace(space.trial, memory_limit_gb=gb, preflight=preflight))


def test_the_corners_are_each_parameter_at_its_ends_jointly_and_at_most_64() -> None:
    space = load_space("kl_lr")
    assert corners(space) == [{"kl_coef": 0.01, "actor_lr": 1e-07}, {"kl_coef": 0.01, "actor_lr": 0.003},
                              {"kl_coef": 2.0, "actor_lr": 1e-07}, {"kl_coef": 2.0, "actor_lr": 0.003}]
    wide = load_space("kl_lr", [f"params.p{i}={{key: fake.p{i}, type: int, low: 1, high: 2}}" for i in range(6)],
                      check=False)
    assert len(corners(wide)) == MAX_CORNERS < 2 ** 8


def test_a_search_no_corner_of_which_fits_is_refused_before_its_study() -> None:
    space = load_space("kl_lr")
    check_space_fits(space, [])  # 3 GiB: every corner fits
    with pytest.raises(SpaceError) as err:
        check_space_fits(capped(space, 0.05), [])
    text = str(err.value)
    assert text.startswith("search_spaces/kl_lr.yaml: every corner of the space is predicted not to fit in memory "
                           "(smallest: kl_coef=") and text.endswith("lower the batch sizes or raise "
                                                                    "trial.memory_limit_gb, or set trial.preflight: "
                                                                    "false") and "\n" not in text
    check_space_fits(capped(space, 0.05, preflight=False), [])  # the user's call


def test_validate_reports_every_corner_and_exits_2_naming_the_first_that_does_not_fit(
        capsys: pytest.CaptureFixture[str]) -> None:
    space = load_space("kl_lr")
    out = io.StringIO()
    assert validate_space(capped(space, 0.05), [], out) == 2
    assert sum(line.endswith(": DOES NOT FIT") for line in out.getvalue().splitlines()) == 4
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: search_spaces/kl_lr.yaml: 4 corner(s) predicted not to fit in memory; first: ")


def test_a_cpu_study_s_gpu_estimate_is_said_to_be_for_a_gpu_it_will_get() -> None:
    space = load_space("kl_lr")
    space = dataclasses.replace(space, trial=dataclasses.replace(space.trial, gpus_per_trial=0))  # CPU trials
    on_gpu = Prediction(int(1.5 * GiB), 80 * GiB, "assumed 80 GiB", "cuda", None, "TABLE", worst_total=3 * GiB,
                        warning="the worst case does not fit")
    big = Prediction(2 * GiB, 3 * GiB, "trial.memory_limit_gb=3.0", "cpu", None, "BIG TABLE")
    out = io.StringIO()
    assert report_corners(space, [({"kl_coef": 0.01}, on_gpu), ({"kl_coef": 2.0}, big)], ["mind the lr"], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == ("corner kl_coef=0.01: 1.500 GiB, worst case 3.000 GiB of 80.000 GiB (assumed 80 GiB) on a GPU, "
                        "when the trials get one: fits (worst case does not)")
    assert lines[1] == "corner kl_coef=2.0: 2.000 GiB of 3.000 GiB (trial.memory_limit_gb=3.0) on cpu: fits"
    assert lines[2:4] == ["warning: mind the lr", "warning: corner kl_coef=0.01: the worst case does not fit"]
    assert "largest corner (kl_coef=2.0):" in lines and "BIG TABLE" in lines and lines[-1] == "All checks passed"


def test_a_previous_run_s_lengths_come_from_its_metrics_file(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "data": {"response_length/mean": r, "prompt_length/mean": 12}})
                               + "\n" for s, r in ((1, 30.0), (2, 55.5), (3, 40.0))))
    lengths = read_lengths(metrics, "prompt_length/mean", "response_length/mean")  # the trainer's names
    assert (lengths.response, lengths.prompt) == (55.5, 12)  # the largest the run logged
    metrics.write_text(json.dumps({"step": 1, "data": {"actor/pg_loss": 0.1}}) + "\n")
    with pytest.raises(SpaceError) as err:
        read_lengths(metrics, "prompt_length/mean", "response_length/mean")
    assert "\n" not in str(err.value) and str(metrics) in str(err.value)
