"""verl_core.import_cache: transformers imports with its two start-up computations from disk and gets what it would
compute itself; an install invalidates the cache; a hostile cache file is neither trusted nor written over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from verl_core import import_cache

# What transformers holds after the import: the distributions mapping and the models' lazy structure (encoded).
PROBE = """
import json, sys
from verl_core.trainer import import_transformers
import_transformers()
import transformers.models as models
import transformers.utils.import_utils as iu
json.dump({"mapping": iu.PACKAGE_DISTRIBUTION_MAPPING,
           "models": {"classes": models._class_to_module, "modules": sorted(models._modules)},
           "patched": iu.create_import_structure_from_path.__module__}, open(sys.argv[1], "w"), sort_keys=True)
"""


def _probe(tmp_path: Path, cache: Path, name: str, use_cache: bool = True, extra_path: Path | None = None) -> dict:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "VERL_HPO_CACHE": str(cache), "VERL_CORE_IMPORT_CACHE": "1" if use_cache else "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), *([str(extra_path)] if extra_path else [])])}
    done = subprocess.run([sys.executable, "-c", PROBE, str(out)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def _fake_dist(site: Path, name: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{name}_mod\n")


def test_the_cached_import_equals_transformers_own_and_an_install_invalidates_it(tmp_path: Path) -> None:
    cache, site = tmp_path / "cache", tmp_path / "site"
    _fake_dist(site, "first_pkg")
    own = _probe(tmp_path, cache, "own", use_cache=False, extra_path=site)
    assert not (cache / "startup").exists()  # the switch: nothing cached, transformers' own function
    assert own["patched"] != import_cache.__name__
    written = _probe(tmp_path, cache, "written", extra_path=site)  # computes and writes
    assert sorted((cache / "startup").iterdir()) == [cache / "startup" / "packages_distributions.json",
                                                     cache / "startup" / "transformers_models.json"]
    read = _probe(tmp_path, cache, "read", extra_path=site)  # from the files
    assert read["patched"] == import_cache.__name__
    assert own["mapping"] == written["mapping"] == read["mapping"] and own["mapping"]["first_pkg_mod"] == ["first_pkg"]
    assert own["models"] == written["models"] == read["models"]
    classes = own["models"]["classes"]
    assert len(classes) > 1000 and classes["Qwen2ForCausalLM"] == "qwen2.modeling_qwen2"  # the whole structure
    _fake_dist(site, "second_pkg")  # an install into a directory on sys.path
    after = _probe(tmp_path, cache, "after", extra_path=site)
    assert after["mapping"]["second_pkg_mod"] == ["second_pkg"]
    assert after["models"] == own["models"]


def test_a_stored_value_is_served_only_under_its_key(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    calls: list[int] = []

    def compute() -> dict[str, list[str]]:
        calls.append(1)
        return {"m": ["d"]}

    def get(key: object) -> object:
        return import_cache._cached(path, key, compute, lambda v: v, import_cache._decode_mapping)

    assert get("k1") == {"m": ["d"]} and get("k1") == {"m": ["d"]} and len(calls) == 1
    assert get("k2") == {"m": ["d"]} and len(calls) == 2  # another key: computed again
    path.write_text(json.dumps({"version": import_cache.VERSION, "key": "k2", "value": {"m": "not a list"}}))
    assert get("k2") == {"m": ["d"]} and len(calls) == 3  # malformed: computed again and rewritten
    assert json.loads(path.read_text())["value"] == {"m": ["d"]}


@pytest.mark.parametrize("kind", ["fifo", "link_to_dev_zero", "directory", "huge"])
def test_a_hostile_cache_file_is_not_trusted_nor_written_over(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "c.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(json.dumps({"version": import_cache.VERSION, "key": "k", "value": {"m": ["stale"]}})
                        + " " * import_cache.MAX_BYTES)
    value = import_cache._cached(path, "k", lambda: {"m": ["fresh"]}, lambda v: v, import_cache._decode_mapping)
    assert value == {"m": ["fresh"]}
    if kind == "huge":  # a regular file: replaced
        assert json.loads(path.read_text())["value"] == {"m": ["fresh"]}
    else:  # left as it was
        assert {"fifo": path.is_fifo(), "link_to_dev_zero": path.is_symlink(), "directory": path.is_dir()}[kind]


def test_the_structure_codec_round_trips_and_refuses_other_shapes() -> None:
    structure = {"albert": {frozenset(): {"configuration_albert": {"AlbertConfig"}},
                            frozenset({"tokenizers", "torch"}): {"tokenization_albert_fast": {"A", "B"}}}}
    encoded = json.loads(json.dumps(import_cache.encode_structure(structure)))
    assert import_cache.decode_structure(encoded) == structure
    for bad in ({"d": [[1, {"s": []}]]}, {"s": [1]}, {"x": []}, [], {"d": [["a"]]}):
        with pytest.raises((ValueError, TypeError)):
            import_cache.decode_structure(bad)
