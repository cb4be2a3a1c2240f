"""What ``verl-hpo best`` prints: the best trial as trainer overrides (its header line on stderr), a pareto study's
front, a pbt study's winning lineage, a throughput study's re-measured pick (or, when no setting faster than the
user's was found, the user's own settings), and after ``confirm`` the best confirmed mean with its table and
verdict. A study with nothing to show raises :class:`NoBest` (its line and exit code)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from hpo.experiment import Space


class NoBest(Exception):
    """Nothing to print: the message is the ``error:`` line, ``code`` the exit code (2 a bad flag, 1 no trial)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def print_best(space: Space, study: Any, study_name: str, fmt: str, trial_number: int | None,
               hint: Callable[[str], str]) -> int:
    """Print the best (or ``trial_number``'s) trial of ``study`` in ``fmt``; the exit code. ``hint(cmd)`` is the
    command line that runs ``verl-hpo <cmd>`` on this study."""
    from hpo.reporting._report import best_trial, front_table, objective_names, pareto_front, render_best

    if space.study.strategy == "pbt":  # the winning lineage and its schedule
        return _pbt_best(space, study, study_name, fmt, trial_number)
    if fmt == "schedule":
        raise NoBest(f"--format schedule: study {study_name!r} is not a pbt study (study.strategy: pbt)", 2)
    if space.study.kind == "throughput" and trial_number is None:
        from hpo.reporting._speed import render_yours, speed_lines, speed_report

        report = speed_report(study, space)
        if report is not None:  # re-measured: the recommended pick, never one whose math differs
            print("\n".join(f"# {line}" for line in speed_lines(report, space)), file=sys.stderr)
            if report.recommended is None and report.none_faster:  # the user's own settings: nothing to change
                print(render_yours(space, fmt))
                return 0
            if report.recommended is None:
                return 1
            print(render_best(space, report.recommended.trial, fmt))
            return 0
        print(f"# not re-measured yet ({hint('confirm')} checks the pick against your config "
              "and its math); the fastest search trial:", file=sys.stderr)
    if space.objective.multi and trial_number is None:
        front = pareto_front(study)
        if not front:
            raise NoBest(f"study {study_name!r} has no feasible completed trial with finite values yet", 1)
        print(f"# pareto front of study {study_name} ({space.objective.label}); "
              f"overrides of one: {hint('best')} --trial N", file=sys.stderr)
        print(front_table(study))
        return 0
    if trial_number is not None:
        trial = next((t for t in study.get_trials(deepcopy=False) if t.number == trial_number), None)
        if trial is None or trial.state.name != "COMPLETE":
            raise NoBest(f"--trial {trial_number}: no completed trial with that number in study {study_name!r}", 2)
    elif _print_confirmed(space, study, study_name, fmt):
        return 0
    else:
        trial = best_trial(study)
    if trial is None:
        raise NoBest(f"study {study_name!r} has no feasible completed trial with a finite value yet", 1)
    shown = ", ".join(f"{n}={v:.4g}" for n, v in zip(objective_names(study), trial.values, strict=True))
    print(f"# trial {trial.number} of study {study_name} ({space.objective.label}): {shown}{_on_proxy(trial)}",
          file=sys.stderr)
    _print_dropped(trial)
    _print_fidelity(study)
    print(render_best(space, trial, fmt))
    return 0


def _print_dropped(trial: Any) -> None:
    """The rows of its data the trial's trainer dropped (its value was computed without them), on stderr."""
    from hpo.reporting._report import dropped_rows

    n = dropped_rows(trial)
    if n:
        print(f"# trial {trial.number} lost {n} row(s) of its data: its trainer went on without them and its value "
              f"was computed without them (first: {trial.user_attrs.get('dropped_rows_error')})", file=sys.stderr)


def _on_proxy(trial: Any) -> str:
    """A proxy search's best before any target run: its value is the proxy model's (``study.fidelity.proxy``)."""
    from hpo.record import is_promoted, is_proxy

    if is_proxy(trial):
        return " on the proxy model (not run on the target yet)"
    return " (a promoted setting's target run at its short budget)" if is_promoted(trial) else ""


def _print_fidelity(study: Any, spent: bool = True) -> None:
    """A proxy search's check and what it saved or wasted, and (``spent``) the spend split (stderr); nothing for
    another study."""
    from hpo.record import study_cost
    from hpo.reporting._summary import fidelity_summary

    line = fidelity_summary(study).strip()
    if line:
        print(f"# {line}", file=sys.stderr)
        if spent:
            print(f"# spent: {study_cost(study.get_trials(deepcopy=False)).text()}", file=sys.stderr)


def _pbt_best(space: Space, study: Any, study_name: str, fmt: str, trial_number: int | None) -> int:
    """A pbt study: the winning lineage (or the one ending in segment ``trial_number``) and its schedule."""
    from hpo.reporting._pbt import best_lineage, render_pbt_best

    found = best_lineage(space, study, trial_number)
    if found is None and trial_number is not None:
        raise NoBest(f"--trial {trial_number}: no segment with a value in study {study_name!r}", 1)
    if found is None:  # none yet, or every member collapsed: which, and why
        from hpo.reporting._pbt import why_no_best

        raise NoBest(why_no_best(space, study), 1)
    header, out = render_pbt_best(space, found, fmt)
    print(header, file=sys.stderr)
    print(out)
    return 0


def _print_confirmed(space: Space, study: Any, study_name: str, fmt: str) -> bool:
    """After ``confirm``: the best confirmed mean (or a tied, preferred one), not the luckiest tuning run, with the
    confirmed table and the verdict on stderr; False when no configuration is confirmed yet."""
    from hpo.study import confirmed

    ranked = confirmed(study)
    if not ranked:
        return False
    from hpo.reporting._report import confirmed_table, render_best
    from hpo.reporting._verdict import study_verdict, verdict_lines

    v = study_verdict(study, space)
    top = ranked[0] if v is None else v.pick
    test = f"; held-out test {top.test_mean:.4g} +- {top.test_std:.3g}" if top.test_values else ""
    print(f"# trial {top.trial.number} of study {study_name} ({space.objective.label}): confirmed mean "
          f"{top.mean:.4g} +- {top.std:.3g} over {top.n} fresh seed(s) (min {min(top.values):.4g}, max "
          f"{max(top.values):.4g}; tuning run {top.trial.values[0]:.4g}){test}; ranking by confirmed mean:",
          file=sys.stderr)
    _print_dropped(top.trial)
    print("\n".join(f"#   {line}" for line in confirmed_table(study, space).splitlines()), file=sys.stderr)
    print("\n".join(f"# {line}" for line in verdict_lines(study, space)), file=sys.stderr)
    _print_fidelity(study, spent=False)  # the verdict said what was spent
    print(render_best(space, top.trial, fmt))
    return True
