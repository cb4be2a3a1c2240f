"""The user's own runs as the baseline (issue 51 item 5): ``confirm --baseline-runs PATH[:seed=N] ...`` imports runs
the user already made of ``study.baseline`` (verl's file-logger JSONL, a bare file or a run directory with a record of
its overrides) as the baseline's runs of the confirmation, after checking they are the study's experiment; a fresh host
then runs none of them. Through the real CLI from a directory outside the repository, real SQLite, the fake trainer run
directly by the "user" with the baseline's overrides."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hpo.study import open_storage
from hpo.study._confirm import add_imported_baseline, baseline_confirmed, baseline_run
from tests.hpo.conftest import FAKE_TRAINER, PY, cli_env, fake_space, load

STEPS = 4
STUDY = {"n_trials": 2, "pruner": {"type": "none"}, "confirm": {"top_k": 1, "seeds": 2},
         "baseline": {"fake.x": 1.0}}
SEEDS = (1001, 1002)  # the confirmation's seeds (seed_base 1000 is the search's)


def overrides(root: Path) -> dict[str, Any]:
    return {"trainer.total_training_steps": STEPS, "trainer.test_freq": 2, "fake.step_s": 0.01,
            "trainer.seed": 1000, "fake.seed_noise": 0.1, "fake.log_file": str(root / "launched.jsonl")}


def run_cli(args: list[str], studies: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, from the directory holding the studies directory (not the repository)."""
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(studies)], cwd=studies.parent,
                          env=cli_env(), capture_output=True, text=True, timeout=300)


def user_run(root: Path, where: Path, seed: int, **changed: Any) -> Path:
    """What the user ran before any study: the trainer with the experiment's overrides and the baseline's, on
    ``seed`` (``changed``: what their run set otherwise), its metrics at ``where``; returns ``where``."""
    where.parent.mkdir(parents=True, exist_ok=True)
    keys = {**overrides(root), **STUDY["baseline"], "trainer.seed": seed, **changed}  # type: ignore[dict-item]
    argv = [f"{k}={v}" for k, v in keys.items()]
    subprocess.run([PY, str(FAKE_TRAINER), "train", "--config", "tiny_arith", "--metrics-file", str(where), *argv],
                   cwd=root, check=True, timeout=60)
    return where


def hydra_dir(root: Path, home: Path, name: str, seed: int, **changed: Any) -> Path:
    """A run directory as verl (hydra) leaves it: ``.hydra/overrides.yaml`` beside the file logger's JSONL."""
    run = home / "runs" / name
    user_run(root, run / "metrics.jsonl", seed, **changed)
    keys = {**overrides(root), **STUDY["baseline"], "trainer.seed": seed, **changed}  # type: ignore[dict-item]
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{k}={v}" for k, v in keys.items()]))
    return run


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A studies directory holding study ``s``, searched (nothing confirmed, no baseline run kept on this host)."""
    root = tmp_path_factory.mktemp("searched")
    space = fake_space(root, name="s", overrides=overrides(root), study=STUDY)
    res = run_cli(["search", "--space", str(space)], root / "studies")
    assert res.returncode == 0, res.stderr
    return root


def copy(searched: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(the searched root, whose launch log every run of its experiment appends to; a copy of its studies dir in
    ``tmp_path``, which a test may change)."""
    shutil.copytree(searched / "studies", tmp_path / "studies")
    return searched, tmp_path / "studies"


def launched(root: Path) -> list[dict[str, Any]]:
    log = root / "launched.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def baseline_runs(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if t.system_attrs.get("hpo:baseline")]


def test_the_users_runs_are_the_baseline_and_none_runs_again(searched: Path, tmp_path: Path) -> None:
    root, studies = copy(searched, tmp_path)
    bare = user_run(root, tmp_path / "logs" / "proj" / "baseline-1001.jsonl", 1001)  # verl's file logger: a file
    run_dir = hydra_dir(root, tmp_path, "b1002", 1002)  # a run dir: its seed read from the record
    before = launched(root)
    res = run_cli(["confirm", "--study", "s", "--baseline-runs", f"{bare}:seed=1001", str(run_dir)], studies)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    new = launched(root)[len(before):]
    assert len(new) == 2 and all(r["x"] != 1.0 for r in new), new  # the top trial's 2 seeds; no baseline run
    study = load(studies, "s")
    base = baseline_runs(study)
    assert sorted(t.system_attrs["hpo:confirm_seed"] for t in base) == list(SEEDS)
    assert all(t.state == TrialState.COMPLETE for t in base)
    by_seed = {t.system_attrs["hpo:confirm_seed"]: t for t in base}
    assert by_seed[1001].user_attrs["baseline_imported"] == str(bare)
    assert by_seed[1002].user_attrs["baseline_imported"] == str(run_dir / "metrics.jsonl")
    for seed, t in by_seed.items():  # the objective of the file's last evaluation (aggregate: last), its curve
        lines = [json.loads(x) for x in Path(t.user_attrs["baseline_imported"]).read_text().splitlines()]
        evals = {x["step"]: x["data"]["eval/reward_mean"] for x in lines if "eval/reward_mean" in x["data"]}
        assert t.value == pytest.approx(evals[STEPS]) and t.intermediate_values == pytest.approx(evals)
        assert t.user_attrs["confirm_seed"] == seed and t.user_attrs["last_step"] == STEPS
    assert "imported" in res.stdout + res.stderr
    best = run_cli(["best", "--study", "s"], studies)
    assert best.returncode == 0, best.stderr
    line = next((x for x in (best.stdout + best.stderr).splitlines() if "over the baseline" in x), best.stderr)
    assert "improvement of trial" in line and "on seeds 1001, 1002" in line, line
    mean = sum(float(t.values[0]) for t in base) / 2
    assert f"mean {mean:.4g}" in line, line


def test_the_same_file_twice_is_imported_once(searched: Path, tmp_path: Path) -> None:
    root, studies = copy(searched, tmp_path)
    run = user_run(root, tmp_path / "r.jsonl", 1001)
    spec = f"{run}:seed=1001"
    res = run_cli(["confirm", "--study", "s", "--baseline-runs", spec, spec], studies)
    assert res.returncode == 0, res.stderr
    assert len([t for t in baseline_runs(load(studies, "s")) if t.user_attrs.get("baseline_imported")]) == 1
    again = run_cli(["confirm", "--study", "s", "--baseline-runs", spec], studies)
    assert again.returncode == 0, again.stderr
    assert "already imported" in again.stdout + again.stderr
    study = load(studies, "s")
    assert len([t for t in baseline_runs(study) if t.user_attrs.get("baseline_imported")]) == 1
    assert all(t.state != TrialState.RUNNING for t in study.trials)


def _other_steps(root: Path, home: Path) -> str:
    return str(hydra_dir(root, home, "long", 1001, **{"trainer.total_training_steps": 6}))


def _no_objective(root: Path, home: Path) -> str:
    run = user_run(root, home / "noobj.jsonl", 1001)
    lines = [json.loads(x) for x in run.read_text().splitlines()]
    run.write_text("".join(json.dumps({**x, "data": {k: v for k, v in x["data"].items() if k != "eval/reward_mean"}})
                           + "\n" for x in lines))
    return f"{run}:seed=1001"


def _bare_steps(root: Path, home: Path) -> str:
    return f"{user_run(root, home / 'short.jsonl', 1001, **{'trainer.total_training_steps': 2})}:seed=1001"


def _unknown_seed(root: Path, home: Path) -> str:
    return f"{user_run(root, home / 'seed7.jsonl', 7)}:seed=7"


def _no_seed(root: Path, home: Path) -> str:
    return str(user_run(root, home / "noseed.jsonl", 1001))


def _other_key(root: Path, home: Path) -> str:
    return str(hydra_dir(root, home, "lr", 1001, **{"fake.x": 0.5}))


@pytest.mark.parametrize("make, said", [
    (_other_steps, "trainer.total_training_steps 6, the study runs 4"),
    (_bare_steps, "its last step is 2, the study runs 4 steps"),
    (_no_objective, "eval/reward_mean"),
    (_unknown_seed, "seed 7 is not one of the confirmation's seeds (1001, 1002)"),
    (_no_seed, "no seed"),
    (_other_key, "fake.x 0.5, the study runs 1.0"),
], ids=["record-steps", "file-steps", "objective", "seed", "no-seed", "key"])
def test_a_run_of_another_experiment_is_one_line_and_nothing_is_imported(searched: Path, tmp_path: Path,
                                                                            make: Any, said: str) -> None:
    root, studies = copy(searched, tmp_path)
    good = user_run(root, tmp_path / "good.jsonl", 1002)
    spec = make(root, tmp_path)
    before, trials = launched(root), len(load(studies, "s").trials)
    res = run_cli(["confirm", "--study", "s", "--baseline-runs", f"{good}:seed=1002", spec], studies)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"error: --baseline-runs {spec.split(':seed=')[0]}") and said in lines[0], lines[0]
    assert len(load(studies, "s").trials) == trials and launched(root) == before  # nothing imported, nothing ran


# ----------------------------------------------------------------------------- several drivers importing at once
PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def _storage_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'at-once.db'}"
    up = importlib.util.find_spec("psycopg2") is not None
    if up:
        try:
            socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
        except OSError:
            up = False
    if not up:
        pytest.skip("psycopg2 or PostgreSQL on port 5432 is not available")
    return PG_URL


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_drivers_importing_one_run_at_once_add_it_once(kind: str, tmp_path: Path) -> None:
    """Two drivers that both found the seed free (confirm's check) add the run once: a claim that finds another of
    the seed finished, or running with a lower number (a driver mid-import), is surplus."""
    url, name = _storage_url(kind, tmp_path), f"hpo-import-{uuid.uuid4().hex[:10]}"
    first = optuna.create_study(study_name=name, storage=open_storage(url), direction="maximize")
    try:
        second = optuna.load_study(study_name=name, storage=open_storage(url))
        attrs = {"baseline_imported": "/runs/r.jsonl", "baseline_imported_sha256": "ab" * 32}
        curve = {0: 0.1, 4: 0.5}
        mid = second._storage.create_new_trial(second._study_id, template_trial=baseline_run(1001, curve, attrs))
        assert add_imported_baseline(first, 1001, 0.5, curve, attrs) is None  # the other driver's claim goes first
        done = add_imported_baseline(second, 1002, 0.6, curve, attrs)  # another seed: its own run
        assert done is not None and done.state == TrialState.COMPLETE and done.value == 0.6
        second._storage.set_trial_state_values(mid, TrialState.COMPLETE, [0.5])  # the other driver finishes its claim
        assert add_imported_baseline(first, 1001, 0.5, curve, attrs) is None  # finished: surplus again
        trials = optuna.load_study(study_name=name, storage=open_storage(url)).trials
        assert sorted((t.system_attrs["hpo:confirm_seed"], t.state.name) for t in trials) == [
            (1001, "COMPLETE"), (1001, "FAIL"), (1001, "FAIL"), (1002, "COMPLETE")]
        assert all(t.user_attrs.get("stop_reason") == "surplus" for t in trials if t.state == TrialState.FAIL)
        base = baseline_confirmed(first)
        assert base is not None and base.seeds == (1001, 1002) and base.values == (0.5, 0.6)
    finally:
        optuna.delete_study(study_name=name, storage=open_storage(url))
