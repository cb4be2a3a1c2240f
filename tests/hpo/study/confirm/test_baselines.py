"""The baseline's runs made elsewhere (``hpo/study/_confirm/_baselines.py``): a user's own run imported once per seed
(the claim that goes first wins), a run's value recomputed from its metrics file, and a finished baseline run kept on
this host for later studies of the same experiment, reused only while its metrics file is its trial's own and gives
its value (each refusal one line, and the run is made again). Real files in a studies directory, real Optuna
studies."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.trial import TrialState, create_trial

from hpo.backends import load_space
from hpo.experiment import Space
from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, ATTR_RESULT
from hpo.study._confirm import (
    add_imported_baseline,
    baseline_cache,
    baseline_key,
    baseline_runs_on,
    cached_baseline,
    remember_baseline,
    value_of_metrics,
)
from hpo.study._trial_files import fresh_trial_dir
from tests.hpo.conftest import fake_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space_of(tmp_path: Path, **study: object) -> Space:
    return load_space(str(fake_space(tmp_path, study={"baseline": {"fake.x": 0.9}, **study})), check=False)


def curve(*values: float) -> bytes:
    return "".join(json.dumps({"step": 2 * i, "data": {"eval/reward_mean": v}}) + "\n"
                   for i, v in enumerate(values)).encode()


def test_a_user_s_run_is_imported_once_per_seed() -> None:
    study = optuna.create_study(direction="maximize")
    first = add_imported_baseline(study, 1000, 0.7, {0: 0.2, 10: 0.7}, {"baseline_imported": "run-a"})
    assert first is not None and first.state == TrialState.COMPLETE and first.value == 0.7
    assert first.system_attrs[ATTR_RESULT] == {"state": "COMPLETE", "values": [0.7]}  # finished, whoever dies now
    assert first.system_attrs[ATTR_BASELINE] and first.system_attrs[ATTR_CONFIRM_SEED] == 1000
    assert add_imported_baseline(study, 1000, 0.6, {}, {"baseline_imported": "run-b"}) is None  # the seed has one
    surplus = study.trials[1]
    assert surplus.state == TrialState.FAIL and surplus.user_attrs["stop_reason"] == "surplus"
    assert [t.number for t in baseline_runs_on(study, 1000)] == [0] and baseline_runs_on(study, 1001) == []


def test_a_run_s_value_is_recomputed_from_its_metrics_file(tmp_path: Path) -> None:
    space = space_of(tmp_path)
    data = curve(0.1, 0.4) + b"not json\n" + json.dumps({"step": 2, "data": {"eval/reward_mean": 0.9}}).encode() \
        + b"\n" + json.dumps({"step": 4, "data": {"eval/reward_mean": float("nan")}}).encode()
    assert value_of_metrics(space, data) == 0.4  # step 2's first line; a NaN evaluation and a bad line skipped
    assert value_of_metrics(space, b"") is None and value_of_metrics(space, b'{"step": 0, "data": {}}\n') is None


def _finished_baseline(studies: Path, seed: int, values: tuple[float, ...]) -> optuna.trial.FrozenTrial:
    """Trial 3 of study ``s``: a finished baseline run on ``seed`` whose metrics file (in its trial directory, the
    driver's layout) logged ``values``."""
    trial_dir = fresh_trial_dir(studies / "s" / "trials", "s", 3, {"host": "here"})  # as the driver makes it
    (trial_dir / "metrics.jsonl").write_bytes(curve(*values))
    run = create_trial(value=values[-1], params={}, distributions={}, user_attrs={"trial_dir": str(trial_dir)},
                       intermediate_values={2 * i: v for i, v in enumerate(values)},
                       system_attrs={ATTR_CONFIRM_OF: -1, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True})
    run.number = 3
    return run


def test_a_kept_run_is_reused_while_its_metrics_file_gives_its_value(tmp_path: Path) -> None:
    space, studies = space_of(tmp_path), tmp_path / "studies"
    cache, key = baseline_cache(studies), baseline_key(space)
    assert key is not None and key == baseline_key(space_of(tmp_path))  # the same experiment: the same key
    assert key != baseline_key(space_of(tmp_path, baseline={"fake.x": 0.8}))  # another baseline: another key
    run = _finished_baseline(studies, 1000, (0.2, 0.7))
    assert remember_baseline(cache, space, "s", run)
    said: list[str] = []
    kept = cached_baseline(cache, key, 1000, space, said.append)
    assert kept is not None and kept["value"] == 0.7 and said == [], said
    assert kept["user_attrs"]["baseline_reused"] == "s#3" and kept["user_attrs"]["confirm_seed"] == 1000
    assert cached_baseline(cache, key, 1001, space, said.append) is None and said == []  # none kept on that seed
    (studies / "s" / "trials" / "3" / "metrics.jsonl").write_bytes(curve(0.2, 0.99))  # changed since
    assert cached_baseline(cache, key, 1000, space, said.append) is None
    (line,) = said
    assert line.startswith(f"kept baseline run .baselines/{key}/1000.json (from s#3) not reused: ") and \
        line.endswith("; it runs again"), line
