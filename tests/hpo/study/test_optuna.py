"""The sampler and the pruner a study is made with (``hpo/study/_optuna.py``), on real Optuna studies: the median
pruner needs several trials at a step, the patient pruner spares a trial that keeps improving, and the GP sampler
runs a search through the real CLI."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpo.experiment._space import PrunerSpec, SamplerSpec
from hpo.study._optuna import make_pruner, make_sampler
from tests.hpo.conftest import fake_space, load, run_cli


def _study_with_two_good_trials(pruner: optuna.pruners.BasePruner) -> optuna.Study:
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for _ in range(2):
        t = study.ask()
        for step in range(5):
            t.report(0.9, step)
        study.tell(t, 0.9)
    return study


def test_median_pruner_needs_several_trials_at_a_step() -> None:
    """Plateau stopping ends the fast learners early, so at a late step one slower trial may be the only one with a
    value: a trial is not pruned for being below that one (n_min_trials: 3 by default), only below a real median."""
    def pruned_at_late_step(spec: PrunerSpec, late_reporters: int) -> bool:
        study = optuna.create_study(direction="maximize", pruner=make_pruner(spec))
        for i in range(4):  # four finished trials; only the first `late_reporters` reached step 6
            t = study.ask()
            for step in (0, 2, 4):
                t.report(0.5, step)
            if i < late_reporters:
                t.report(0.95, 6)
            study.tell(t, 0.95 if i < late_reporters else 0.5)
        t = study.ask()
        for step, v in ((0, 0.6), (2, 0.7), (4, 0.8)):
            t.report(v, step)  # above the median so far
        t.report(0.94, 6)  # its best, 0.94, within the noise of the one trial still there at step 6
        return t.should_prune()
    assert pruned_at_late_step(PrunerSpec(type="median", n_startup_trials=2, n_min_trials=1), 1)
    assert not pruned_at_late_step(PrunerSpec(type="median", n_startup_trials=2), 1)
    assert pruned_at_late_step(PrunerSpec(type="median", n_startup_trials=2), 3)  # a median of three: pruned


def test_patient_pruner_spares_a_trial_that_keeps_improving() -> None:
    plain = make_pruner(PrunerSpec(type="median", n_startup_trials=1, n_min_trials=1))
    patient = make_pruner(PrunerSpec(type="median", n_startup_trials=1, n_min_trials=1, patience=2))
    assert isinstance(patient, optuna.pruners.PatientPruner)
    for pruner, expect_pruned in ((plain, True), (patient, False)):
        study = _study_with_two_good_trials(pruner)
        t = study.ask()
        decisions = []
        for step, v in enumerate((0.1, 0.2, 0.3, 0.4, 0.5)):  # below the median, but rising every evaluation
            t.report(v, step)
            decisions.append(bool(t.should_prune()))
        assert any(decisions) is expect_pruned, (pruner, decisions)
    study = _study_with_two_good_trials(patient)  # below its own earlier best for patience + 1 evals: pruned
    t = study.ask()
    decisions = []
    for step, v in enumerate((0.5, 0.4, 0.3, 0.2, 0.1)):
        t.report(v, step)
        decisions.append(bool(t.should_prune()))
    assert decisions[:3] == [False, False, False] and decisions[3] is True


def test_gp_sampler_runs_a_search(tmp_path: Path, studies: Path) -> None:
    assert isinstance(make_sampler(SamplerSpec(type="gp", n_startup_trials=2), 0), optuna.samplers.GPSampler)
    space = fake_space(tmp_path, study={"n_trials": 5, "sampler": {"type": "gp", "n_startup_trials": 2}})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "fake").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    assert len({t.params["x"] for t in trials}) == 5
