"""The backend registry: ``trial.backend`` names a :class:`~hpo.backends.Backend`; ``verl_core`` with a command of its
own is a plain command; a registered trainer runs a study without any change to the study loop."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.analysis import MetricNames
from hpo.backends import (
    Attempt,
    Backend,
    BackendError,
    Command,
    CommandBackend,
    TrialConfig,
    backend_named,
    backend_of,
    known_backends,
    load_space,
    register,
)
from hpo.backends._registry import unregister
from hpo.experiment import SpaceError
from tests.hpo.conftest import ROOT, fake_space, load, run_cli


def test_each_shipped_backend_is_known() -> None:
    assert {"verl_core", "verl", "trl"} <= set(known_backends()) and known_backends()[0] == "verl_core"
    assert backend_of(load_space("kl_lr", spaces_dir=ROOT / "search_spaces")).name == "verl_core"
    assert backend_of(load_space("verl_grpo_cpu", spaces_dir=ROOT / "search_spaces", check=False)).name == "verl"
    assert backend_of(load_space("trl_grpo_arith", spaces_dir=ROOT / "search_spaces", check=False)).name == "trl"


def test_an_experiment_naming_no_trainer_runs_the_registrys_default(tmp_path: Path) -> None:
    """The schema only knows "unset"; which trainer that is, the registry says (on every load, stored ones too, and in
    every lookup of a backend by name)."""
    from hpo.backends import DEFAULT_BACKEND, backend_named, stored_space
    from hpo.experiment import TrialSpec, read_space

    assert TrialSpec().backend == "" and DEFAULT_BACKEND == known_backends()[0]
    raw = yaml.safe_load((ROOT / "search_spaces" / "kl_lr.yaml").read_text())
    assert "backend" not in raw.get("trial", {})
    assert read_space("kl_lr", spaces_dir=ROOT / "search_spaces")[0].trial.backend == ""
    assert load_space("kl_lr", spaces_dir=ROOT / "search_spaces").trial.backend == DEFAULT_BACKEND
    assert stored_space(raw, "kl_lr.yaml", "kl_lr").trial.backend == DEFAULT_BACKEND
    assert backend_named("") is backend_named(DEFAULT_BACKEND)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**raw, "trial": {**raw.get("trial", {}), "backend": "nope"}}))
    with pytest.raises(SpaceError, match=r"trial.backend.*'nope' is not one of verl_core"):
        load_space(str(path))


def test_verl_core_with_a_command_of_its_own_is_a_plain_command(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "search_spaces" / "kl_lr.yaml").read_text())
    raw["trial"] = {"command": [sys.executable, "trainer.py"]}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    space = load_space(str(path))
    backend = backend_of(space)
    assert backend.name == "command" and backend.prepare_argv(space) is None  # no verl_core prepare step
    cfg = backend.configure(Attempt(space=space, values={"kl_coef": 0.05, "actor_lr": 1e-5}, trial_dir=tmp_path))
    assert cfg.loaded is None and sorted(cfg.overrides[-2:]) == ["actor_rollout_ref.actor.optim.lr=1e-05",
                                                                 "algorithm.kl_ctrl.kl_coef=0.05"]
    assert not any(o.startswith(("trainer.default_local_dir=", "data.test_files=")) for o in cfg.overrides)


class _Recording(CommandBackend):
    """A trainer the driver does not know: the custom command contract, with its own metrics file name."""

    name = "recording"
    configured: list[dict[str, Any]] = []

    def configure(self, attempt: Attempt) -> TrialConfig:
        type(self).configured.append(dict(attempt.values))
        return super().configure(attempt)

    def metrics_path(self, trial_dir: Path, attempt: int) -> Path:
        return trial_dir / f"recording.{attempt}.jsonl"


def test_a_registered_backend_runs_a_study(tmp_path: Path, monkeypatch: Any) -> None:
    """In-process (``register`` is per process): the schema accepts the new name and the driver asks the registered
    backend for every trial; no module of the study loop knows it."""
    from hpo._cli import main

    try:
        register("recording", _Recording)
        path = fake_space(tmp_path, trial={"command": [sys.executable, str(ROOT / "tests/hpo/fake_trainer.py"),
                                                       "train"], "backend": "recording"}, study={"n_trials": 2})
        studies = tmp_path / "studies"
        assert main(["search", "--space", str(path), "--studies-dir", str(studies)]) == 0
    finally:
        unregister("recording")
    trials = load(studies, "fake").get_trials(deepcopy=False)
    assert len(trials) == 2 and len(_Recording.configured) == 2
    assert all((Path(t.user_attrs["trial_dir"]) / "recording.0.jsonl").is_file() for t in trials)


def test_an_unregistered_backend_is_one_line(tmp_path: Path) -> None:
    path = fake_space(tmp_path, trial={"backend": "openrlhf"})
    res = run_cli(["search", "--space", str(path)], tmp_path / "studies")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "trial.backend" in res.stderr and "openrlhf" in res.stderr and "Traceback" not in res.stderr


def _interrupted_by_a_real_ctrl_c() -> Backend:
    """A plugin whose load is slow, and the user presses Ctrl-C meanwhile (a SIGINT to the process)."""
    import os
    import signal
    import time

    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the signal is handled at the next bytecode: this loop is interrupted
        time.sleep(0.01)
    raise AssertionError("the SIGINT never arrived")


def _raises_keyboard_interrupt() -> Backend:
    raise KeyboardInterrupt


def _exits() -> Backend:
    raise SystemExit(0)


def test_a_plugins_own_exit_is_its_error_but_a_real_ctrl_c_still_stops() -> None:
    """A plugin's load is isolated: SystemExit or a KeyboardInterrupt it raises itself is a BackendError naming it;
    a Ctrl-C the user presses while it loads still stops the command (KeyboardInterrupt: exit 130)."""
    import signal

    from hpo.backends import BackendError, backend_named

    before = signal.getsignal(signal.SIGINT)
    try:
        for name, factory, raised in (("exits", _exits, "SystemExit: 0"),
                                      ("interrupts", _raises_keyboard_interrupt, "KeyboardInterrupt")):
            register(name, factory)
            with pytest.raises(BackendError, match=rf"^trial.backend {name}: .* does not load: {raised}$"):
                backend_named(name)
        register("slow", _interrupted_by_a_real_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            backend_named("slow")
        assert signal.getsignal(signal.SIGINT) is before  # the handler of the load is gone
    finally:
        for name in ("exits", "interrupts", "slow"):
            unregister(name)


class _NoCommand(Backend):
    """A trainer that names itself and its metrics and says how to configure a run, but not what to run."""

    name = "half"
    metrics = MetricNames(objective="score")

    def configure(self, attempt: Attempt) -> TrialConfig:
        return TrialConfig([], None, "")


class _NoName(Backend):
    metrics = MetricNames()

    def configure(self, attempt: Attempt) -> TrialConfig:
        return TrialConfig([], None, "")

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        return Command(["true"], {})


class _WrongFeature(_NoName):
    name = "wrong"
    resumable = "checkpoint-<step>"  # type: ignore[assignment]


def test_a_backend_missing_a_required_member_is_refused_with_one_line() -> None:
    """The registry checks a backend class as it loads it (before building it): one line naming the backend, what it
    does not write and the whole required core; a feature of the wrong type is one line too."""
    refused = {"half": (_NoCommand, "does not write command (every trainer writes name, metrics, configure, command"),
               "noname": (_NoName, "does not write name (every trainer writes"),
               "wrong": (_WrongFeature, "has resumable = str, not a hpo.backends.Resumable (None: no resumable)")}
    try:
        for name, (cls, said) in refused.items():
            register(name, cls)
            with pytest.raises(BackendError) as err:
                backend_named(name)
            line = str(err.value)
            assert line.startswith(f"trial.backend {name}: the backend from registered {name} ") and said in line
            assert "\n" not in line
        register("factory", lambda: _NoName())  # a factory's backend is checked as built
        with pytest.raises(BackendError, match="^trial.backend factory: .* does not write name "):
            backend_named("factory")
    finally:
        for name in (*refused, "factory"):
            unregister(name)


def test_the_required_core_is_four_members_and_the_shipped_backends_write_them() -> None:
    from hpo.backends._base import REQUIRED, missing_members

    assert REQUIRED == ("name", "metrics", "configure", "command")
    assert set(Backend.__abstractmethods__) == {"configure", "command"}
    assert missing_members(Backend) == list(REQUIRED)
    for name in ("verl_core", "verl", "trl"):
        assert missing_members(type(backend_named(name))) == [], name
