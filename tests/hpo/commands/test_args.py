"""The flags several subcommands share (``hpo/commands/_args.py``): each group adds its flags with their defaults and
types, and every subcommand of the real ``verl-hpo`` parser that takes a flag takes it with the same default and
help."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpo._cli import build_parser
from hpo.commands._args import budget_arg, ray_arg, storage_args, tracking_args, trust_args


def test_each_group_adds_its_flags_with_their_defaults_and_types() -> None:
    parser = argparse.ArgumentParser()
    for group in (trust_args, tracking_args, ray_arg, budget_arg, storage_args):
        group(parser)
    assert vars(parser.parse_args([])) == {
        "space": None, "trust_stored_experiment": False, "tracking": [], "tracking_optional": False,
        "ray_address": None, "budget": None, "storage": None, "studies_dir": None}
    args = parser.parse_args(["--tracking", "mlflow=file:/tmp/m", "--tracking", "wandb", "--budget", "2.5",
                              "--studies-dir", "runs", "--trust-stored-experiment", "--storage", "sqlite:///x.db"])
    assert args.tracking == ["mlflow=file:/tmp/m", "wandb"] and args.budget == 2.5
    assert args.studies_dir == Path("runs") and args.trust_stored_experiment and args.storage == "sqlite:///x.db"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_subcommand_takes_a_shared_flag_the_same_way() -> None:
    seen: dict[str, dict[str, tuple[str, str | None]]] = {}
    for name, parser in _subcommands().items():
        for action in parser._actions:
            for flag in action.option_strings:
                seen.setdefault(flag, {})[name] = (repr(action.default), action.help)
    own = {("--studies-dir", "rehearse")}  # its files go to <studies-dir>/rehearsals/: said in its own help
    for flag in ("--studies-dir", "--storage", "--trust-stored-experiment", "--tracking", "--tracking-optional",
                 "--budget", "--ray-address"):
        ways = {way for name, way in seen[flag].items() if (flag, name) not in own}
        assert len(ways) == 1, (flag, seen[flag])
    assert set(seen["--studies-dir"]) == {"search", "resume", "worker", "confirm", "validate", "rehearse",
                                          "dashboard", "track", "best"}
    assert set(seen["--storage"]) == set(seen["--studies-dir"]) - {"rehearse"}
    assert set(seen["--budget"]) == {"search", "resume", "worker", "confirm"}
