"""The baseline runs a host keeps and the trial files they name (:mod:`hpo.record._kept`), on real files: every level
opened without following a link, a record a regular bounded JSON file written whole or not at all, its fields checked,
its metrics file reused only from its own trial's directory with the sha256 kept and the driver's marker, and a
record that names a run of the storage at hand only when that run is a finished baseline on its seed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_SEED, TRIAL_MARKER
from hpo.record._kept import (
    MAX_KEPT_BYTES,
    KeptRefused,
    checked_record,
    kept_metrics,
    metrics_inside,
    read_kept,
    read_study_file,
    stored_run_problem,
    write_kept,
)

PARTS = (".baselines", "k1")
METRICS = b'{"step": 1, "data": {"eval/reward_mean": 0.5}}\n'


def _record(**changes: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"value": 0.5, "trial": 3, "study": "base", "key": "k1", "seed": 7,
                           "intermediate_values": {"1": 0.5}, "metrics": "metrics.jsonl",
                           "metrics_sha256": hashlib.sha256(METRICS).hexdigest(),
                           "user_attrs": {"last_step": 1, "stop_reason": "x", "secret": "not kept", "flag": True}}
    rec.update(changes)
    return rec


def test_a_record_is_written_whole_and_read_back(tmp_path: Path) -> None:
    assert read_kept(tmp_path, PARTS, "7.json") is None  # nothing kept yet
    write_kept(tmp_path, PARTS, "7.json", _record())
    write_kept(tmp_path, PARTS, "7.json", _record(value=0.75))  # replaced in one step
    assert read_kept(tmp_path, PARTS, "7.json")["value"] == 0.75
    assert os.listdir(tmp_path / ".baselines" / "k1") == ["7.json"]  # no temporary file left
    with pytest.raises(ValueError):
        write_kept(tmp_path, PARTS, "8.json", _record(value=float("nan")))  # never written: NaN is no JSON number
    assert os.listdir(tmp_path / ".baselines" / "k1") == ["7.json"]


def test_a_directory_where_the_record_goes_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / ".baselines" / "k1" / "7.json").mkdir(parents=True)
    with pytest.raises(OSError):
        write_kept(tmp_path, PARTS, "7.json", _record())
    assert os.listdir(tmp_path / ".baselines" / "k1") == ["7.json"]


def test_no_level_is_followed_through_a_link_for_reading_or_writing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "k1").mkdir(parents=True)
    (elsewhere / "k1" / "7.json").write_text(json.dumps(_record()))
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / ".baselines").symlink_to(elsewhere)
    with pytest.raises(KeptRefused, match=r"\.baselines is not a directory of the baseline store \(a symlink or a "
                                          r"file\): not followed$"):
        read_kept(studies, PARTS, "7.json")
    with pytest.raises(KeptRefused):
        write_kept(studies, PARTS, "8.json", _record())
    assert sorted(os.listdir(elsewhere / "k1")) == ["7.json"]
    (studies / ".baselines").unlink()
    (studies / ".baselines" / "k1").mkdir(parents=True)
    (studies / ".baselines" / "k1" / "7.json").symlink_to(elsewhere / "k1" / "7.json")
    with pytest.raises(KeptRefused, match=r"^\.baselines/k1/7.json: a symlink: not followed$"):
        read_kept(studies, PARTS, "7.json")


@pytest.mark.parametrize("kind", ["fifo", "too_big", "nan", "not_json", "bad_name"])
def test_what_is_not_a_small_regular_json_file_is_refused(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / ".baselines" / "k1"
    folder.mkdir(parents=True)
    path, name = folder / "7.json", "7.json"
    if kind == "fifo":
        os.mkfifo(path)  # never blocks
    elif kind == "too_big":
        path.write_text(json.dumps({"pad": "x" * MAX_KEPT_BYTES}))
    elif kind == "nan":
        path.write_text('{"value": NaN}')
    elif kind == "not_json":
        path.write_bytes(b"\xff\xfe")
    else:
        name = ".."
    said = {"fifo": "not a regular file", "too_big": f"over {MAX_KEPT_BYTES} bytes", "nan": "not a kept run (ValueE",
            "not_json": "not a kept run (UnicodeDecodeError)", "bad_name": "'..' is not a file name"}[kind]
    with pytest.raises(KeptRefused) as err:
        read_kept(tmp_path, PARTS, name)
    assert said in str(err.value)


@pytest.mark.parametrize(("changes", "why"), [
    ({"value": "0.5"}, "value '0.5' is not a finite number"),
    ({"value": 1e400 * 0}, "is not a finite number"),
    ({"trial": True}, "trial 'True' is not a trial number"),
    ({"trial": -1}, "trial '-1' is not a trial number"),
    ({"study": "../x"}, "study '../x' is not a study name"),
    ({"seed": 8}, "kept for another experiment or seed"),
    ({"key": "k2"}, "kept for another experiment or seed"),
    ({"intermediate_values": {"x": 1}}, "intermediate value 'x': '1' is not a step and a finite number"),
    ({"intermediate_values": [1]}, "intermediate values are not a mapping of steps"),
    ({"metrics_sha256": "abc"}, "no digest of the metrics file it came from (kept by an older verl-hpo)"),
])
def test_a_record_s_fields_are_each_checked(changes: dict[str, Any], why: str) -> None:
    rec, said = checked_record(_record(**changes), "k1", 7)
    assert rec is None and why in said
    assert checked_record([1], "k1", 7) == (None, "a JSON list, not a kept run")


def test_a_good_record_keeps_only_the_attributes_a_kept_run_holds() -> None:
    rec, said = checked_record(_record(), "k1", 7)
    assert said == "" and rec is not None
    assert rec["intermediate_values"] == {1: 0.5} and rec["user_attrs"] == {"last_step": 1, "stop_reason": "x"}


def _trial_dir(studies: Path, marker: dict[str, Any] | None = None) -> Path:
    trial = studies / "base" / "trials" / "3"
    trial.mkdir(parents=True)
    (trial / "metrics.jsonl").write_bytes(METRICS)
    (trial / TRIAL_MARKER).write_text(json.dumps(marker if marker is not None else {"study": "base", "trial": 3}))
    return trial


def test_the_metrics_file_is_named_inside_its_trial_directory(tmp_path: Path) -> None:
    rec, _ = checked_record(_record(), "k1", 7)
    assert rec is not None
    assert metrics_inside(tmp_path, rec) == (("metrics.jsonl",), "")
    absolute = {**rec, "metrics": str(tmp_path / "base" / "trials" / "3" / "sub" / "m.jsonl")}  # kept by an older one
    assert metrics_inside(tmp_path, absolute) == (("sub", "m.jsonl"), "")
    for elsewhere in ("/tmp/flat.jsonl", "../../other/metrics.jsonl", str(tmp_path / "base" / "trials" / "4" / "m")):
        inside, why = metrics_inside(tmp_path, {**rec, "metrics": elsewhere})
        assert inside == () and why.endswith("is not in study base's trial 3 directory"), elsewhere


def test_the_kept_metrics_are_reused_only_as_kept_from_the_driver_s_own_trial_directory(tmp_path: Path) -> None:
    rec, _ = checked_record(_record(), "k1", 7)
    assert rec is not None
    trial = _trial_dir(tmp_path)
    assert kept_metrics(tmp_path, rec, ("metrics.jsonl",)) == (METRICS, "")
    (trial / "metrics.jsonl").write_bytes(METRICS.replace(b"0.5", b"0.9"))
    assert kept_metrics(tmp_path, rec, ("metrics.jsonl",))[1].endswith("changed since it was kept")
    (trial / "metrics.jsonl").unlink()
    assert kept_metrics(tmp_path, rec, ("metrics.jsonl",))[1].endswith("is gone")
    (trial / "metrics.jsonl").symlink_to(tmp_path / "flat.jsonl")
    (tmp_path / "flat.jsonl").write_bytes(METRICS)  # the true bytes, behind a link: never read
    data, why = kept_metrics(tmp_path, rec, ("metrics.jsonl",))
    assert data is None and "a symlink: not followed" in why


def test_a_trial_directory_the_driver_did_not_make_for_that_trial_is_not_trusted(tmp_path: Path) -> None:
    rec, _ = checked_record(_record(), "k1", 7)
    assert rec is not None
    _trial_dir(tmp_path, marker={"study": "base", "trial": 4})
    data, why = kept_metrics(tmp_path, rec, ("metrics.jsonl",))
    assert data is None and why == f"{tmp_path / 'base' / 'trials' / '3'} is not the directory the driver made for " \
                                   "base#3"


def test_a_trial_file_is_read_without_following_a_link_at_any_level(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "trials" / "0").mkdir(parents=True)
    (real / "trials" / "0" / "m").write_text("x")
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "s").symlink_to(real)
    with pytest.raises(KeptRefused, match="is not a directory"):
        read_study_file(studies, ("s", "trials", "0"), "m")
    assert read_study_file(tmp_path, ("real", "trials", "0"), "m") == b"x"
    assert read_study_file(tmp_path, ("real", "trials", "9"), "m") is None
    with pytest.raises(KeptRefused, match="over 0 bytes"):
        read_study_file(tmp_path, ("real", "trials", "0"), "m", cap=0)


def test_a_named_run_in_the_storage_at_hand_must_be_a_finished_baseline_on_the_seed(tmp_path: Path) -> None:
    rec, _ = checked_record(_record(), "k1", 7)
    assert rec is not None
    assert stored_run_problem(None, rec, 7) == ""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert stored_run_problem(storage, rec, 7) == ""  # study "base" is not in this storage: its files vouch
    study = optuna.create_study(study_name="base", storage=storage, direction="maximize")
    assert stored_run_problem(storage, rec, 7) == "study base has no trial 3"
    dist = {"x": FloatDistribution(0, 1)}
    for i, (value, attrs) in enumerate([(0.1, {}), (0.2, {}), (0.3, {}),
                                        (0.5, {ATTR_BASELINE: True, ATTR_CONFIRM_SEED: 7})]):
        study.add_trial(create_trial(value=value, params={"x": i / 10}, distributions=dist, system_attrs=attrs))
    assert stored_run_problem(storage, rec, 7) == ""
    assert stored_run_problem(storage, rec, 8) == "base#3 is not a finished baseline run on seed 8 with value 0.5"
    forged = {**rec, "trial": 2}  # a search trial passed off as a baseline run
    assert stored_run_problem(storage, forged, 7).startswith("base#2 is not a finished baseline run")
    assert stored_run_problem(storage, {**rec, "value": 0.9}, 7).startswith("base#3 is not")
