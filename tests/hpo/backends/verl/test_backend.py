"""The verl backend as the study loop meets it (``hpo/backends/verl/_backend.py``): a confirmation's held-out data
checked once, before any confirmation run, naming the key and the resolved path."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.backends import backend_of, load_space
from hpo.experiment import SpaceError
from tests.hpo.backends.verl.conftest import CPU_SPACE


def test_a_missing_held_out_file_is_one_line_before_any_confirmation_run(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's confirmation runs validate on ``study.confirm.test_files``: a missing one is said once, naming the key
    and the resolved path, instead of crashing every run in verl's dataset loader."""
    monkeypatch.setenv("HELDOUT_DIR", str(tmp_path))
    shipped = CPU_SPACE
    space = load_space(str(shipped), overrides=["study.confirm.test_files=${oc.env:HELDOUT_DIR}/test.parquet"],
                       check=False)
    with pytest.raises(SpaceError) as err:
        backend_of(space).confirmation.check_heldout(space)
    assert str(err.value).endswith(f"study.confirm.test_files: {tmp_path / 'test.parquet'} does not exist (the "
                                   "held-out data confirmation runs validate on)")
    (tmp_path / "test.parquet").write_bytes(b"PAR1")
    backend_of(space).confirmation.check_heldout(space)  # present: nothing to say
    remote = load_space(str(shipped), overrides=["study.confirm.test_files=hdfs://data/test.parquet"], check=False)
    backend_of(remote).confirmation.check_heldout(remote)  # verl copies remote files itself
