"""The proxy's promotion and check (:mod:`hpo.samplers._promotion`, :mod:`hpo.samplers._check`) on a real SQLite
study: the promoted settings are queued once whoever asks and however often (a resume, two drivers at once: the
later twin is surplus), Kendall's tau and the decision, and the fidelity-aware sampler that keeps the target's search
off the proxy's values."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.experiment import read_space
from hpo.record import (
    ATTR_FIDELITY,
    ATTR_FIDELITY_CHECK,
    ATTR_PROMOTED_FROM,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
    PROXY,
    TARGET,
    is_promoted,
    is_tie_run,
)
from hpo.samplers._check import agreement, check_line, kendall_tau, record_check, tau_p_value, unmeasured_setting
from hpo.samplers._fidelity import FidelitySampler, search_fidelity
from hpo.samplers._promotion import (
    promotion_twin,
    proxy_ranking,
    proxy_ties,
    start_promotion,
    start_ties,
    tie_twin,
    ties_line,
)

DIST: dict[str, BaseDistribution] = {"x": FloatDistribution(0.0, 1.0)}


def _space(tmp_path: Path, promote: int = 3, tie_seeds: int = 1):  # type: ignore[no-untyped-def]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "config": "tiny_arith", "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "early_stopping": {"plateau_min_delta": 0.01},
        "study": {"n_trials": 4, "fidelity": {"proxy": {"overrides": {"m": "small"}, "promote": promote,
                                                        "promote_steps": 5, "tie_seeds": tie_seeds}}}}))
    return read_space(str(path))[0]


def _study(tmp_path: Path, proxy_values: list[float]) -> optuna.Study:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    for i, v in enumerate(proxy_values):
        study.add_trial(create_trial(value=v, params={"x": i / 10}, distributions=DIST,
                                     system_attrs={ATTR_FIDELITY: PROXY}, user_attrs={"last_step": 10}))
    return study


def test_kendall_tau_and_its_exact_p_value() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None  # a constant sample: no ranking
    assert tau_p_value([1, 2, 3, 4], [1, 2, 3, 4], 1.0) == pytest.approx(1 / 24)  # 1 ordering in 4!


def test_the_promoted_settings_are_queued_once_however_often_they_are_asked_for(tmp_path: Path) -> None:
    space, study = _space(tmp_path), _study(tmp_path, [0.5, 0.9, 0.7, 0.1])
    assert start_promotion(study, space) == [1, 2, 0]  # the proxy's best 3, best first
    assert start_promotion(study, space) == []  # a resume, another driver later: nothing twice
    promoted = [t for t in study.get_trials() if is_promoted(t)]
    assert [t.system_attrs[ATTR_PROMOTED_FROM] for t in promoted] == [1, 2, 0]
    assert all(t.state == TrialState.WAITING and t.system_attrs[ATTR_FIDELITY] == TARGET
               and t.system_attrs["hpo:promote_steps"] == 5 and t.params == study.trials[
                   t.system_attrs[ATTR_PROMOTED_FROM]].params for t in promoted)
    # two drivers queueing at once: the later twin is surplus, the first runs
    study.add_trial(create_trial(state=TrialState.WAITING, params={"x": 0.1}, distributions=DIST,
                                 system_attrs=dict(promoted[0].system_attrs)))
    twin = study.trials[-1]
    assert promotion_twin(study, twin) == promoted[0].number and promotion_twin(study, promoted[0]) is None


def test_the_check_catches_a_reversed_ranking_and_trusts_an_agreeing_one(tmp_path: Path) -> None:
    space = _space(tmp_path)
    reversed_ = agreement([(1, 5, 0.9, 0.2), (2, 6, 0.7, 0.5), (0, 7, 0.5, 0.8)], 1.0, space)
    assert reversed_["holds"] is False and reversed_["tau"] == -1.0 and reversed_["target_best"] == 0
    assert reversed_["gap"] == pytest.approx(0.6)
    agreeing = agreement([(1, 5, 0.9, 0.8), (2, 6, 0.7, 0.5), (0, 7, 0.5, 0.2)], 1.0, space)
    assert agreeing["holds"] is True and agreeing["tau"] == 1.0 and agreeing["gap"] == 0.0
    # the proxy's best within the resolution (plateau_min_delta 0.01) of the target's: the swap at the top is noise
    close = agreement([(1, 5, 0.9, 0.795), (2, 6, 0.7, 0.8), (0, 7, 0.5, 0.2)], 1.0, space)
    assert close["holds"] is True and close["tau"] == pytest.approx(1 / 3)


def test_the_check_compares_the_proxy_and_the_target_at_the_promotion_step(tmp_path: Path) -> None:
    """Build D of the tiny_arith family, study seed 0 (benchmarks/RESULTS.md): the proxy's best at 60 steps (a slow
    starter, lr 4.8e-6) was behind at step 10 on the target (0.318 against 0.41), and the check, comparing the proxy's
    final values with the target's 10-step ones, failed and threw away the setting the target confirmed best at 60
    steps. Both models rank the three alike at step 10: the check now compares them there and holds; a proxy whose
    step-10 ranking is the target's reversed still fails."""
    space = _space(tmp_path)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    for i, curve in enumerate([{0: 0.02, 5: 0.70, 10: 0.938},  # the slow starter: the proxy's best at the end
                               {0: 0.02, 5: 0.92, 10: 0.932},
                               {0: 0.02, 5: 0.90, 10: 0.929}]):
        study.add_trial(create_trial(value=curve[10], intermediate_values=curve, params={"x": i / 10},
                                     distributions=DIST, system_attrs={ATTR_FIDELITY: PROXY},
                                     user_attrs={"last_step": 10}))
    start_promotion(study, space)  # promote_steps 5
    for t, value in zip([t for t in study.get_trials() if is_promoted(t)], (0.318, 0.413, 0.407), strict=True):
        study._storage.set_trial_state_values(t._trial_id, TrialState.COMPLETE, [value])
    check = record_check(study, space, {}, {"candidates": [0, 1, 2], "steps": 5})
    assert [p[2] for p in check["pairs"]] == [0.70, 0.92, 0.90]  # the proxy at step 5, in its full-length order
    assert check["holds"] is True and check["tau"] == 1.0 and check["gap"] == 0.0
    assert check["proxy_best"] == check["target_best"] == 1  # the first of both at step 5
    assert "at step 5" in check_line(check)
    # the target's step-5 order the other way round: the proxy does not hold
    reversed_ = agreement([(0, 3, 0.70, 0.413), (1, 4, 0.92, 0.318), (2, 5, 0.90, 0.36)], 1.0, space)
    assert reversed_["holds"] is False and reversed_["tau"] == -1.0 and reversed_["gap"] == pytest.approx(0.095)
    # build E, study seed 0: the proxy had its two best at the same value at step 10 (0.404) and the target 0.011
    # apart; the proxy ranks nothing there, so only the gap is asked (its first, by its full-length order, is the
    # target's best) and the check holds, with nothing unmeasured (its pick is the target's best there)
    tied = agreement([(2, 12, 0.404, 0.269), (7, 13, 0.404, 0.258)], 1.0, space)
    assert tied["tau"] is None and tied["holds"] is True and "nothing to rank" in tied["why"]
    assert "unmeasured" not in tied
    # with the target's order the other way round the proxy still claims nothing between the two at step 10 (no
    # gap), but the target has its pick 0.011 behind where the proxy had it level: a catch-up never measured
    behind = agreement([(2, 12, 0.404, 0.258), (7, 13, 0.404, 0.269)], 1.0, space)
    assert behind["holds"] is True and behind["gap"] == 0.0
    assert behind["unmeasured"] == {"trial": 7, "run": 13, "of": 2, "of_run": 12, "proxy_gap": 0.0,
                                    "target_gap": pytest.approx(0.011)}


def test_a_catch_up_the_proxy_never_measured_races_the_target_s_best_against_the_pick(tmp_path: Path) -> None:
    """Build C of the tiny_arith family (benchmarks/RESULTS.md): the proxy's full-length best was a slow starter on
    study seeds 0 and 2, behind the other promoted setting at step 10 on both models, by 0.049 and 0.004 on the proxy
    and 0.351 and 0.291 on the target. The check held (both rank the two alike there) and the race ran the slow
    starter alone; on fresh seeds it tested below the other. The target's deficit is larger than any the proxy saw
    its pick make up: the check keeps the other setting as unmeasured, its line says so, and the race takes both.
    A pick whose deficit on the target is no larger than on the proxy (to the resolution) is trusted."""
    space = _space(tmp_path)
    seed2 = agreement([(3, 14, 0.480, 0.187), (8, 15, 0.484, 0.478)], 1.0, space)
    assert seed2["holds"] is True and seed2["gap"] == 0.0 and seed2["proxy_best"] == seed2["target_best"] == 8
    assert seed2["unmeasured"] == {"trial": 8, "run": 15, "of": 3, "of_run": 14, "proxy_gap": pytest.approx(0.004),
                                   "target_gap": pytest.approx(0.291)}
    line = check_line({**seed2, "steps": 10})
    assert ("at step 10 its pick, trial 3 (target run 14), was 0.004 behind trial 8 (target run 15) on the proxy and "
            "0.291 behind it on the target: a catch-up the proxy never measured, so the race takes both") in line
    assert line.endswith("the confirmation races them on the target")
    seed0 = agreement([(2, 12, 0.438, 0.109), (11, 13, 0.487, 0.460)], 1.0, space)
    assert seed0["holds"] is True and seed0["tau"] == 1.0
    assert seed0["unmeasured"] == {"trial": 11, "run": 13, "of": 2, "of_run": 12, "proxy_gap": pytest.approx(0.049),
                                   "target_gap": pytest.approx(0.351)}
    # the target's deficit no larger than the proxy's (to the resolution): the proxy measured that catch-up
    measured = agreement([(2, 12, 0.404, 0.41), (11, 13, 0.493, 0.491)], 1.0, space)
    assert measured["holds"] is True and "unmeasured" not in measured
    assert "catch-up" not in check_line(measured)
    edge = agreement([(2, 12, 0.40, 0.30), (11, 13, 0.45, 0.359)], 1.0, space)  # 0.059 against 0.05: 0.009 more
    assert "unmeasured" not in edge
    # the pick ahead on the proxy within the resolution, behind on the target: the same
    ahead = agreement([(3, 14, 0.488, 0.187), (8, 15, 0.484, 0.478)], 1.0, space)
    assert ahead["unmeasured"]["proxy_gap"] == pytest.approx(-0.004)
    assert "its pick, trial 3 (target run 14), was 0.004 ahead of trial 8 (target run 15) on the proxy" in check_line(
        ahead)
    # a failed check keeps nothing: its race is the target's
    failed = agreement([(3, 14, 0.60, 0.187), (8, 15, 0.484, 0.478)], 1.0, space)
    assert failed["holds"] is False and "unmeasured" not in failed
    # the record is read back from storage, never trusted
    assert unmeasured_setting({"unmeasured": {"trial": 8, "run": "15", "of": 3, "proxy_gap": 0.0,
                                              "target_gap": 0.2}}) is None
    assert unmeasured_setting({"unmeasured": {"trial": 8, "run": 15, "of": 3, "proxy_gap": 0.0,
                                              "target_gap": float("nan")}}) is None
    assert unmeasured_setting(seed2) == seed2["unmeasured"] and unmeasured_setting(None) is None


def test_the_check_is_recorded_once_and_then_the_search_samples_on_the_target(tmp_path: Path) -> None:
    space, study = _space(tmp_path), _study(tmp_path, [0.5, 0.9, 0.7, 0.1])
    start_promotion(study, space)
    for t, value in zip([t for t in study.get_trials() if is_promoted(t)], (0.2, 0.5, 0.8), strict=True):
        study._storage.set_trial_state_values(t._trial_id, TrialState.COMPLETE, [value])
    assert search_fidelity(study) == PROXY
    check = record_check(study, space, {}, {"candidates": [1, 2, 0], "steps": 5})
    assert check["holds"] is False and study.user_attrs[ATTR_FIDELITY_CHECK] == check
    assert record_check(study, space, {}, {"candidates": []}) == check  # kept: every driver reads the same
    assert search_fidelity(study) == TARGET
    # a new trial is tagged target, and its sampler sees only the target's trials, never the proxy's values
    seen: list[list[int]] = []

    class Spy(optuna.samplers.RandomSampler):
        def sample_independent(self, study, trial, name, dist):  # type: ignore[no-untyped-def, override]
            seen.append([t.number for t in study.get_trials(deepcopy=False)])
            return super().sample_independent(study, trial, name, dist)

    study.sampler = FidelitySampler(optuna.samplers.RandomSampler(seed=0), Spy(seed=0))
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    assert study.trials[trial.number].system_attrs[ATTR_FIDELITY] == TARGET
    assert seen and all(n >= 4 for n in seen[0])  # trials 0-3 are the proxy's


def test_completed_proxy_trials_rank_by_value_whatever_step_they_stopped_at(tmp_path: Path) -> None:
    """A plateau stop at step 40 is a complete run: it ranks by its value above a lower one that ran all 60 steps
    (seed 0 of the proxy benchmark promoted 0.938 at 60 steps as the proxy's best over 0.945 at 40). Pruned trials
    come after every completed one, a later rung first."""
    space = _space(tmp_path)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    for i, (v, steps, state) in enumerate([(0.938, 60, TrialState.COMPLETE), (0.945, 40, TrialState.COMPLETE),
                                           (0.944, 50, TrialState.COMPLETE), (0.99, 30, TrialState.PRUNED),
                                           (0.99, 10, TrialState.PRUNED)]):
        study.add_trial(create_trial(state=state, value=v if state == TrialState.COMPLETE else None,
                                     intermediate_values={steps: v}, params={"x": i / 10}, distributions=DIST,
                                     system_attrs={ATTR_FIDELITY: PROXY}, user_attrs={"last_step": steps}))
    assert start_promotion(study, space) == [1, 2, 0]


def test_a_pruned_trial_ranks_above_a_completed_one_it_beat_at_its_rung(tmp_path: Path) -> None:
    """Seeds 0 and 2 of the proxy benchmark (2026-12-05) promoted a trial that completed at 0.307 because it passed
    its rungs alone, and one that collapsed at step 2 (0.018), over trials pruned at step 30 with 0.93: a pruned
    trial now goes before the first completed one whose value at its rung and final value were lower; one that beat
    it there (or has no value there) stays ahead, and the pruned trials keep their own order (later rung, then
    value)."""
    space = _space(tmp_path)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    for i, (value, curve, state) in enumerate([
            (0.966, {10: 0.92, 30: 0.95, 50: 0.966}, TrialState.COMPLETE),  # 0: the best, beat everyone at each rung
            (0.307, {10: 0.1, 30: 0.2, 60: 0.307}, TrialState.COMPLETE),  # 1: passed its rungs alone
            (0.018, {0: 0.018, 2: 0.018}, TrialState.COMPLETE),  # 2: collapsed at step 2
            (0.929, {10: 0.90, 30: 0.929}, TrialState.PRUNED),  # 3: pruned at 30 for lack of room
            (0.4, {10: 0.4}, TrialState.PRUNED)]):  # 4: pruned at 10
        study.add_trial(create_trial(state=state, value=value, intermediate_values=curve, params={"x": i / 10},
                                     distributions=DIST, system_attrs={ATTR_FIDELITY: PROXY},
                                     user_attrs={"last_step": max(curve)}))
    assert [t.number for t in proxy_ranking(study.get_trials(), 1.0)] == [0, 3, 4, 1, 2]
    assert start_promotion(study, space) == [0, 3, 4]


def test_a_slow_starter_that_ended_above_a_pruned_trial_stays_ahead_of_it(tmp_path: Path) -> None:
    """Build E, study seed 0 (benchmarks/RESULTS.md): trial 2 completed at 0.966 after 0.887 at step 30, trial 7 was
    pruned at step 30 with 0.898. The pruned trial beat it at the rung, not at the end: the completed one stays the
    proxy's best (it was ranked second, behind the pruned one, and the study promoted the pruned one first)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    for i, (value, curve, state) in enumerate([
            (0.966, {10: 0.404, 30: 0.887, 60: 0.966}, TrialState.COMPLETE),  # 0: the slow starter, best at the end
            (0.93, {10: 0.493, 30: 0.941, 40: 0.93}, TrialState.COMPLETE),  # 1: plateaued at step 40
            (0.898, {10: 0.404, 30: 0.898}, TrialState.PRUNED),  # 2: pruned at 30
            (0.298, {10: 0.027, 30: 0.065, 60: 0.298}, TrialState.COMPLETE)]):  # 3: barely learned
        study.add_trial(create_trial(state=state, value=value, intermediate_values=curve, params={"x": i / 10},
                                     distributions=DIST, system_attrs={ATTR_FIDELITY: PROXY},
                                     user_attrs={"last_step": max(curve)}))
    assert [t.number for t in proxy_ranking(study.get_trials(), 1.0)] == [0, 1, 2, 3]


def _finish(study: optuna.Study, run: optuna.trial.FrozenTrial, value: float | None, failed: bool = False) -> None:
    if failed:  # a crash recorded with the worst value (on_failure: worst)
        study._storage.set_trial_user_attr(run._trial_id, "fail_reason", "crash")
    study._storage.set_trial_state_values(run._trial_id, TrialState.COMPLETE, [value if value is not None
                                                                               else float("-inf")])


def test_the_proxy_s_tied_best_settings_run_again_round_by_round_once_and_then_rank_by_their_means(
        tmp_path: Path) -> None:
    """Trials 1 (0.930) and 2 (0.925) are within the resolution (0.01) of each other; 0 (0.5) is not. Round 1 runs the
    two on the first seed (tie_seeds 2 of seeds 1000, 1001, 1002), queued once whoever asks (a twin queued by a second
    driver at once is surplus), round 2 only once round 1 has run and only while they are still tied (means 0.925 and
    0.925); then the promotion ranks them by their means over 3 seeds: 2 (0.925, 0.925, 0.96) before 1 (0.930, 0.92,
    0.90)."""
    space, study = _space(tmp_path, tie_seeds=2), _study(tmp_path, [0.5, 0.930, 0.925, 0.1])
    assert start_ties(study, space, [1000, 1001, 1002]) == [(1, 1000), (2, 1000)]
    assert start_ties(study, space, [1000, 1001, 1002]) == []  # a resume, another driver: round 1 is pending
    assert proxy_ties(study) == {"settings": [1, 2], "seeds": [1000, 1001]}
    runs = [t for t in study.get_trials() if is_tie_run(t)]
    assert all(t.state == TrialState.WAITING and t.system_attrs[ATTR_FIDELITY] == PROXY and t.params ==
               study.trials[t.system_attrs[ATTR_TIE_OF]].params for t in runs)
    study.add_trial(create_trial(state=TrialState.WAITING, params=runs[0].params, distributions=DIST,
                                 system_attrs=dict(runs[0].system_attrs)))
    twin = study.trials[-1]
    assert tie_twin(study, twin) == runs[0].number and tie_twin(study, runs[0]) is None
    study._storage.set_trial_state_values(twin._trial_id, TrialState.FAIL)  # the surplus twin, as the driver ends it
    values = {(1, 1000): 0.92, (2, 1000): 0.925, (1, 1001): 0.90, (2, 1001): 0.96}
    _finish(study, runs[0], values[(1, 1000)])
    assert start_ties(study, space, [1000, 1001, 1002]) == []  # round 1 not over: trial 2's run still waits
    _finish(study, runs[1], values[(2, 1000)])
    assert start_ties(study, space, [1000, 1001, 1002]) == [(1, 1001), (2, 1001)]  # still tied: round 2
    for t in study.get_trials():
        if is_tie_run(t) and t.state == TrialState.WAITING:
            _finish(study, t, values[(t.system_attrs[ATTR_TIE_OF], t.system_attrs[ATTR_TIE_SEED])])
    assert start_ties(study, space, [1000, 1001, 1002]) == []  # tie_seeds rounds run
    ranked = [t.number for t in proxy_ranking(study.get_trials(), 1.0)]
    assert ranked == [2, 1, 0, 3]  # the tie runs are evidence, never ranked themselves
    line = ties_line(study)
    assert line is not None and "trial 2 0.9367 over 3 seed(s), trial 1 0.9167 over 3 seed(s)" in line


def test_a_round_that_separates_the_tie_is_the_last(tmp_path: Path) -> None:
    """Round 1 puts trial 1 0.0275 ahead (means 0.94 and 0.9125 over 2 seeds): more than the resolution, so no round
    2 is queued, whatever tie_seeds allows."""
    space, study = _space(tmp_path, tie_seeds=3), _study(tmp_path, [0.5, 0.930, 0.925, 0.1])
    assert start_ties(study, space, [1000, 1001, 1002]) == [(1, 1000), (2, 1000)]
    for t in study.get_trials():
        if is_tie_run(t):
            _finish(study, t, 0.95 if t.system_attrs[ATTR_TIE_OF] == 1 else 0.90)
    assert start_ties(study, space, [1000, 1001, 1002]) == []
    assert [t.number for t in proxy_ranking(study.get_trials(), 1.0)][:2] == [1, 2]


def test_a_tie_run_that_fails_ranks_its_setting_last_and_a_separated_best_runs_no_tie(tmp_path: Path) -> None:
    """A setting that breaks under another seed (a crash: the worst value) is not the proxy's best whatever its
    tuning-seed value; a proxy whose best is more than the resolution ahead queues no tie run (nor with tie_seeds
    0, nor without a seed to give)."""
    space, study = _space(tmp_path), _study(tmp_path, [0.5, 0.930, 0.925, 0.1])
    assert start_ties(study, space, [7]) == [(1, 7), (2, 7)]
    for t in study.get_trials():
        if is_tie_run(t):
            _finish(study, t, None if t.system_attrs[ATTR_TIE_OF] == 1 else 0.92, failed=t.system_attrs[
                ATTR_TIE_OF] == 1)
    assert [t.number for t in proxy_ranking(study.get_trials(), 1.0)][:2] == [2, 0]
    assert [t.number for t in proxy_ranking(study.get_trials(), 1.0)][-1] == 1
    for values, tie_seeds, seeds in (([0.5, 0.95, 0.925, 0.1], 1, [7]), ([0.5, 0.930, 0.925, 0.1], 0, [7]),
                                     ([0.5, 0.930, 0.925, 0.1], 1, [])):
        d = tmp_path / f"{tie_seeds}-{len(seeds)}-{values[1]}"
        d.mkdir()
        sp, st = _space(d, tie_seeds=tie_seeds), _study(d, values)
        assert start_ties(st, sp, seeds) == [] and proxy_ties(st) == {"settings": [], "seeds": []}
        assert ties_line(st) is None
