"""The hardened YAML reader (:mod:`hpo.experiment._yaml`): no object built from a tag, a duplicate key, an alias
inside its own anchor (a cycle) and an alias bomb refused before anything is built, and an experiment file read only
when it is a regular, bounded, UTF-8 file holding a mapping; each problem one line naming the file (and the line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from hpo.analysis._files import MAX_FILE_BYTES
from hpo.experiment._errors import SpaceError
from hpo.experiment._yaml import MAX_YAML_NODES, YamlTooComplex, load_yaml_text, read_yaml, yaml_problem


def _bomb(levels: int) -> str:
    """A "billion laughs": each level a list of ten aliases of the one below (10**levels values once expanded)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_anchors_that_stay_small_load_and_a_bomb_is_refused_before_it_expands() -> None:
    small = load_yaml_text(_bomb(3))  # 10**3 values: fine
    assert len(small["a3"]) == 10 and small["a3"][0][0][0] == small["a0"]
    with pytest.raises(YamlTooComplex, match=f"more than {MAX_YAML_NODES} values once its aliases are expanded"):
        load_yaml_text(_bomb(9))  # a billion values: refused while composing, at once


def test_a_cycle_and_a_duplicate_key_are_refused_with_their_line() -> None:
    with pytest.raises(YamlTooComplex) as cycle:
        load_yaml_text("ok: 1\nloop: &x\n  - *x\n")
    assert yaml_problem(cycle.value) == " line 3: invalid YAML (alias *x inside the value of &x (a cycle))"
    with pytest.raises(yaml.constructor.ConstructorError) as dup:
        load_yaml_text("a: 1\nb:\n  c: 1\n  c: 2\n")
    assert yaml_problem(dup.value) == " line 4: invalid YAML (duplicate key 'c')"
    assert load_yaml_text("a: &v 1\nb: *v\n") == {"a": 1, "b": 1}  # a plain alias is not a cycle


def test_no_object_is_built_from_a_tag(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(yaml.constructor.ConstructorError):
        load_yaml_text(f"x: !!python/object/apply:os.system ['touch {marker}']\n")
    assert not marker.exists()


def test_an_experiment_file_is_a_mapping_of_sections(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("config: tiny\nparams: {x: 1}\n")
    assert read_yaml(path) == {"config": "tiny", "params": {"x": 1}}
    path.write_text("")
    assert read_yaml(path) == {}
    path.write_text("- a\n- b\n")
    with pytest.raises(SpaceError, match=rf"^{path}: top level must be a mapping of sections, got list$"):
        read_yaml(path)
    path.write_text("a: [1, 2\n")
    with pytest.raises(SpaceError, match=rf"^{path}: line \d+: invalid YAML"):
        read_yaml(path)


@pytest.mark.parametrize("kind", ["missing", "fifo", "device", "link_to_device", "too_big", "latin1", "directory"])
def test_what_is_not_a_small_regular_utf8_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "exp.yaml"
    said = {"missing": "no such experiment file", "fifo": "an experiment file must be a regular file",
            "device": "an experiment file must be a regular file", "link_to_device": "must be a regular file",
            "too_big": f"of at most {MAX_FILE_BYTES} bytes", "latin1": "not UTF-8 text (byte 11)",
            "directory": "must be a regular file"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "link_to_device":
        path.symlink_to("/dev/zero")
    elif kind == "too_big":
        path.write_bytes(b"a: 1\n" + b"#" * MAX_FILE_BYTES)
    elif kind == "latin1":
        path.write_bytes("config: caf\xe9\n".encode("latin-1"))
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(SpaceError) as err:
        read_yaml(path)  # never blocks on the FIFO, never reads /dev/zero without end
    assert str(err.value).startswith(str(path)) and said in str(err.value) and "\n" not in str(err.value)


def test_a_float_without_a_dot_is_a_number() -> None:
    """``low: 1e-6`` is how a learning rate is written: a float (YAML 1.2), not the string YAML 1.1 makes of it;
    PyYAML's own SafeLoader is left as it is."""
    import yaml as pyyaml

    from hpo.experiment._yaml import load_yaml_text

    assert load_yaml_text("low: 1e-6\nhigh: -2E+3\nn: 10\nv: 1.5e-4\nname: e5") == {
        "low": 1e-6, "high": -2000.0, "n": 10, "v": 1.5e-4, "name": "e5"}
    assert pyyaml.safe_load("low: 1e-6") == {"low": "1e-6"}
