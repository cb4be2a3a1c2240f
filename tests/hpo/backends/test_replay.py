"""A retry's resume point (``hpo/backends/_replay.py``) reads only what a trial's directory really holds (issue 53,
item 1): the checkpoint walks of TRL (``checkpoint-N/trainer_state.json``) and verl (``global_step_N``) and the
``command.json`` of each attempt, on hand-made trial directories where one file is replaced by a FIFO, a link to
``/dev/zero``, a huge file, a link to a regular file outside, deep nesting or odd numbers. Each such checkpoint is
lost: the walk takes an earlier good one (or none) at once, says so in one line, and never blocks, reads without bound
or raises."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hpo.backends import trl
from hpo.backends._replay import ResumePoint, lost_checkpoints
from hpo.backends.verl import _resume as verl

HUGE = 8 << 30  # a sparse file: nothing of it may be read


def _trl_checkpoint(trials: Path, number: int, step: int) -> Path:
    d = trials / str(number) / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return d / "trainer_state.json"


def _verl_checkpoint(trials: Path, number: int, step: int) -> Path:
    d = trials / str(number) / "checkpoints" / f"global_step_{step}"
    (d / "actor").mkdir(parents=True)
    (d / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"m")
    (d / "data.pt").write_bytes(b"d")
    return d / "data.pt"


LAYOUTS: dict[str, tuple[Callable[[Path, int, int], Path], Callable[[Path, list[int]], ResumePoint | None], str]] = {
    "trl": (_trl_checkpoint, trl.resume_point, "resume_from_checkpoint="),
    "verl": (_verl_checkpoint, verl.resume_point, "trainer.resume_from_path="),
}


def _chain(trials: Path, layout: str) -> dict[str, Path]:
    """Trial 0 saved steps 2 and 4; its retry, trial 1, started from step 4 and saved step 6. Returns the files."""
    make, _, key = LAYOUTS[layout]
    files = {"0/2": make(trials, 0, 2), "0/4": make(trials, 0, 4), "1/6": make(trials, 1, 6)}
    start = files["0/4"].parent
    for n, argv in ((0, ["train"]), (1, ["train", f"{key}{start}"])):
        (trials / str(n) / "command.json").write_text(json.dumps({"argv": argv}))
        files[f"{n}/command.json"] = trials / str(n) / "command.json"
    return files


def _walk(trials: Path, layout: str) -> tuple[int | None, list[str]]:
    with lost_checkpoints() as notes:
        point = LAYOUTS[layout][1](trials, [0, 1])
    return (None if point is None else point.step), notes


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(HUGE)


def _linked_outside(path: Path) -> None:
    """A link to a regular file that holds exactly what was there: still not followed."""
    outside = path.parent.parent.parent.parent / f"outside-{path.parent.name}-{path.name}"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)


def _deep(path: Path) -> None:
    path.write_text("[" * 200_000)


ATTACKS = {"a FIFO": _fifo, "a link to /dev/zero": _dev_zero, "a huge file": _huge,
           "a link to a file outside": _linked_outside}
SAID = {"a FIFO": "is a FIFO", "a link to /dev/zero": "is a symbolic link", "a huge file": "bytes; at most",
        "a link to a file outside": "is a symbolic link"}


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("layout", "attack"), [(layout, attack) for layout in LAYOUTS for attack in ATTACKS
                                                if (layout, attack) != ("verl", "a huge file")])  # verl's to load
def test_a_replaced_file_of_the_newest_checkpoint_loses_that_checkpoint_only(tmp_path: Path, layout: str,
                                                                               attack: str) -> None:
    """The newest checkpoint's file (trainer_state.json, data.pt): the retry takes the previous one of that chain."""
    files = _chain(tmp_path, layout)
    ATTACKS[attack](files["1/6"])
    step, notes = _walk(tmp_path, layout)
    assert step == 4
    assert len(notes) == 1 and "\n" not in notes[0], notes
    assert str(files["1/6"].parent) in notes[0] and SAID[attack] in notes[0] and "continues from" in notes[0]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("attack", [*ATTACKS, "deep nesting", "no argv"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_replaced_command_json_loses_the_checkpoints_it_led_to(tmp_path: Path, layout: str, attack: str) -> None:
    """The retry's own command.json: where its step-6 checkpoint came from is unknown, so the walk falls back to the
    first attempt's step 4 (not the retry's step 6 with half a curve)."""
    files = _chain(tmp_path, layout)
    junk = {"deep nesting": _deep, "no argv": lambda p: p.write_text('{"argv": 7}')}
    {**ATTACKS, **junk}[attack](files["1/command.json"])
    step, notes = _walk(tmp_path, layout)
    assert step == 4
    assert len(notes) == 1 and str(files["1/command.json"]) in notes[0], notes


@pytest.mark.timeout(20)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_checkpoint_lost_starts_afresh_in_one_line(tmp_path: Path, layout: str) -> None:
    files = _chain(tmp_path, layout)
    _fifo(files["0/command.json"])  # the first attempt's start is unknown: nothing of the chain can be placed
    step, notes = _walk(tmp_path, layout)
    assert step is None
    assert len(notes) == 1 and notes[0].endswith("the retry starts afresh") and "is a FIFO" in notes[0]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_replaced_metrics_file_of_the_lineage_is_not_replayed(tmp_path: Path, layout: str) -> None:
    """The first attempt's metrics file (replayed into the retry's curve) as a FIFO: its checkpoints are lost, not a
    driver error when the curve is read."""
    _chain(tmp_path, layout)
    os.mkfifo(tmp_path / "0" / "metrics.jsonl")
    step, notes = _walk(tmp_path, layout)
    assert step is None and len(notes) == 1 and "metrics.jsonl: is a FIFO" in notes[0]
    (tmp_path / "0" / "metrics.jsonl").unlink()
    (tmp_path / "0" / "metrics.jsonl").symlink_to("/dev/zero")
    point = LAYOUTS[layout][1](tmp_path, [0, 1])
    assert point is None


@pytest.mark.timeout(20)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_checkpoint_directory_that_is_a_link_is_not_a_checkpoint(tmp_path: Path, layout: str) -> None:
    files = _chain(tmp_path, layout)
    real = tmp_path / "elsewhere"
    files["1/6"].parent.rename(real)
    files["1/6"].parent.symlink_to(real, target_is_directory=True)
    step, notes = _walk(tmp_path, layout)
    assert step == 4 and len(notes) == 1 and "is a symbolic link" in notes[0]


@pytest.mark.parametrize("name", ["{}" + "9" * 230, "{}007", "{}\u0664", "{}-4", "{}4\n", "{}4 ", "{}99999999999"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_odd_step_names_are_not_checkpoints(tmp_path: Path, layout: str, name: str) -> None:
    """A step of 230 digits, a leading zero, a non-ASCII digit, a sign, trailing junk, past 2^31: not a checkpoint of
    the trainer (before: ``int()`` took most of them, one as a step of 10^230)."""
    make, resume_point, _ = LAYOUTS[layout]
    make(tmp_path, 0, 2)
    prefix = "checkpoint-" if layout == "trl" else "global_step_"
    odd = tmp_path / "0" / "checkpoints" / name.format(prefix)
    (tmp_path / "0" / "checkpoints" / f"{prefix}2").rename(odd)
    make(tmp_path, 0, 2)
    if layout == "trl":  # the copy says its own step: only the name is odd
        (odd / "trainer_state.json").write_text(json.dumps({"global_step": int(name[2:]) if name[2:].isdigit()
                                                            else 4}))
    point = resume_point(tmp_path, [0])
    assert point is not None and point.step == 2


@pytest.mark.timeout(20)
@pytest.mark.parametrize("global_step", ["1e400", "true", "\"6\"", "-6", "6.0", "7", "null", "[6]"])
def test_trl_trainer_state_with_odd_numbers_loses_the_checkpoint(tmp_path: Path, global_step: str) -> None:
    files = _chain(tmp_path, "trl")
    files["1/6"].write_text(f'{{"global_step": {global_step}}}')
    step, notes = _walk(tmp_path, "trl")
    assert step == 4 and len(notes) == 1 and "global_step" in notes[0]


@pytest.mark.timeout(20)
def test_trl_trainer_state_cut_short_is_incomplete_without_a_word(tmp_path: Path) -> None:
    """A save cut short (the Trainer killed mid-write) or nested too deep: not complete, as before; no note."""
    files = _chain(tmp_path, "trl")
    files["1/6"].write_text('{"global_step": 6, "log_hi')
    assert _walk(tmp_path, "trl") == (4, [])
    _deep(files["1/6"])
    assert _walk(tmp_path, "trl") == (4, [])


def test_an_intact_chain_is_walked_as_before(tmp_path: Path) -> None:
    for layout in LAYOUTS:
        files = _chain(tmp_path / layout, layout)
        with lost_checkpoints() as notes:
            point = LAYOUTS[layout][1](tmp_path / layout, [0, 1])
        assert point is not None and point.step == 6 and point.starts == (None, 4) and notes == []
        assert point.checkpoint == files["1/6"].parent


@pytest.mark.timeout(20)
@pytest.mark.parametrize("world", ["999999999", "9" * 200])
def test_verl_shard_names_with_a_huge_world_size_are_not_a_checkpoint(tmp_path: Path, world: str) -> None:
    """``model_world_size_<W>_rank_0.pt``: W ranks are never enumerated from a name (before: a set of 10^9 or
    10^200 ranks was built, until MemoryError)."""
    files = _chain(tmp_path, "verl")
    actor = files["1/6"].parent / "actor"
    (actor / "model_world_size_1_rank_0.pt").rename(actor / f"model_world_size_{world}_rank_0.pt")
    assert _walk(tmp_path, "verl") == (4, [])
