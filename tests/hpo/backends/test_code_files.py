"""The user-code files an override names (``hpo/backends/_code_files.py``), by each backend's own keys."""

from __future__ import annotations

from hpo.backends import backend_named
from hpo.backends._code_files import code_files


def test_a_path_key_names_its_value_and_an_entry_key_each_entrys_path() -> None:
    paths, entries = ("custom_reward_function.path",), ("evaluation.custom",)
    assert code_files("reward.custom_reward_function.path", "/r.py", paths, entries) == ["/r.py"]
    assert code_files("evaluation.custom", ["a=/x.py:f", "b=/y/z.py:g"], paths, entries) == ["/x.py", "/y/z.py"]
    assert code_files("evaluation.custom", "a=/x.py:f", paths, entries) == []  # not a list: not entries
    assert code_files("custom_reward_function.path", ["/r.py"], paths, entries) == []  # not a string: not a path
    assert code_files("data.train_files", "/d.parquet", paths, entries) == []


def test_each_backend_names_its_own_code_keys() -> None:
    core, verl = backend_named("verl_core"), backend_named("verl")
    for backend in (core, verl):
        assert backend.code_files("reward.custom_reward_function.path", "/r.py") == ["/r.py"]
    assert core.code_files("evaluation.custom", ["a=/x.py:f"]) == ["/x.py"]
    assert verl.code_files("evaluation.custom", ["a=/x.py:f"]) == []  # a verl_core key, not verl's
