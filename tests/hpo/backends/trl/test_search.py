"""The shipped TRL experiment end to end: ``verl-hpo search --space trl_grpo_arith`` runs TRL's GRPOTrainer for real
on the CPU (4 trials, one at a time), prunes a trial that falls behind, and ``verl-hpo best`` recommends a setting."""

from __future__ import annotations

import shlex
from pathlib import Path

from optuna.trial import TrialState

from tests.hpo.conftest import load, run_cli


def test_search_prunes_and_best_recommends(studies: Path, tiny_model_dir: Path) -> None:
    # One trial at a time: the median pruner then sees the same finished trials on every run (the sampler's Latin
    # hypercube from seed 0 and TRL's seeded training are deterministic), so the outcome below is too.
    res = run_cli(["search", "--space", "trl_grpo_arith", "--n-trials", "4", "--override", "trial.n_jobs=1"], studies,
                  timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    trials = load(studies, "trl_grpo_arith").get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert len(finished) >= 4
    assert pruned and all(t.user_attrs["stop_reason"] == "pruned" for t in pruned)
    assert all(t.last_step is not None and t.last_step < 12 for t in pruned)  # stopped before the last step
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete and max(t.value or 0.0 for t in complete) > 0.5  # some setting learned (0.02 greedy at step 0)
    assert not any("fail_reason" in t.user_attrs for t in trials)
    trial_dir = Path(complete[0].user_attrs["trial_dir"])
    assert (trial_dir / "metrics.jsonl").is_file() and "learning_rate" in (trial_dir / "config.yaml").read_text()
    best = run_cli(["best", "--study", "trl_grpo_arith"], studies)
    assert best.returncode == 0, best.stderr
    assert "learning_rate=" in best.stdout and "num_generations=" in best.stdout
    # the command a user runs outside the driver is TRL's launcher with the config, not the default trainer's
    command = run_cli(["best", "--study", "trl_grpo_arith", "--format", "command"], studies)
    assert command.returncode == 0, command.stderr
    argv = shlex.split(command.stdout.strip().splitlines()[-1])
    assert argv[1].endswith("hpo/backends/trl/_train.py") and argv[2:4] == ["--config", str(
        Path("search_spaces/trl_configs/grpo_arith.yaml").resolve())] and "verl_core" not in argv
    assert any(a.startswith("learning_rate=") for a in argv) and "max_steps=12" in argv
