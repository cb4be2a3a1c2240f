"""The summary a search or resume prints when it ends (``hpo/reporting/_summary.py``), on a real Optuna study: the
trials by outcome, the trainer time saved, the trial directories' disk use, then a line for each thing to look at
(trials not launched for memory or infeasibility, rows the trainers dropped and logs cut, health labels), the
storage with its password masked, and a proxy search's check (nothing for any other study)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from hpo.reporting._summary import dropped_summary, fidelity_summary, summary

optuna.logging.set_verbosity(optuna.logging.WARNING)
X = {"x": FloatDistribution(0, 1)}


def study_of(*user_attrs: dict[str, object]) -> optuna.Study:
    study = optuna.create_study(study_name="s", direction="maximize")
    for i, attrs in enumerate(user_attrs):
        failed = "fail_reason" in attrs
        study.add_trial(create_trial(value=-math.inf if failed else 0.1 * (i + 1), params={"x": 0.1 * i},
                                     distributions=X, user_attrs=attrs))
    return study


def test_the_summary_counts_outcomes_and_says_what_to_look_at(tmp_path: Path) -> None:
    trials_dir = tmp_path / "trials"
    (trials_dir / "0").mkdir(parents=True)
    (trials_dir / "0" / "metrics.jsonl").write_bytes(b"x" * 4096)
    study = study_of({"stop_reason": "converged", "compute_saved_s": 30.0},
                     {"fail_reason": "predicted_oom"},
                     {"fail_reason": "infeasible", "error": "micro-batch 64 > mini-batch 32"},
                     {"dropped_rows": 3, "dropped_rows_error": "TypeError: content is None",
                      "health": ["gpu_underused"], "logs_cut": {"stdout.log": 1024}}, {})
    text = summary(study, "postgresql://u:secret@db/hpo", str(trials_dir))
    lines = text.splitlines()
    counts = next(line for line in lines if line.startswith("trials: "))
    assert counts.startswith("trials: 1 converged, 1 infeasible, 2 ok, 1 predicted_oom;") and "saved ~30s" in counts
    assert "trial directories hold 0.00 GB" in counts
    assert any(line.startswith("memory: 1 trial(s) not launched (predicted OOM") for line in lines)
    assert any(line.startswith("infeasible: 1 trial(s) not launched") and "first: trial 2 x=0.2: micro-batch 64 > "
               "mini-batch 32" in line for line in lines), text
    assert any(line.startswith("dropped rows: ") and "trial(s) 3 (3)" in line for line in lines)
    assert any(line.startswith("logs cut at their cap") and "3 (stdout.log)" in line for line in lines)
    assert any(line.startswith("health gpu_underused: trial(s) 3; look at ") for line in lines)
    assert "study s in postgresql://u:***@db/hpo" in lines and "secret" not in text
    assert lines[-1] == f"trial logs in {trials_dir}/<number>/ (command.json, config.yaml, stdout.log, stderr.log, " \
                        "metrics.jsonl)"


def test_nothing_to_say_is_no_line() -> None:
    study = study_of({}, {})
    assert dropped_summary(study.trials) == "" and fidelity_summary(study) == ""
