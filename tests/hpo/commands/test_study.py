"""Each study command builds its own typed :class:`~hpo.commands._study.StudyRun` from its flags (issue 55 item 4):
what ``resume``, ``worker`` and ``confirm`` hand to the study run is checked field by field, with nothing run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpo._cli import main
from hpo.commands import _study
from hpo.commands._study import Confirmation, StudyRun, _device_list
from hpo.experiment import SpaceError, StudySpec


@pytest.mark.parametrize(("argv", "want"), [
    (["resume", "--n-trials", "7", "--ray-address", "http://head:8265", "--budget", "3", "--tracking", "wandb",
      "--space", "mine.yaml"],
     StudyRun("s", budget=3.0, tracking=("wandb",), ray_address="http://head:8265", local_space="mine.yaml",
              n_trials=7)),
    (["worker", "--n-jobs", "2", "--devices", "0,1", "--trust-stored-experiment", "--storage", "sqlite:///{db}"],
     StudyRun("s", storage="sqlite:///{db}", trust=True, n_jobs=2, devices="0,1",
              wait_s=StudySpec().storage_retry_s)),
    (["confirm", "--top", "2", "--seeds", "3", "--baseline-runs", "a.jsonl", "b.jsonl:seed=4", "--tracking-optional"],
     StudyRun("s", tracking_optional=True, confirm=Confirmation(2, 3, ("a.jsonl", "b.jsonl:seed=4")))),
    (["confirm"], StudyRun("s", confirm=Confirmation())),
])
def test_each_stored_study_command_builds_its_own_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      argv: list[str], want: StudyRun) -> None:
    studies = tmp_path / "studies"
    studies.mkdir()
    db = studies / "s.db"
    db.touch()  # the study's file is there: the command goes on to the run (replaced here)
    seen: list[StudyRun] = []
    monkeypatch.setattr(_study, "run_study", lambda run, inv: seen.append(run) or 0)
    argv = [a.format(db=db) for a in argv]
    assert main([argv[0], "--study", "s", *argv[1:], "--studies-dir", str(studies)]) == 0
    if want.storage is not None:
        want = dataclasses.replace(want, storage=want.storage.format(db=db))
    assert seen == [want]


def test_a_missing_study_is_refused_before_a_run_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[StudyRun] = []
    monkeypatch.setattr(_study, "run_study", lambda run, inv: seen.append(run) or 0)
    assert main(["resume", "--study", "s", "--studies-dir", str(tmp_path)]) == 2
    assert seen == [] and capsys.readouterr().err.startswith("error: no study 's': ")


@pytest.mark.parametrize("text, ok", [("0,1", True), ("3", True), ("GPU-8f2a3b4c-1d2e-4f5a-9b8c-7d6e5f4a3b2c", True),
                                      ("MIG-GPU-8f2a3b4c/1/0", True), ("0,0", False), ("-1", False), ("0,GPU", False),
                                      ("", False), ("0,,1", False), ("01", False), ("1" * 400, False)])
def test_the_devices_flag_takes_gpu_indices_or_uuids(text: str, ok: bool) -> None:
    if ok:
        assert _device_list(text) == text.split(",")
        return
    with pytest.raises(SpaceError) as err:
        _device_list(text)
    assert str(err.value).startswith(f"--devices {text!r}: ") and "\n" not in str(err.value)
