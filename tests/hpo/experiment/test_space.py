"""The experiment file: every bad input exits 2 with one line naming file, field and value, creating nothing."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from hpo import SpaceError, load_space
from hpo._cli import main
from hpo.backends import backend_of
from tests.hpo.conftest import ROOT

BASE = {
    "config": "tiny_arith",
    "overrides": {"trainer.total_training_steps": 5},
    "params": {"kl_coef": {"key": "algorithm.kl_ctrl.kl_coef", "type": "float", "low": 0.01, "high": 0.2}},
}


def _with(**changes: object) -> str:
    space = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        node = space
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return yaml.safe_dump(space, sort_keys=False)


_DELETE = object()
LR = {"key": "actor_rollout_ref.actor.optim.lr", "type": "float", "low": 1e-6, "high": 1e-4, "log": True}

# (id, file text or None for a missing file, extra CLI args, fragments the one error line must contain)
BAD = [
    ("missing_file", None, [], ["no such experiment file"]),
    ("yaml_syntax", "params: {kl: [1, 2}\n", [], ["invalid YAML", "line 1"]),
    ("yaml_object", "config: !!python/object/apply:os.system ['true']\n", [], ["invalid YAML"]),
    ("duplicate_key", "config: tiny_arith\nconfig: other\n", [], ["duplicate key 'config'"]),
    ("top_level_list", "- 1\n- 2\n", [], ["top level must be a mapping"]),
    ("unknown_field", _with(paramz=1), [], ["paramz: unknown field", "1"]),
    ("unknown_param_field", _with(params__kl_coef__lo=1), [], ["params.kl_coef.lo: unknown field"]),
    ("unknown_section_field", _with(study={"n_trial": 3}), [], ["study.n_trial: unknown field", "3"]),
    ("unknown_trainer_key", _with(params__kl_coef__key="algorithm.kl_ctrl.kl_coeff"), [],
     ["params.kl_coef.key", "unknown trainer key", "algorithm.kl_ctrl.kl_coeff"]),
    ("unknown_override_key", _with(overrides={"trainer.total_steps": 5}), [],
     ["overrides.trainer.total_steps", "unknown trainer key", "5"]),
    ("bad_override_value", _with(overrides={"trainer.total_training_steps": "abc"}), [],
     ["trainer.total_training_steps", "abc"]),
    ("unknown_config", _with(config="no_such_config"), [], ["config", "no_such_config"]),
    ("low_gt_high", _with(params__kl_coef__low=0.3), [], ["params.kl_coef", "low=0.3", "high=0.2"]),
    ("log_low_zero", _with(params={"lr": {**LR, "low": 0.0}}), [], ["params.lr.low", "low > 0", "0.0"]),
    ("log_with_step", _with(params={"lr": {**LR, "step": 1e-6}}), [], ["params.lr.step", "exclusive", "1e-06"]),
    ("empty_choices", _with(params={"c": {"key": "algorithm.kl_penalty", "type": "categorical", "choices": []}}),
     [], ["params.c.choices", "non-empty", "[]"]),
    ("wrong_type_low", _with(params__kl_coef__low="abc"), [], ["params.kl_coef.low", "number", "'abc'"]),
    ("int_with_float", _with(params={"bs": {"key": "data.train_batch_size", "type": "int", "low": 1.5,
                                             "high": 8}}), [], ["params.bs.low", "integer", "1.5"]),
    ("bad_dist_type", _with(params__kl_coef__type="double"), [], ["params.kl_coef.type", "'double'"]),
    ("wrong_type_section", _with(study={"n_trials": "many"}), [], ["study.n_trials", "integer", "'many'"]),
    ("bad_direction", _with(objective={"direction": "up"}), [], ["objective.direction", "'up'"]),
    ("no_params", _with(params={}), [], ["params", "non-empty"]),
    ("trainer_rejects_value", _with(params={"gamma": {"key": "algorithm.gamma", "type": "float", "low": 0.9,
                                                      "high": 1.5}}), [],
     ["params.gamma", "1.5", "algorithm.gamma"]),
    ("driver_key", _with(overrides={"trainer.default_local_dir": "x"}), [],
     ["overrides.trainer.default_local_dir", "set by the driver"]),
    ("duplicate_param_key", _with(params__kl2={"key": "algorithm.kl_ctrl.kl_coef", "type": "float", "low": 0.1,
                                               "high": 0.2}), [], ["params.kl2.key", "already tuned"]),
    ("override_unknown_field", _with(), ["--override", "study.n_trial=3"],
     ["--override 'study.n_trial=3'", "unknown field"]),
    ("override_bad_trainer_key", _with(), ["--override", "trainer.nope=3"],
     ["--override 'trainer.nope=3'", "unknown trainer key"]),
    ("override_no_equals", _with(), ["--override", "study.n_trials"], ["--override 'study.n_trials'", "key=value"]),
    ("n_trials_zero", _with(), ["--n-trials", "0"], ["--n-trials 0", "positive"]),
    ("bad_storage", _with(), ["--storage", "nosuchdb://x/y"], ["--storage nosuchdb://x/y"]),
]


@pytest.mark.parametrize(("text", "args", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None,
                                         args: list[str], fragments: list[str]) -> None:
    path = tmp_path / "exp.yaml"
    if text is not None:
        path.write_text(text)
    studies = tmp_path / "studies"
    code = main(["search", "--space", str(path), "--studies-dir", str(studies), *args])
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    if not any(f.startswith(("--override", "--n-trials", "--storage")) for f in fragments):
        assert str(path) in lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert "Traceback" not in err and out == ""
    assert not studies.exists() or not any(studies.rglob("*")), list(studies.rglob("*"))


def test_yaml_object_is_not_constructed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "exp.yaml"
    path.write_text(f"config: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(SpaceError):
        load_space(str(path))
    assert not marker.exists()


@pytest.mark.parametrize("name", ["kl_lr", "full"])
def test_shipped_spaces_are_valid(name: str) -> None:
    space = load_space(name, spaces_dir=ROOT / "search_spaces")
    assert backend_of(space).name == "verl_core" and space.params
    assert space.objective.metric == "eval/reward_mean" and space.objective.direction == "maximize"


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_every_key_in_shipped_yaml_has_a_comment(path: Path) -> None:
    lines = path.read_text().splitlines()
    key_re = re.compile(r"^\s*([A-Za-z_][\w./-]*)\s*:")
    for i, line in enumerate(lines):
        if not key_re.match(line) or line.lstrip().startswith("#"):
            continue
        above = next((x for x in reversed(lines[:i]) if x.strip()), "")
        assert "#" in line or above.lstrip().startswith("#"), f"{path.name}:{i + 1}: {line.strip()} has no comment"


def test_override_sets_space_fields_and_trainer_overrides(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(_with())
    space = load_space(str(path), ["study.n_trials=4", "params.kl_coef.high=0.1", "trainer.test_freq=2"])
    assert space.study.n_trials == 4
    assert space.param("kl_coef").high == 0.1
    assert space.overrides == {"trainer.total_training_steps": 5, "trainer.test_freq": 2}
    assert space.trainer_overrides({"kl_coef": 0.05}) == [
        "trainer.total_training_steps=5", "trainer.test_freq=2", "algorithm.kl_ctrl.kl_coef=0.05"]


def test_distributions_follow_optuna_rules(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent("""\
        config: tiny_arith
        params:
          lr: {key: actor_rollout_ref.actor.optim.lr, type: float, low: 1.0e-6, high: 1.0e-3, log: true}
          bs: {key: data.train_batch_size, type: int, low: 32, high: 128, step: 32}
          pen: {key: algorithm.kl_penalty, type: categorical, choices: [kl, low_var_kl]}
        overrides:
          actor_rollout_ref.actor.ppo_mini_batch_size: 32
          actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 16
    """))
    space = load_space(str(path))
    lr, bs, pen = (p.distribution() for p in space.params)
    assert lr.log and lr.low == 1e-6
    assert (bs.low, bs.high, bs.step) == (32, 128, 32)
    assert pen.choices == ("kl", "low_var_kl")


def test_a_space_of_more_than_max_params_parameters_is_refused_in_one_line(tmp_path: Path) -> None:
    """Optuna writes every suggested value in a transaction of its own: 7,500 parameters cost 30-120 s a trial before
    it starts (issue 34 item 12), so such a space is refused at load, naming the limit and why."""
    from hpo.experiment._space import MAX_PARAMS

    params = {f"p{i}": {"key": f"fake.p{i}", "type": "float", "low": 0.0, "high": 1.0} for i in range(MAX_PARAMS + 1)}
    path = tmp_path / "exp.yaml"
    path.write_text(_with(params=params, trial__command=["python", "trainer.py"]))  # any keys: a custom command
    with pytest.raises(SpaceError) as err:
        load_space(str(path))
    assert f"{MAX_PARAMS + 1} parameters; at most {MAX_PARAMS}" in str(err.value) and "\n" not in str(err.value)
    path.write_text(_with(params=dict(list(params.items())[:MAX_PARAMS]), trial__command=["python", "trainer.py"]))
    assert len(load_space(str(path)).params) == MAX_PARAMS
