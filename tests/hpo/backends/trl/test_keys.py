"""The keys of a ``trial.backend: trl`` config (``hpo/backends/trl/_keys.py``, shared by the driver and the launcher in
TRL's interpreter): GRPOConfig's field list is the installed TRL's, the launcher's sections become dotted keys, values
are read as both sides read them (YAML 1.2's floats), and a secret reaches the launcher through its environment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from hpo.backends.trl import GRPO_FIELDS, LAUNCHER, LAUNCHER_KEYS
from hpo.backends.trl._keys import SECTIONS, flatten, load_mapping, load_value, resolve_env_refs


def test_the_field_list_is_the_installed_trls() -> None:
    """_keys.GRPO_FIELDS is generated from trl 1.16.0; regenerate it (the launcher's --keys) when TRL changes."""
    out = subprocess.run([sys.executable, str(LAUNCHER), "--keys"], capture_output=True, text=True, timeout=120,
                         check=True)
    assert set(json.loads(out.stdout)) == set(GRPO_FIELDS)
    assert all("." in k for k in LAUNCHER_KEYS) and not any("." in k for k in GRPO_FIELDS)


def test_a_config_s_sections_become_dotted_keys_and_a_field_s_mapping_stays_one() -> None:
    raw = load_mapping("data:\n  train_files: a.parquet\n  val_files: b.parquet\nmodel_init_kwargs: {dtype: float32}\n"
                       "learning_rate: 1e-06\n")
    assert "data" in SECTIONS
    assert flatten(raw) == {"data.train_files": "a.parquet", "data.val_files": "b.parquet",
                            "model_init_kwargs": {"dtype": "float32"}, "learning_rate": 1e-06}


@pytest.mark.parametrize(("text", "value"), [
    ("1e-06", 1e-06), ("3", 3), ("1.5e3", 1500.0), ("true", True), ("null", None), ("[1, a]", [1, "a"]),
    ("", ""), ("  ", ""), ("'1e-06'", "1e-06"), ("a: b: c", "a: b: c"), ("[unclosed", "[unclosed")])
def test_a_value_is_read_as_yaml_with_yaml_1_2_s_floats_else_as_its_text(text: str, value: object) -> None:
    """PyYAML's SafeLoader reads ``1e-06`` (what ``repr`` writes for a learning rate) as a string; here it is a
    number, as TRL's own parser makes it; a value that is not YAML is its text."""
    assert load_value(text) == value and type(load_value(text)) is type(value)


def test_the_launcher_reads_a_secret_from_its_environment() -> None:
    """``hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}`` in argv (hpo.experiment._secrets): the launcher takes the
    value from its environment as a YAML string, and names the key when the variable is missing."""
    env = {"VERL_HPO_SECRET_HUB_TOKEN": "123'45"}
    out = resolve_env_refs(["max_steps=4", "hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}"], env)
    assert out[0] == "max_steps=4" and yaml.safe_load(out[1].partition("=")[2]) == "123'45"
    with pytest.raises(ValueError, match="hub_token: .*VERL_HPO_SECRET_HUB_TOKEN.* is not set"):
        resolve_env_refs(["hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}"], {})
