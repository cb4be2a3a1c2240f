"""One recorded first rollout per seed of a throughput study's confirmation, replayed into its other runs.

The same-math check compares the first training step of the user's config and of a pick on one seed. Where the
trainer's rollout does not reproduce run to run (verl 0.9.1 samples in an asynchronous engine and orders a batch by
when each sample finished), two runs update on different samples and only a change of the update's scale shows. So
the first run of each seed records its first step's rollout and every later run of that seed (the other members of
the block, the control) replays it: both updates then see the same samples in the same order, and their losses and
gradient norm agree to float noise (``hpo.reporting._speed``: the strict check).

The driver tells a run through its environment (:func:`first_rollout_env`): ``VERL_HPO_FIRST_ROLLOUT_RECORD`` (a
directory to record into) or ``VERL_HPO_FIRST_ROLLOUT_REPLAY`` (a finished run's record), and
``VERL_HPO_FIRST_ROLLOUT_REPORT`` (where the trainer's processes say what they did). A trainer that knows these
(verl: ``hpo/backends/verl/in_verl/verl_hpo_first_rollout.py``) honours them; any other ignores them, its report stays
empty, and its pairs are checked the loose way. After the run the driver reads the report (:func:`first_rollout`):
``mode`` is ``recorded`` (it recorded and replayed nothing), ``replayed`` (every first-step request answered from the
record: ``source`` is the recording run's number), or ``sampled``. A record is used only from a run that finished
(COMPLETE) with ``mode: recorded``. Reports are a trial's output: read as untrusted (regular files only, bounded).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.backends import RECORD_ENV, REPLAY_ENV, REPORT_ENV
from hpo.record import ATTR_CONFIRM_SEED, is_confirm

ATTR = "first_rollout"  # user attr: {"mode", "source", "recorded", "replayed", "missed"}
SOURCE_ATTR = "first_rollout_source"  # user attr set at launch: the run whose record this one replays
DIR = "first-rollout"  # under a run's trial directory: record/ and report/
MAX_REPORTS, MAX_REPORT_BYTES = 256, 4096


def record_dir(trial_dir: Path) -> Path:
    return trial_dir / DIR / "record"


def report_dir(trial_dir: Path) -> Path:
    return trial_dir / DIR / "report"


def recorded_source(study: optuna.Study, seed: Any, trials_dir: Path) -> int | None:
    """The oldest finished run of this seed's confirmation that recorded its first rollout (None: none yet)."""
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number):
        info = t.user_attrs.get(ATTR)
        if is_confirm(t) and t.system_attrs.get(ATTR_CONFIRM_SEED) == seed and isinstance(info, dict) \
                and info.get("mode") == "recorded" and record_dir(trials_dir / str(t.number)).is_dir():
            return t.number
    return None


def first_rollout_env(study: optuna.Study, trial: FrozenTrial, kind: str, trials_dir: Path,
                      trial_dir: Path) -> tuple[dict[str, str], int | None]:
    """The environment that makes a throughput study's confirmation run record its first rollout (the first run of
    its seed) or replay the recorded one, and the recording run's number (None: it records); ({}, None) for any
    other run."""
    if kind != "throughput" or not is_confirm(trial) or ATTR_CONFIRM_SEED not in trial.system_attrs:
        return {}, None
    source = recorded_source(study, trial.system_attrs[ATTR_CONFIRM_SEED], trials_dir)
    env = {REPORT_ENV: str(report_dir(trial_dir).absolute())}
    if source is None:
        env[RECORD_ENV] = str(record_dir(trial_dir).absolute())
    else:
        env[REPLAY_ENV] = str(record_dir(trials_dir / str(source)).absolute())
    return env, source


def _counts(trial_dir: Path) -> dict[str, int]:
    """The sums of the processes' reports (a file that is not a small regular JSON object of counts: skipped)."""
    out = {"recorded": 0, "replayed": 0, "missed": 0}
    root = report_dir(trial_dir)
    try:
        names = sorted(os.listdir(root))[:MAX_REPORTS]
    except OSError:
        return out
    for name in names:
        path = root / name
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REPORT_BYTES or not name.endswith(".json"):
                continue
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            for k in out:
                v = data.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31:
                    out[k] += v
    return out


def first_rollout(trial_dir: Path, source: int | None, asked: bool) -> dict[str, Any] | None:
    """What a run did with its first rollout (the :data:`ATTR` user attr); None when it was not asked to."""
    if not asked:
        return None
    counts = _counts(trial_dir)
    if source is None:
        mode = "recorded" if counts["recorded"] and not counts["replayed"] and not counts["missed"] else "sampled"
    else:
        mode = "replayed" if counts["replayed"] and not counts["missed"] else "sampled"
    return {"mode": mode, "source": source, **counts}


def strict_pair(a: FrozenTrial, b: FrozenTrial) -> bool:
    """Two runs of one seed updated on the same first rollout: one replayed the other's record, or both replayed
    the same one."""
    ia, ib = a.user_attrs.get(ATTR), b.user_attrs.get(ATTR)
    if not (isinstance(ia, dict) and isinstance(ib, dict)):
        return False
    ma, mb = ia.get("mode"), ib.get("mode")
    if ma == "replayed" and mb == "recorded":
        return ia.get("source") == b.number
    if mb == "replayed" and ma == "recorded":
        return ib.get("source") == a.number
    return ma == mb == "replayed" and ia.get("source") is not None and ia.get("source") == ib.get("source")
