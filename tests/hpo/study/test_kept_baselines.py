"""The baseline runs this host keeps (``<studies>/.baselines``) read like any untrusted file (issue 44 items 2-4):
through the real CLI with the fake trainer, a first study keeps its baseline's runs, then each case damages the
store of a copy and a second study's ``confirm`` must reuse only what is intact and its own: anything else is one line
and the run is made again. Never a traceback, never a symlink followed, never a temporary file left."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hpo.conftest import fake_space, load, run_cli

OVERRIDES = {"trainer.total_training_steps": 4, "trainer.test_freq": 2, "fake.step_s": 0.01, "trainer.seed": 1000,
             "fake.seed_noise": 0.1}
STUDY = {"n_trials": 1, "pruner": {"type": "none"}, "confirm": {"top_k": 1, "seeds": 2},
         "baseline": {"fake.x": 1.0}}


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A studies directory with study ``first`` confirmed (its baseline's runs kept) and ``second`` searched."""
    root = tmp_path_factory.mktemp("kept")
    studies = root / "studies"
    for name in ("first", "second"):
        space = fake_space(root, name=name, overrides=OVERRIDES, study=STUDY)
        assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    assert run_cli(["confirm", "--study", "first"], studies).returncode == 0
    assert len(list((studies / ".baselines").glob("*/*.json"))) == 2
    return studies


def _copy(kept: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    studies = tmp_path / "studies"
    shutil.copytree(kept, studies, symlinks=True)
    return studies, sorted((studies / ".baselines").glob("*/*.json"))


def _confirm(studies: Path) -> tuple[str, list[str]]:
    res = run_cli(["confirm", "--study", "second"], studies)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    reused = [t.user_attrs["baseline_reused"] for t in load(studies, "second").trials
              if t.user_attrs.get("baseline_reused")]
    return res.stdout + res.stderr, reused


def test_intact_kept_runs_are_reused_with_their_study(kept: Path, tmp_path: Path) -> None:
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    assert record["metrics_sha256"] and Path(record["metrics"]).is_file() and record["seed"] == 1001
    out, reused = _confirm(studies)
    assert len(reused) == 2 and all(r.startswith("first#") for r in reused)
    assert "2 of the baseline's 2 run(s) reused" in out and "(study#trial: first#" in out


@pytest.mark.parametrize("damage, said", [
    (lambda r: {**r, "value": r["value"] + 0.5}, "is not its metrics file's"),
    (lambda r: '{"value": ' + repr(r["value"]) + ', "trial": 1e400}', "trial 'inf' is not a trial number"),
    (lambda r: {**r, "value": 10 ** 400}, "is not a finite number"),
    (lambda r: {**r, "value": True}, "value 'True' is not a finite number"),
    (lambda r: [], "a JSON list, not a kept run"),
    (lambda r: {**r, "seed": 7}, "kept for another experiment or seed"),
])
def test_a_damaged_kept_run_is_said_and_run_again(kept: Path, tmp_path: Path, damage: object, said: str) -> None:
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    new = damage(record)  # type: ignore[operator]
    files[0].write_text(new if isinstance(new, str) else json.dumps(new))
    out, reused = _confirm(studies)
    assert len(reused) == 1, reused  # the intact one still is
    line = next(line for line in out.splitlines() if "not reused" in line)
    assert said in line and files[0].name in line and "it runs again" in line, line


def test_a_kept_run_whose_metrics_file_is_gone_is_not_reused(kept: Path, tmp_path: Path) -> None:
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    moved = tmp_path / "metrics.jsonl"
    shutil.copy(record["metrics"], moved)
    files[0].write_text(json.dumps({**record, "metrics": str(moved)}))
    moved.unlink()
    out, reused = _confirm(studies)
    assert len(reused) == 1 and f"its metrics file {moved} is gone" in out, out


def test_a_symlinked_store_is_never_followed(kept: Path, tmp_path: Path) -> None:
    studies, _ = _copy(kept, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(studies / ".baselines", elsewhere)
    (studies / ".baselines").symlink_to(elsewhere, target_is_directory=True)
    before = sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*"))
    out, reused = _confirm(studies)
    assert reused == [] and "not a directory of the baseline store (a symlink or a file): not followed" in out
    assert sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*")) == before  # nothing written through it


def test_a_directory_where_a_kept_file_goes_leaves_no_temporary_file(kept: Path, tmp_path: Path) -> None:
    studies, files = _copy(kept, tmp_path)
    shutil.rmtree(studies / ".baselines")
    key_dir = files[0].parent
    key_dir.mkdir(parents=True)
    (key_dir / "1001.json").mkdir()  # where the first kept run would be written
    out, reused = _confirm(studies)
    assert reused == [] and "baseline run" in out and "not kept for later studies" in out, out
    assert sorted(p.name for p in key_dir.iterdir()) == ["1001.json", "1002.json"]  # no .tmp left behind
    assert (key_dir / "1001.json").is_dir()
