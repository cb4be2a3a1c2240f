"""The study run that ``search``, ``resume``, ``worker`` and ``confirm`` share (``hpo/commands/_study.py``): the
``--devices`` flag takes GPU indices or UUIDs, each once, and nothing else."""

from __future__ import annotations

import pytest

from hpo.commands._study import _device_list
from hpo.experiment import SpaceError


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
