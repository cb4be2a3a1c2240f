"""The Latin-hypercube start of TPE and GP (hpo/samplers/_startup.py): on one study, across a resume, and with two
drivers at once on the real PostgreSQL server (the design is shared by trial number, not drawn per driver)."""

from __future__ import annotations

import math
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.backends import load_space
from hpo.experiment._space import Param, SamplerSpec
from hpo.samplers._startup import LatinStartSampler
from hpo.storages._storage import open_storage
from hpo.study._optuna import load_stored, make_sampler, open_study
from hpo.study._trial import _suggest
from tests.hpo.conftest import fake_space, run_cli
from tests.hpo.study.test_distributed import PG_URL, _need, start, wait_for

N = 4


def stratum(p: Param, v: float, n: int) -> int:
    """Which of ``n`` equal strata of ``p``'s range (in log space for a log parameter) holds ``v``."""
    assert p.low is not None and p.high is not None
    lo, hi, x = (math.log(p.low), math.log(p.high), math.log(v)) if p.log else (p.low, p.high, v)
    return min(n - 1, int((x - lo) / (hi - lo) * n))


def one_per_stratum(params: tuple[Param, ...], points: list[dict[str, Any]]) -> bool:
    return all(sorted(stratum(p, pt[p.name], len(points)) for pt in points) == list(range(len(points)))
               for p in params)


def ask(study: optuna.Study, params: tuple[Param, ...], n: int) -> list[dict[str, Any]]:
    """``n`` trials suggested the way the driver does (``_suggest`` per parameter), each failed at once."""
    out = []
    for _ in range(n):
        t = study.ask()
        out.append({p.name: _suggest(t, p) for p in params})
        study.tell(t, state=optuna.trial.TrialState.FAIL)
    return out


@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_the_start_up_trials_are_the_seeded_latin_hypercube(tmp_path: Path, sampler: str) -> None:
    space = load_space("kl_lr_clip", [f"study.sampler.type={sampler}"])
    study = open_study(space, "s", f"sqlite:///{tmp_path / 's.db'}")
    got = ask(study, space.params, N + 2)
    design = LatinStartSampler(optuna.samplers.RandomSampler(), space.params, N, space.study.sampler.seed).design
    assert got[:N] == design
    assert one_per_stratum(space.params, got[:N])
    assert got[N] not in design and got[N + 1] not in design  # past the design: the model sampler's


def test_the_design_holds_every_stratum_where_independent_draws_clump() -> None:
    """Over 100 base seeds every design covers each parameter's quarters; Optuna's own random start-up (the
    ``random`` setting) leaves a quarter empty in most of them."""
    space = load_space("kl_lr_clip")
    spread = clumped = 0
    for seed in range(100):
        s = SamplerSpec(seed=seed)
        spread += one_per_stratum(space.params, LatinStartSampler(optuna.samplers.RandomSampler(), space.params,
                                                                  N, s.seed).design)
        study = optuna.create_study(direction="maximize", sampler=make_sampler(
            SamplerSpec(seed=seed, startup="random"), 0, params=space.params))
        clumped += not one_per_stratum(space.params, ask(study, space.params, N))
    assert spread == 100
    assert clumped > 80


def test_random_startup_and_the_random_sampler_are_optunas_own() -> None:
    params = load_space("kl_lr_clip").params
    assert isinstance(make_sampler(SamplerSpec(startup="random"), 0, params=params), optuna.samplers.TPESampler)
    assert isinstance(make_sampler(SamplerSpec(type="random"), 0, params=params), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler(SamplerSpec(), 0, params=params), LatinStartSampler)


def test_a_resumed_study_continues_the_same_design(tmp_path: Path) -> None:
    space = load_space("kl_lr_clip")
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = ask(open_study(space, "s", url), space.params, 2)
    _, resumed = load_stored("s", url, None)  # resume/worker: reseeded by the trials there, joining
    rest = ask(resumed, space.params, 2)
    design = LatinStartSampler(optuna.samplers.RandomSampler(), space.params, N, space.study.sampler.seed).design
    assert first + rest == design


@pytest.fixture
def pg_study() -> Iterator[str]:
    name = f"hpo-startup-{uuid.uuid4().hex[:10]}"
    yield name
    try:
        optuna.delete_study(study_name=name, storage=open_storage(PG_URL))
    except Exception:  # noqa: BLE001 - best-effort cleanup of a shared server
        pass


def test_two_drivers_at_once_share_one_design(tmp_path: Path, pg_study: str) -> None:
    """Two `search` drivers started together on one PostgreSQL study: the four start-up trials, whichever driver
    ran each, are the design's four points (independent per-driver draws would repeat strata)."""
    _need(PG_URL)
    gate = tmp_path / "gate"
    gate.touch()  # every trial waits at step 1 while it exists: both drivers are seen holding a trial
    space_file = fake_space(tmp_path, params={
        "x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0},
        "tox": {"key": "fake.tox", "type": "float", "low": 0.01, "high": 1.0, "log": True}},
        overrides={"fake.gate_at": 1, "fake.gate_file": str(gate)},
        study={"n_trials": 6, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 30,
               "sampler": {"type": "tpe", "seed": 3, "n_startup_trials": N}})
    studies = tmp_path / "studies"
    args = ["search", "--space", str(space_file), "--study", pg_study, "--storage", PG_URL]
    procs = [start(args, studies, f"startup-{i}") for i in range(2)]

    def running() -> int:
        try:
            st = optuna.load_study(study_name=pg_study, storage=open_storage(PG_URL))
        except KeyError:  # not created yet
            return 0
        return len(st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))

    try:
        wait_for(lambda: running() == 2)
    finally:
        gate.unlink()
    for p in procs:
        try:
            _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        assert p.returncode == 0, err
    trials = sorted(optuna.load_study(study_name=pg_study, storage=open_storage(PG_URL)).trials,
                    key=lambda t: t.number)
    assert len({t.user_attrs["worker"]["pid"] for t in trials}) == 2  # both drivers ran trials
    space = load_space(str(space_file))
    design = LatinStartSampler(optuna.samplers.RandomSampler(), space.params, N, 3).design
    assert [t.params for t in trials[:N]] == design
    assert one_per_stratum(space.params, design)
    assert run_cli(["best", "--study", pg_study, "--storage", PG_URL], studies).returncode == 0
