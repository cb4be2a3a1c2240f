"""Which stored experiments a driver may run on this host (:mod:`hpo.experiment._trust`): the parts that decide which
programs run (backend, interpreter, commands, environment, a config path, user-code keys, by the trainer's own
rules) are not taken from the shared storage on trust. The default experiment of a trainer that says so runs; anything
else runs only when a local file has the same executable part, or with ``--trust-stored-experiment``."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from hpo.experiment._parse import parse_space
from hpo.experiment._schema import Space
from hpo.experiment._space import SpaceError
from hpo.experiment._trust import CodeRules, check_stored_experiment, executable_part, experiment_digest
from hpo.study._optuna import ATTR_SPACE
from tests.hpo.conftest import PY, ROOT, fake_space, load, run_cli


def one_line_exit(res: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


# ----------------------------------------------------------------------------- the rule, with a trainer's rules given
RULES = CodeRules(default_command=("python", "-m", "trainer"), code_keys=("reward.",), default_runs_unasked=True)
RAW = {"config": "tiny", "overrides": {"steps": 5}, "params": {"x": {"key": "algo.x", "type": "float", "low": 0,
                                                                    "high": 1}}}


def _space(**changes: object) -> Space:
    raw = {**RAW, **changes}
    return parse_space(raw, "exp.yaml", "exp")


def test_the_executable_part_is_what_decides_which_programs_run() -> None:
    plain = executable_part(_space(), RULES, "trainer")
    assert plain == {"trial.backend": "trainer", "trial.python": None, "trial.command": None,
                     "trial.prepare_command": None, "trial.env": {}, "config": None, "code keys": {}}
    named = executable_part(_space(trial={"command": ["python", "-m", "trainer"]}), RULES)
    assert named["trial.command"] is None  # the trainer's own command, named: the same as unset
    odd = executable_part(_space(config="cfg/mine.yaml", overrides={"reward.path": "/r.py", "steps": 5},
                                 trial={"env": {"HF_TOKEN": "hf_x", "A": "1"}, "python": "/venv/bin/python"}),
                          RULES)
    assert odd["config"] == "cfg/mine.yaml" and odd["code keys"] == {"reward.path": "/r.py"}
    assert odd["trial.env"] == {"HF_TOKEN": "***", "A": "1"} and odd["trial.python"] == "/venv/bin/python"
    every = executable_part(_space(), dataclasses.replace(RULES, every_key_is_code=True))
    assert every["code keys"] == {"steps": 5, "params.x": "algo.x"}


def test_a_stored_experiment_runs_when_default_trusted_or_matching_a_local_file(tmp_path: Path) -> None:
    assert check_stored_experiment(_space(), "s", None, None, False, rules=RULES) == "default trainer"
    stored = _space(overrides={"reward.path": "/evil.py"})
    with pytest.raises(SpaceError) as err:
        check_stored_experiment(stored, "s", None, None, False, "ab" * 32, RULES)
    assert str(err.value) == (
        "study 's': its stored experiment (sha256 abababababab) sets code keys, which run code on this host, and no "
        "local experiment file to compare with; pass --space FILE with the same experiment, or "
        "--trust-stored-experiment to run it anyway")
    assert check_stored_experiment(stored, "s", None, None, True, rules=RULES) == "--trust-stored-experiment"
    local = tmp_path / "exp.yaml"
    local.write_text(yaml.safe_dump({**RAW, "overrides": {"reward.path": "/evil.py", "steps": 99}}))
    assert check_stored_experiment(stored, "s", str(local), None, False, rules=RULES) == str(local)
    assert check_stored_experiment(stored, "s", None, str(local), False, rules=RULES) == str(local)
    local.write_text(yaml.safe_dump({**RAW, "overrides": {"reward.path": "/other.py"}}))
    with pytest.raises(SpaceError, match=f"sets code keys, which run code on this host, and {local} differs"):
        check_stored_experiment(stored, "s", str(local), None, False, rules=RULES)
    with pytest.raises(SpaceError, match=r"^--space /nonexistent.yaml: no such experiment file$"):
        check_stored_experiment(stored, "s", "/nonexistent.yaml", None, False, rules=RULES)


def test_the_digest_is_of_the_canonical_experiment() -> None:
    assert experiment_digest({"a": 1, "b": [1, 2]}) == experiment_digest({"b": [1, 2], "a": 1})
    assert experiment_digest({"a": 1}) != experiment_digest({"a": 2}) and len(experiment_digest({})) == 64


# ----------------------------------------------------------------------------- with the real backends and the CLI
def _edit_stored(studies: Path, edit: dict[str, object]) -> None:
    study = load(studies, "fake")
    raw = dict(study.user_attrs[ATTR_SPACE])
    for dotted, value in edit.items():
        node = raw
        *head, last = dotted.split(".")
        for h in head:
            node[h] = dict(node.get(h) or {})
            node = node[h]
        node[last] = value
    study.set_user_attr(ATTR_SPACE, raw)


def test_resume_refuses_a_stored_command_that_no_local_file_has(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    pwned = tmp_path / "pwned"
    _edit_stored(studies, {"trial.command": [PY, "-c", f"open({str(pwned)!r}, 'w').write('x')"]})
    line = one_line_exit(run_cli(["resume", "--study", "fake", "--n-trials", "2"], studies))
    assert "trial.command" in line and "--trust-stored-experiment" in line
    assert not pwned.exists() and len(load(studies, "fake").trials) == 1
    # an explicit --space that differs is refused too; one that matches the stored experiment passes
    line = one_line_exit(run_cli(["resume", "--study", "fake", "--space", str(space)], studies))
    assert str(space) in line
    res = run_cli(["resume", "--study", "fake", "--n-trials", "2", "--trust-stored-experiment"], studies)
    assert pwned.exists(), res.stderr  # the user said so: it ran (and, not being a trainer, failed)


def test_resume_runs_a_stored_experiment_that_matches_its_local_file(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    assert run_cli(["resume", "--study", "fake", "--n-trials", "2"], studies).returncode == 0
    moved = tmp_path / "elsewhere.yaml"
    space.rename(moved)
    one_line_exit(run_cli(["resume", "--study", "fake", "--n-trials", "3"], studies))
    res = run_cli(["resume", "--study", "fake", "--n-trials", "3", "--space", str(moved)], studies)
    assert res.returncode == 0, res.stderr
    assert len(load(studies, "fake").trials) == 3


def test_stored_user_code_keys_need_trust_even_with_the_default_trainer(tmp_path: Path) -> None:
    from hpo.backends import backend_named, load_space
    from hpo.experiment._trust import check_stored_experiment

    rules = backend_named("verl_core").code_rules()  # the trainer says which keys load code
    space = load_space("kl_lr", ["custom_reward_function.path=/tmp/evil.py"], check=False)
    with pytest.raises(SpaceError, match="code keys"):
        check_stored_experiment(space, "s", None, "search_spaces/kl_lr.yaml", trusted=False, rules=rules)
    assert check_stored_experiment(load_space("kl_lr", check=False), "s", None, None, False,
                                   rules=rules) == "default trainer"


def test_only_a_backend_that_says_so_runs_its_default_experiment_unasked() -> None:
    """The trust rule keys on what the trainer's backend says (``default_runs_unasked``), not on a trainer's name: the
    same default experiment under rules that do not say so needs a local file or the flag."""
    import dataclasses

    from hpo.backends import DEFAULT_BACKEND, backend_named, load_space
    from hpo.experiment._trust import TRUST_FLAG, check_stored_experiment

    rules = backend_named("verl_core").code_rules()
    assert rules.default_runs_unasked and not backend_named("verl").code_rules().default_runs_unasked
    space = load_space("kl_lr", check=False)
    assert check_stored_experiment(space, "s", None, None, False, rules=rules) == "default trainer"
    guarded = dataclasses.replace(rules, default_runs_unasked=False)
    with pytest.raises(SpaceError, match="trial.backend.*no local experiment file"):
        check_stored_experiment(space, "s", None, None, False, rules=guarded)
    assert check_stored_experiment(space, "s", None, None, True, rules=guarded) == TRUST_FLAG
    local = str(ROOT / "search_spaces" / "kl_lr.yaml")  # names no trainer: the registry's default is filled in
    assert check_stored_experiment(space, "s", local, None, False, rules=guarded,
                                   default_backend=DEFAULT_BACKEND).endswith("kl_lr.yaml")
    with pytest.raises(SpaceError, match="trial.backend"):  # unset is not "whatever the stored one ran"
        check_stored_experiment(dataclasses.replace(space, trial=dataclasses.replace(space.trial, backend="trl")),
                                "s", local, None, False, rules=guarded, default_backend=DEFAULT_BACKEND)


def test_a_study_stored_with_the_old_default_command_is_still_the_default_trainer() -> None:
    """Before the default command moved into its backend, a stored experiment could name it; it is the trainer's own
    command still (trusted, and equal to a local file that leaves it unset)."""
    import yaml

    from hpo.backends import backend_named, stored_space
    from hpo.experiment._trust import check_stored_experiment, executable_part

    raw = yaml.safe_load((ROOT / "search_spaces" / "kl_lr.yaml").read_text())
    old = stored_space({**raw, "trial": {**raw.get("trial", {}), "command": ["python", "-m", "verl_core", "train"]}},
                       "search_spaces/kl_lr.yaml", "kl_lr")
    new = stored_space(raw, "search_spaces/kl_lr.yaml", "kl_lr")
    rules = backend_named("verl_core").code_rules()
    assert old.trial.command == new.trial.command == ("python", "-m", "verl_core", "train")
    assert executable_part(old, rules) == executable_part(new, rules) and executable_part(old, rules)[
        "trial.command"] is None
    assert check_stored_experiment(old, "s", None, None, False, rules=rules) == "default trainer"
