"""``trial.keep_checkpoints`` in a proxy search (issue 51): proxy and target runs are ranked apart, so a small model's
high values never push the target's checkpoints out (a real SQLite study, real trial directories)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpo.record import ATTR_FIDELITY, TRIAL_MARKER
from hpo.study._checkpoints import CHECKPOINTS, clean_after


def _trial(study: optuna.Study, trials_dir: Path, value: float, fidelity: str) -> optuna.trial.FrozenTrial:
    study.add_trial(optuna.create_trial(state=TrialState.COMPLETE, value=value, params={}, distributions={},
                                        system_attrs={ATTR_FIDELITY: fidelity}))
    t = study.get_trials(deepcopy=False)[-1]
    d = trials_dir / str(t.number)
    (d / CHECKPOINTS / "global_step_4").mkdir(parents=True)
    (d / CHECKPOINTS / "global_step_4" / "model.bin").write_bytes(b"x" * 1024)
    (d / TRIAL_MARKER).write_text("")
    return t


def test_proxy_and_target_runs_keep_their_best_apart(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    trials_dir = tmp_path / "trials"
    proxies = [_trial(study, trials_dir, v, "proxy") for v in (0.95, 0.97)]  # the small model scores higher
    target = _trial(study, trials_dir, 0.80, "target")
    _, kept, _ = clean_after(study, target, 0.80, trials_dir, 1, proxies)
    assert kept and (trials_dir / str(target.number) / CHECKPOINTS).is_dir()  # the best target run keeps its own
    assert (trials_dir / str(proxies[1].number) / CHECKPOINTS).is_dir()  # and the best proxy run its own
    worse = _trial(study, trials_dir, 0.70, "target")
    _, kept, freed = clean_after(study, worse, 0.70, trials_dir, 1, [*proxies, target])
    assert not kept and freed > 0 and not (trials_dir / str(worse.number) / CHECKPOINTS).exists()
    assert (trials_dir / str(target.number) / CHECKPOINTS).is_dir()
