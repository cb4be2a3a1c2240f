"""The baseline runs this host keeps (``<studies>/.baselines``) read like any untrusted file (issue 44 items 2-4):
through the real CLI with the fake trainer, a first study keeps its baseline's runs, then each case damages the
store of a copy and a second study's ``confirm`` must reuse only what is intact and its own: anything else is one line
and the run is made again. Never a traceback, never a symlink followed, never a temporary file left. Issue 53 item 10:
a record is only trusted for a metrics file inside the trial directory of the study and trial it names (no link
followed at any level), and, where that study shares the storage being confirmed, for a finished baseline run."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.conftest import PY, cli_env, fake_space, load

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


def run_cli(args: list[str], studies: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, from the directory holding the studies directory (not the repository)."""
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(studies)], cwd=studies.parent,
                          env=cli_env(), capture_output=True, text=True, timeout=300)


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
    assert record["metrics_sha256"] and record["seed"] == 1001
    assert record["metrics"] == "metrics.jsonl" and (_trial_dir(studies, record) / "metrics.jsonl").is_file()
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


def _trial_dir(studies: Path, record: dict[str, Any]) -> Path:
    return studies / record["study"] / "trials" / str(record["trial"])


def _flat_zero(genuine: Path, to: Path) -> Path:
    """A copy of a baseline's metrics file whose objective is 0 at every evaluation (a forged flat curve)."""
    lines = [json.loads(line) for line in genuine.read_text().splitlines()]
    for line in lines:
        if "eval/reward_mean" in line["data"]:
            line["data"]["eval/reward_mean"] = 0.0
    to.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return to


def _forge(file: Path, record: dict[str, Any], metrics: Path, value: float, inter: dict[str, float]) -> None:
    """Point a kept record at ``metrics`` with its true digest and the value it gives: every older check passes."""
    digest = hashlib.sha256(metrics.read_bytes()).hexdigest()
    file.write_text(json.dumps({**record, "metrics": str(metrics), "metrics_sha256": digest, "value": value,
                                "intermediate_values": inter}))


def _one_not_reused(out: str, reused: list[str], said: str) -> None:
    assert len(reused) == 1 and reused[0].startswith("first#"), (reused, out)  # the intact one still is
    line = next((line for line in out.splitlines() if "not reused" in line), out)
    assert said in line and "it runs again" in line, line


def _zero_inter(record: dict[str, Any]) -> dict[str, float]:
    return {k: 0.0 for k in record["intermediate_values"]}


def test_a_kept_run_whose_metrics_file_is_gone_is_not_reused(kept: Path, tmp_path: Path) -> None:
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    metrics = _trial_dir(studies, record) / "metrics.jsonl"
    metrics.unlink()
    out, reused = _confirm(studies)
    _one_not_reused(out, reused, "is gone")


def test_a_forged_record_naming_a_metrics_file_outside_the_study_is_not_reused(kept: Path, tmp_path: Path) -> None:
    """Issue 53 item 10: a flat-0 curve anywhere on the host, with its true sha256, made the search "pay" more."""
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    fake = _flat_zero(_trial_dir(studies, record) / "metrics.jsonl", tmp_path / "fake.jsonl")
    _forge(files[0], record, fake, 0.0, _zero_inter(record))
    out, reused = _confirm(studies)
    _one_not_reused(out, reused, f"its metrics file {fake} is not in study first's trial {record['trial']} directory")
    runs = [t for t in load(studies, "second").trials if t.user_attrs.get("confirm_of") == "baseline"]
    assert len(runs) == 2 and all(t.values[0] > 0.2 for t in runs), [t.values for t in runs]  # it ran again


@pytest.mark.parametrize("linked", ["metrics file", "trial directory"])
def test_a_link_inside_the_trial_directory_is_not_followed(kept: Path, tmp_path: Path, linked: str) -> None:
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    trial_dir = _trial_dir(studies, record)
    if linked == "metrics file":  # the trial's metrics file, a link to a forged one
        fake = _flat_zero(trial_dir / "metrics.jsonl", tmp_path / "fake.jsonl")
        (trial_dir / "metrics.jsonl").unlink()
        (trial_dir / "metrics.jsonl").symlink_to(fake)
    else:  # the trial's directory, a link to a forged copy of it
        elsewhere = tmp_path / "elsewhere"
        shutil.move(trial_dir, elsewhere)
        _flat_zero(elsewhere / "metrics.jsonl", elsewhere / "metrics.jsonl")
        trial_dir.symlink_to(elsewhere, target_is_directory=True)
    _forge(files[0], record, trial_dir / "metrics.jsonl", 0.0, _zero_inter(record))
    out, reused = _confirm(studies)
    _one_not_reused(out, reused, "not followed")


def test_a_search_trial_passed_off_as_a_baseline_run_is_not_reused(kept: Path, tmp_path: Path) -> None:
    """A record naming a trial of the study being confirmed (so in its storage) that is not a finished baseline run
    on that seed: its own metrics file, digest and value are genuine, yet it is no baseline run."""
    studies, files = _copy(kept, tmp_path)
    record = json.loads(files[0].read_text())
    [search] = load(studies, "second").trials
    _forge(files[0], {**record, "study": "second", "trial": search.number},
           studies / "second" / "trials" / str(search.number) / "metrics.jsonl", search.values[0],
           {str(k): v for k, v in search.intermediate_values.items()})
    out, reused = _confirm(studies)
    _one_not_reused(out, reused, "second#0 is not a finished baseline run")


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
