"""Model-size fidelity (issue 51 items 1-3, ``study.fidelity.proxy``), as a user runs it from a directory of their own
with a real SQLite study: the search runs on a small model of the target's family (tests/hpo/fake_trainer.py's
``fake.model=small``), its best settings run on the target for a short budget, and the study trusts the proxy only as
far as it ranks them as the target does. A planted proxy whose ranking is reversed is caught and the study says so in
one line and searches on the target; a transfer rule reaches the proxy's runs and is reported; the spend is counted in
the target's runs at the ratio the study measured from its own trials' wall times."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_FIDELITY_CHECK,
    ATTR_PROMOTED_FROM,
    ATTR_PROMOTION,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
    is_confirm,
    is_promoted,
    is_proxy,
    is_tie_run,
    step_seconds,
    steps_run,
    study_cost,
)
from tests.hpo.conftest import FAKE_TRAINER, PY, cli_env, load

REVERSED = "the proxy does not rank settings as the target does"


def models(tmp_path: Path) -> tuple[Path, Path]:
    """Two local model directories of one family: the same tokenizer, hidden sizes 256 (target) and 64 (proxy)."""
    out = []
    for name, hidden in (("large", 256), ("small", 64)):
        d = tmp_path / "models" / name
        d.mkdir(parents=True)
        (d / "tokenizer.json").write_text('{"model": {"vocab": {"<eos>": 0, "1": 1}}}')
        (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "model_max_length": hidden}))
        (d / "config.json").write_text(json.dumps({"hidden_size": hidden}))
        out.append(d)
    return out[0], out[1]


def experiment(tmp_path: Path, proxy: dict[str, Any], **study: Any) -> Path:
    large, small = models(tmp_path)
    space = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 6, "trainer.test_freq": 2, "fake.step_s": 0.01,
                      "actor_rollout_ref.model.path": str(large), "fake.model": "large"},
        "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 3, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3,
                  "fidelity": {"proxy": {"overrides": {"actor_rollout_ref.model.path": str(small),
                                                       "fake.model": "small", "fake.small_step_s": 0.002, **proxy},
                                         "promote": 3, "promote_steps": 4}}, **study},
        "trial": {"backend": "verl_core", "command": [PY, str(FAKE_TRAINER), "train"], "n_jobs": 2},
    }
    for field in ("transfer", "tie_seeds", "confirm_top"):  # the proxy's own fields, given beside its overrides
        value = space["study"]["fidelity"]["proxy"]["overrides"].pop(field, None)  # type: ignore[index]
        if value is not None:
            space["study"]["fidelity"]["proxy"][field] = value  # type: ignore[index]
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m hpo ARGS`` from the user's directory (not the repository), its studies there."""
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(tmp_path / "studies")], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=300)


def argv_of(t: optuna.trial.FrozenTrial) -> list[str]:
    return list(json.loads((Path(t.user_attrs["trial_dir"]) / "command.json").read_text())["argv"])


def value_in(argv: list[str], key: str) -> str:
    return next(a.partition("=")[2] for a in argv if a.startswith(f"{key}="))


def test_a_reversed_proxy_is_caught_in_one_line_and_the_search_goes_on_on_the_target(tmp_path: Path) -> None:
    res = cli(tmp_path, "search", "--space", str(experiment(tmp_path, {"fake.small_reverse": True})))
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stdout.splitlines() if REVERSED in line]
    assert len(said) == 1 and "Kendall's tau -1.00" in said[0] and "searches on the target" in said[0]
    study = load(tmp_path / "studies", "proxy")
    check = study.user_attrs[ATTR_FIDELITY_CHECK]
    assert check["holds"] is False and check["tau"] == -1.0 and check["n"] == 3
    trials = study.get_trials(deepcopy=False)
    proxy = [t for t in trials if is_proxy(t)]
    promoted = [t for t in trials if is_promoted(t)]
    target = [t for t in trials if not is_proxy(t) and not is_promoted(t)]
    assert len(proxy) == 3 and len(promoted) == 3 and len(target) == 3  # the fallback: n_trials on the target
    large, small = (str(tmp_path / "models" / n) for n in ("large", "small"))
    assert all(value_in(argv_of(t), "actor_rollout_ref.model.path") == small for t in proxy)
    assert all(value_in(argv_of(t), "actor_rollout_ref.model.path") == large for t in promoted + target)
    # every proxy setting promoted (promote 3 of 3), each measured on the target at promote_steps (4 of 6)
    assert sorted(t.system_attrs[ATTR_PROMOTED_FROM] for t in promoted) == sorted(t.number for t in proxy)
    assert all(t.user_attrs["stop_reason"] == "promote_steps" and max(t.intermediate_values) == 4
               for t in promoted)
    assert all(t.number > max(p.number for p in promoted) for t in target)  # after the check, never before
    best = subprocess.run([PY, "-m", "hpo", "best", "--study", "proxy", "--studies-dir", str(tmp_path / "studies")],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert best.returncode == 0, best.stderr
    assert "proxy: did not hold" in best.stderr and "spent on a proxy that did not hold" in best.stderr
    shown = int(best.stderr.split("# trial ", 1)[1].split()[0])
    assert not is_proxy(next(t for t in trials if t.number == shown))  # best is a target run, never a proxy value
    again = cli(tmp_path, "resume", "--study", "proxy")  # the header counts each model's runs apart
    assert again.returncode == 0, again.stderr
    assert "study proxy: 3/3 finished proxy trials (and 6 finished on the target model)" in again.stdout


def test_a_transfer_rule_reaches_the_proxy_runs_and_the_check_reports_it(tmp_path: Path) -> None:
    """x on the small model peaks at 0.15 and on the large one at 0.3: `multiply: 2` maps one onto the other, so the
    proxy holds and the confirmation races on the target; the spend is split at the measured cost ratio."""
    space = experiment(tmp_path, {"fake.small_x0": 0.15, "transfer": {"x": {"multiply": 2}}},
                       confirm={"top_k": 1, "seeds": 1})
    res = cli(tmp_path, "search", "--space", str(space))
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stdout.splitlines() if line.startswith("proxy check:"))
    assert "the proxy holds on 3 promoted settings" in line and "transfer rules applied: x: multiply 2 (x2)" in line
    assert "which helped: without them tau" in line
    study = load(tmp_path / "studies", "proxy")
    check = study.user_attrs[ATTR_FIDELITY_CHECK]
    assert check["holds"] is True and check["transfer"] == {"x": {"rule": "multiply 2", "factor": 2.0}}
    assert check["without_transfer"]["tau"] < check["tau"]
    for t in study.get_trials(deepcopy=False):  # the study's value is the target's; a proxy run trains with half
        ran = float(value_in(argv_of(t), "fake.x"))
        assert ran == pytest.approx(t.params["x"] / 2 if is_proxy(t) else t.params["x"])
    assert "proxy: held" in res.stdout and "saved" in res.stdout

    # the cost ratio is measured from this study's own trials: proxy wall time per step over the target's
    trials = study.get_trials(deepcopy=False)
    proxy_s = step_seconds(t for t in trials if is_proxy(t))
    target_s = step_seconds(t for t in trials if not is_proxy(t))
    assert proxy_s is not None and target_s is not None
    measured = proxy_s / target_s
    cost = study_cost(trials)
    assert cost.proxy_ratio == pytest.approx(measured) and cost.proxy_ratio != 1.0
    proxy_steps = sum(steps_run(t) for t in trials if is_proxy(t))
    assert cost.split["proxy search"] == pytest.approx(proxy_steps * measured / 6)
    assert f"{proxy_steps} proxy steps at a measured {measured:.3g} target step each" in res.stdout

    conf = cli(tmp_path, "confirm", "--study", "proxy")
    assert conf.returncode == 0, conf.stderr
    runs = [t for t in load(tmp_path / "studies", "proxy").get_trials() if is_confirm(t)]
    assert runs and all(not is_proxy(t) and t.system_attrs["hpo:confirm_of"] in
                        {p.number for p in trials if is_promoted(p)} for t in runs)  # the promoted, on the target
    assert all(value_in(argv_of(t), "actor_rollout_ref.model.path") == str(tmp_path / "models" / "large")
               for t in runs)
    assert "target search" in conf.stdout and "confirmation" in conf.stdout


def test_settings_the_proxy_cannot_tell_apart_run_again_on_its_seeds_and_the_race_takes_the_best_mean_alone(
        tmp_path: Path) -> None:
    """On the tuning seed the small model scores every x alike (fake.small_flat_seed=1): the proxy's 3 settings are
    tied, so each runs once more on the proxy on the race's first seed (tie_seeds 1), to its last step, never counted
    among the search's n_trials; the promotion then ranks them by their mean over the proxy's 2 seeds (x nearest 0.3
    first, the target's best too), and the race takes that setting alone although confirm_top allows 2: the proxy's
    seeds told them apart, so the target does not pay for it. The tie runs count in the proxy's spend."""
    space = experiment(tmp_path, {"fake.small_flat_seed": 1, "tie_seeds": 1, "confirm_top": 2},
                       confirm={"top_k": 1, "seeds": 2})
    res = cli(tmp_path, "search", "--space", str(space))
    assert res.returncode == 0, res.stderr
    study = load(tmp_path / "studies", "proxy")
    trials = study.get_trials(deepcopy=False)
    search = [t for t in trials if is_proxy(t) and not is_tie_run(t)]
    ties = [t for t in trials if is_tie_run(t)]
    promoted = [t for t in trials if is_promoted(t)]
    assert len(search) == 3 and len({t.values[0] for t in search}) == 1  # flat on the tuning seed: all tied
    seed = int(promoted[0].user_attrs["promote_seed"])  # the race's first seed
    assert sorted(t.system_attrs[ATTR_TIE_OF] for t in ties) == sorted(t.number for t in search)
    small = str(tmp_path / "models" / "small")
    for t in ties:
        assert t.system_attrs[ATTR_TIE_SEED] == seed and t.user_attrs["tie_seed"] == seed
        assert value_in(argv_of(t), "trainer.seed") == str(seed)
        assert value_in(argv_of(t), "actor_rollout_ref.model.path") == small
        assert t.user_attrs["last_step"] == 6 and "stop_reason" not in t.user_attrs  # run to the end
        assert t.params == next(s for s in search if s.number == t.system_attrs[ATTR_TIE_OF]).params
    assert all(t.number < min(p.number for p in promoted) for t in ties)  # evidence for the promotion: before it
    best = min(search, key=lambda t: abs(t.params["x"] - 0.3))
    kept = study._storage.get_study_system_attrs(study._study_id)[ATTR_PROMOTION]
    assert kept["candidates"][0] == best.number  # ranked by the means over the proxy's two seeds
    assert kept["candidates"] != sorted(kept["candidates"])  # not the tuning seed's tie order (trial numbers)
    said = [line for line in res.stdout.splitlines() if line.startswith("proxy tie:")]
    assert len(said) == 1 and "3 of the proxy's best settings" in said[0] and f"seed of [{seed}]" in said[0]
    cost = study_cost(trials)
    assert cost.proxy_steps == sum(steps_run(t) for t in search + ties) == 36  # the tie runs are proxy spend

    again = cli(tmp_path, "resume", "--study", "proxy")  # nothing left to run; the header counts search trials only
    assert again.returncode == 0, again.stderr
    assert "3/3 finished proxy trials (and 3 finished on the target model)" in again.stdout
    assert len([t for t in load(tmp_path / "studies", "proxy").get_trials() if is_tie_run(t)]) == 3  # none twice

    conf = cli(tmp_path, "confirm", "--study", "proxy")
    assert conf.returncode == 0, conf.stderr
    runs = [t for t in load(tmp_path / "studies", "proxy").get_trials() if is_confirm(t)
            and not t.system_attrs.get("hpo:baseline")]
    chosen = next(p for p in promoted if p.system_attrs[ATTR_PROMOTED_FROM] == best.number)
    assert runs and {t.system_attrs[ATTR_CONFIRM_OF] for t in runs} == {chosen.number}  # alone
    shown = subprocess.run([PY, "-m", "hpo", "best", "--study", "proxy", "--studies-dir", str(tmp_path / "studies")],
                           cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"3 of the proxy's best settings were within the resolution of each other on the tuning seed, so they " \
           f"ran again on the proxy, a round per seed of [{seed}] while still tied: trial {best.number} " \
           in shown.stderr
