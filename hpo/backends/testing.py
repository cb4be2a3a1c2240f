"""The contract suite: the checks every backend passes, the shipped trainers' and a plugin's alike
(``tests/hpo/backends/test_testing.py`` runs it for verl_core, verl, TRL and the toy plugin). Importable by a plugin's
own tests; pytest is imported only by :func:`run_check`, to skip a check that does not apply.

A backend under test is a :class:`Case`: the backend, an experiment of its trainer, and what only its tests know: the
trainer's own config keys (``knows``), how a complete checkpoint of its layout looks (``checkpoint``), and
experiments its trainer runs here for the checks that launch it. Each check takes the case and a fresh directory and
raises AssertionError naming what broke, or :class:`NotApplicable` when the backend lacks the feature it checks
(or the case lacks what it needs):

* :func:`check_plan`: ``plan`` of a first attempt gives argv, a metrics path the trainer is told, and total steps;
  every override it configures is a key of the trainer's own config;
* :func:`check_seed_keys` (``confirmation``): every seed key exists in the trainer's config, and so does every key of
  a confirmation run (its seeds, the held-out split); a confirmation run's configured overrides set its seeds;
* :func:`check_retry_resumes` (``resumable``): a retry of a chain whose first attempt left a checkpoint plans from it
  (its step, the curve up to it) and tells the process to continue from it; the resume keys are the trainer's own;
* :func:`check_pbt_segment` (``resumable`` with ``segments``): a segment's overrides are the trainer's keys, it
  trains to its end from its start checkpoint, and the command ``best --format command`` of a PBT study prints
  continues its checkpoint through the trainer's own keys;
* :func:`check_best_command`: the command ``best --format command`` prints is the trainer's, with its own keys;
* :func:`check_search_confirm_best` (``Case.experiment``): ``search``, ``confirm`` and ``best`` (both formats) run
  through the command line; a trainer without seed keys is refused by ``confirm`` with one line;
* :func:`check_pbt_search_best` (``Case.pbt_experiment``): a PBT study runs, and its ``best --format command``
  continues the final checkpoint through the trainer's own keys;
* :func:`check_best_of_study` (``Case.study``): ``best`` of a study the trainer already ran (a slow trainer's).

:data:`FAST` are the checks that launch nothing; :data:`CHECKS` all of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpo.backends._attempt import Attempt
from hpo.backends._base import Backend
from hpo.experiment import Space, format_value

__all__ = ["CHECKS", "FAST", "RUNS", "Case", "NotApplicable", "check_best_command", "check_best_of_study",
           "check_pbt_search_best", "check_pbt_segment", "check_plan", "check_retry_resumes",
           "check_search_confirm_best", "check_seed_keys", "override_keys", "run_check"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class NotApplicable(Exception):
    """The check does not apply to this case (the backend lacks the feature, or the case what the check needs)."""


@dataclasses.dataclass
class Case:
    """One backend under the contract suite.

    ``backend``: the backend; ``space``: an experiment of its trainer as the driver loads it
    (``hpo.backends.load_space``); ``knows``: whether a key is one of the trainer's own config (None: not known here,
    the key checks do not apply); ``checkpoint(checkpoints_dir, step)``: writes a complete checkpoint of the trainer's
    layout at ``step`` and returns its path (None: the retry check does not apply); ``experiment``,
    ``pbt_experiment``: experiment files its trainer runs here, small (search, confirm, best; a PBT study);
    ``study``: ``(studies_dir, study name)`` of a finished study of the trainer; ``env``: the environment of the
    command line (e.g. ``PYTHONPATH`` with a plugin's site)."""

    backend: Backend
    space: Space
    knows: Callable[[str], bool] | None = None
    checkpoint: Callable[[Path, int], Path] | None = None
    experiment: Path | None = None
    pbt_experiment: Path | None = None
    study: tuple[Path, str] | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = 600.0


def override_keys(argv: Sequence[str]) -> list[str]:
    """The keys of the ``key=value`` overrides of a command line: after an ``env [-u NAME] NAME=value`` prefix, every
    argument with ``=`` that is not a flag (a leading ``+`` of hydra's, which adds a key the config lacks, kept)."""
    args = list(argv)
    if args and args[0] == "env":
        i = 1
        while i < len(args) and (args[i] == "-u" or _ENV_NAME.match(args[i]) or args[i - 1] == "-u"):
            i += 1
        args = args[i:]
    return [a.partition("=")[0] for a in args if "=" in a and not a.startswith("-")]


def _unknown(case: Case, keys: Sequence[str]) -> list[str]:
    """The keys that are not the trainer's own (a key hydra adds with ``+`` is the experiment's by definition)."""
    assert case.knows is not None
    return [k for k in keys if not k.startswith("+") and not case.knows(k)]


def _need_keys(case: Case) -> Callable[[str], bool]:
    if case.knows is None:
        raise NotApplicable("the trainer's own config keys are not known here (Case.knows)")
    return case.knows


def _first_values(case: Case) -> dict[str, Any]:
    """A corner of the space the trainer accepts (its ``infeasible``), else the first corner."""
    import itertools

    space = case.space
    for combo in itertools.islice(itertools.product(*(p.corner_values() for p in space.params)), 64):
        values = {p.name: v for p, v in zip(space.params, combo, strict=True)}
        if case.backend.infeasible(space, values) is None:
            return values
    return {p.name: p.corner_values()[0] for p in space.params}


def _attempt(case: Case, trials: Path, number: int, **fields: Any) -> Attempt:
    return Attempt(space=case.space, values=_first_values(case), study="contract", number=number,
                   trial_dir=trials / str(number), trials_dir=trials, cwd=str(trials.parent), **fields)


# ----------------------------------------------------------------------------- the checks that launch nothing
def check_plan(case: Case, tmp: Path) -> None:
    """``plan`` of a first attempt: an argv of strings, the metrics file the trainer is told (argv or environment),
    the total steps; the configured overrides are the trainer's own keys."""
    launch = case.backend.plan(_attempt(case, tmp / "trials", 0))
    assert launch.argv and all(isinstance(a, str) for a in launch.argv), launch.argv
    told = [a for a in [*launch.argv, *launch.env.values()] if str(launch.metrics) in a]
    assert isinstance(launch.metrics, Path) and told, f"the trainer is not told its metrics file {launch.metrics}"
    steps = launch.config.total_steps
    assert isinstance(steps, int) and not isinstance(steps, bool) and steps > 0, f"total steps {steps!r}"
    if case.knows is not None:
        bad = _unknown(case, override_keys(launch.config.overrides))
        assert not bad, f"configured keys that are not the trainer's: {bad}"


def check_seed_keys(case: Case, tmp: Path) -> None:
    """Every seed key, and every key a confirmation run sets (its seeds, the held-out split), is one of the trainer's
    own; a confirmation run's configured overrides set every seed; a default seed is an integer or None."""
    confirmation = case.backend.confirmation
    if confirmation is None:
        raise NotApplicable(f"trial.backend {case.backend.name} has no confirmation feature")
    _need_keys(case)
    keys = tuple(confirmation.seed_keys)
    assert keys, "a confirmation feature names its seed keys"
    assert not _unknown(case, keys), f"seed keys that are not the trainer's: {_unknown(case, keys)}"
    for key in keys:
        seed = confirmation.default_seed(case.space, key)
        assert seed is None or (isinstance(seed, int) and not isinstance(seed, bool)), f"default seed {seed!r}"
    held = confirmation.heldout_overrides(case.space)
    assert not _unknown(case, list(held)), f"held-out keys that are not the trainer's: {_unknown(case, list(held))}"
    config = case.backend.configure(dataclasses.replace(_attempt(case, tmp / "trials", 0),
                                                        extra={**{k: 1007 for k in keys}, **held}))
    assert not _unknown(case, override_keys(config.overrides))
    for key in keys:
        assert any(o.partition("=")[0].lstrip("+") == key and o.partition("=")[2].strip("'\"") == "1007"
                   for o in config.overrides), f"a confirmation run's overrides do not set {key} to its seed"


def check_retry_resumes(case: Case, tmp: Path) -> None:
    """A retry (attempt 1 of a chain whose attempt 0, trial 3, saved a checkpoint at step 2 and logged steps 1-3)
    plans from that checkpoint: its step, the curve up to it, and a process told to continue from it through the
    trainer's own keys."""
    resumable = case.backend.resumable
    if resumable is None:
        raise NotApplicable(f"trial.backend {case.backend.name} does not resume (no resumable feature)")
    if case.checkpoint is None:
        raise NotApplicable("the case cannot write a checkpoint of the trainer's layout (Case.checkpoint)")
    trials = tmp / "trials"
    first = trials / "3"
    first.mkdir(parents=True)
    ckpt = case.checkpoint(first / "checkpoints", 2)
    metrics = case.backend.metrics_path(first, 0)
    metrics.write_text("".join(json.dumps({"step": s, "data": {"contract/score": float(s)}}) + "\n"
                               for s in (1, 2, 3)))
    launch = case.backend.plan(_attempt(case, trials, 5, history=(3,)))
    assert launch.resume is not None, "a retry does not resume its chain's complete checkpoint"
    assert launch.resume.checkpoint == ckpt and launch.resume.step == 2, (launch.resume.checkpoint, launch.resume.step)
    assert [s for s, _ in launch.resume.records()] == [1, 2], launch.resume.records()
    assert any(str(ckpt) in a for a in launch.argv), f"the process is not told to continue from {ckpt}"
    keys = override_keys(resumable.resume_overrides(ckpt))
    assert keys and (case.knows is None or not _unknown(case, keys)), f"resume keys {keys}"


def check_pbt_segment(case: Case, tmp: Path) -> None:
    """A PBT segment: its overrides (the trainer's keys) train to its end, from its start checkpoint when it has
    one; ``best --format command`` of a PBT study continues the final checkpoint through the trainer's own keys."""
    resumable = case.backend.resumable
    if resumable is None or resumable.segments is None:
        raise NotApplicable(f"trial.backend {case.backend.name} runs no PBT segments")
    first, start = resumable.segments(case.space, 4, None)
    assert start is None, "a first segment starts afresh"
    ckpt = tmp / "pbt" / resumable.step_name(4)
    ckpt.mkdir(parents=True)
    tail, start = resumable.segments(case.space, 8, str(ckpt))
    assert start == ckpt, f"the segment resumes {start}, not its start checkpoint {ckpt}"
    launch = case.backend.plan(_attempt(case, tmp / "trials", 0, tail=tuple(tail), start=start))
    assert launch.config.total_steps == 8, f"a segment to step 8 trains to {launch.config.total_steps}"
    assert any(str(ckpt) in a for a in launch.argv), f"the segment's process is not told to continue from {ckpt}"
    fixed = [f"{k}={format_value(v)}" for k, v in case.space.fixed_overrides().items()]
    line = case.backend.command_line(case.space, [*fixed, *resumable.resume_overrides(ckpt)])
    assert any(str(ckpt) in a for a in line), f"best --format command does not continue {ckpt}: {line}"
    if case.knows is not None:
        bad = _unknown(case, [*override_keys(first), *override_keys(tail), *override_keys(line)])
        assert not bad, f"segment or resume keys that are not the trainer's: {bad}"


def check_best_command(case: Case, tmp: Path) -> None:
    """The command ``best --format command`` prints for a trial: the trainer's own program and keys."""
    config = case.backend.configure(Attempt(space=case.space, values=_first_values(case), trial_dir=Path(".")))
    line = case.backend.command_line(case.space, config.overrides)
    assert line and all(isinstance(a, str) for a in line), line
    if case.knows is not None:
        bad = _unknown(case, override_keys(line))
        assert not bad, f"best --format command names keys that are not the trainer's: {bad}"


# ----------------------------------------------------------------------------- the checks that run the trainer
def _cli(case: Case, studies: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **case.env}
    return subprocess.run([sys.executable, "-m", "hpo", *args, "--studies-dir", str(studies)], env=env,
                          cwd=str(studies.parent), capture_output=True, text=True, timeout=case.timeout_s)


def _ok(res: subprocess.CompletedProcess[str], what: str) -> str:
    assert res.returncode == 0, f"{what}: exit {res.returncode}: {res.stderr[-2000:]}"
    return res.stdout


def _command_line_keys(case: Case, stdout: str) -> None:
    line = shlex.split(stdout.strip().splitlines()[-1])
    assert line, "best --format command printed nothing"
    if case.knows is not None:
        bad = _unknown(case, override_keys(line))
        assert not bad, f"best --format command names keys that are not the trainer's: {bad}"


def check_search_confirm_best(case: Case, tmp: Path) -> None:
    """``search`` (two trials), ``confirm`` (the best, one fresh seed) and ``best`` in both formats run through the
    command line; without seed keys ``confirm`` is one line naming ``study.confirm.seed_key``, exit 2."""
    if case.experiment is None:
        raise NotApplicable("no experiment of the trainer runs here (Case.experiment)")
    studies = tmp / "studies"
    _ok(_cli(case, studies, "search", "--space", str(case.experiment), "--study", "contract", "--n-trials", "2"),
        "search")
    confirm = _cli(case, studies, "confirm", "--study", "contract", "--top", "1", "--seeds", "1")
    if case.backend.confirmation is None and not case.space.study.confirm.seed_key:
        lines = confirm.stderr.strip().splitlines()
        assert confirm.returncode == 2 and len(lines) == 1 and "study.confirm.seed_key" in lines[0], confirm.stderr
    else:
        _ok(confirm, "confirm")
    best = _cli(case, studies, "best", "--study", "contract")
    shown = _ok(best, "best") + best.stderr
    assert confirm.returncode != 0 or "confirmed mean" in shown, f"best after confirm shows no confirmed mean: {shown}"
    _command_line_keys(case, _ok(_cli(case, studies, "best", "--study", "contract", "--format", "command"),
                                 "best --format command"))


def check_pbt_search_best(case: Case, tmp: Path) -> None:
    """A PBT study runs through the command line, and its ``best --format command`` continues the final
    checkpoint through the trainer's own keys."""
    resumable = case.backend.resumable
    if resumable is None or resumable.segments is None:
        raise NotApplicable(f"trial.backend {case.backend.name} runs no PBT segments")
    if case.pbt_experiment is None:
        raise NotApplicable("no PBT experiment of the trainer runs here (Case.pbt_experiment)")
    studies = tmp / "studies"
    _ok(_cli(case, studies, "search", "--space", str(case.pbt_experiment), "--study", "contract_pbt"), "pbt search")
    out = _ok(_cli(case, studies, "best", "--study", "contract_pbt", "--format", "command"), "best --format command")
    _command_line_keys(case, out)
    resume_keys = set(override_keys(resumable.resume_overrides(Path("checkpoint"))))
    assert resume_keys <= set(override_keys(shlex.split(out.strip().splitlines()[-1]))), \
        f"best --format command of a PBT study does not continue its checkpoint ({sorted(resume_keys)}): {out}"


def check_best_of_study(case: Case, tmp: Path) -> None:
    """``best`` and ``best --format command`` of a study the trainer already ran."""
    if case.study is None:
        raise NotApplicable("no finished study of the trainer here (Case.study)")
    studies, name = case.study
    _ok(_cli(case, studies, "best", "--study", name), "best")
    _command_line_keys(case, _ok(_cli(case, studies, "best", "--study", name, "--format", "command"),
                                 "best --format command"))


FAST = (check_plan, check_seed_keys, check_retry_resumes, check_pbt_segment, check_best_command)
RUNS = (check_search_confirm_best, check_pbt_search_best, check_best_of_study)
CHECKS = FAST + RUNS


def run_check(check: Callable[[Case, Path], None], case: Case, tmp: Path) -> None:
    """``check(case, tmp)`` in a pytest test: a check that does not apply is skipped, with its reason."""
    try:
        check(case, tmp)
    except NotApplicable as err:
        import pytest

        pytest.skip(str(err))
