"""``verl-hpo search | resume | best``.

Exit codes: 0 done; 2 bad input (one ``error: ...`` line on stderr, no study created or touched);
1 runtime error; 130 / 143 stopped by SIGINT / SIGTERM (running trials queued for ``resume``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from hpo._space import SPACES_DIR, Space, SpaceError, load_space

ENV_STUDIES_DIR = "VERL_HPO_STUDIES_DIR"
ENV_SPACES_DIR = "VERL_HPO_SPACES_DIR"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + message)
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="verl-hpo", description="Hyperparameter search over verl_core trainer runs (Optuna).")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--storage", help="Optuna storage URL (default sqlite:///<studies-dir>/<study>.db); any "
                                          "SQLAlchemy URL, or redis://... (JournalStorage, needs redis)")
        sp.add_argument("--studies-dir", type=Path, default=None,
                        help=f"where studies and trial logs live (default ${ENV_STUDIES_DIR} or ./studies)")

    s = sub.add_parser("search", help="run (or continue) a study of an experiment file")
    s.add_argument("--space", required=True, help="search_spaces/<NAME>.yaml or a path")
    s.add_argument("--study", help="study name (default: the space name)")
    s.add_argument("--n-trials", type=int, help="finished trials the study runs to (default: study.n_trials)")
    s.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="space field (study.n_trials=4, params.kl_coef.high=0.1, trial.timeout_s=60) or fixed "
                        "trainer override (trainer.total_training_steps=10); repeatable")
    common(s)

    r = sub.add_parser("resume", help="continue a study until it has n_trials finished trials")
    r.add_argument("--study", required=True)
    r.add_argument("--n-trials", type=int, help="raise (or lower) the study's target")
    common(r)

    d = sub.add_parser("dashboard", help="write <studies-dir>/<study>/dashboard.html (one self-contained page)")
    d.add_argument("--study", required=True)
    d.add_argument("--out", type=Path, help="default <studies-dir>/<study>/dashboard.html")
    common(d)

    b = sub.add_parser("best", help="print the best trial as trainer overrides (pareto studies: the front)")
    b.add_argument("--study", required=True)
    b.add_argument("--format", choices=("overrides", "yaml", "command"), default="overrides")
    b.add_argument("--trial", type=int, default=None, help="print this trial's overrides instead of the best")
    common(b)
    return p


def _studies_dir(arg: Path | None) -> Path:
    return arg if arg is not None else Path(os.environ.get(ENV_STUDIES_DIR, "studies"))


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


@contextmanager
def _stop_on_signals(stop: threading.Event, got: list[int]) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` (trials see it within ~0.1 s) instead of raising mid-storage-write."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        if not got:
            got.append(signum)
            print(f"\n{signal.Signals(signum).name}: stopping running trials ...", file=sys.stderr, flush=True)
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(space: Space, study_name: str, storage_url: str, studies_dir: Path, resume: bool,
         n_trials: int | None) -> int:
    from hpo._driver import (
        EXIT_INTERRUPTED,
        Driver,
        DriverError,
        TrialInterrupted,
        load_stored,
        n_finished,
        open_study,
        quiet_optuna,
    )
    from hpo._report import Reporter

    quiet_optuna()
    stop, got = threading.Event(), list[int]()
    with _stop_on_signals(stop, got):
        if resume:
            space, study = load_stored(study_name, storage_url, n_trials)
        else:
            study = open_study(space, study_name, storage_url)
        target = space.study.n_trials
        reporter = Reporter(sys.stdout, target, space.objective.direction_literal)
        driver = Driver(space, study, studies_dir, reporter, stop)
        reporter.header(study_name, storage_url, str(driver.trials_dir), n_finished(study), target)
        from hpo._dashboard import DashboardCallback, dashboard_path, write_dashboard

        page = dashboard_path(studies_dir, study_name)
        try:
            ran = driver.run(target, [DashboardCallback(page, storage_url, studies_dir, every=5)])
        except TrialInterrupted:
            ran = -1
        except DriverError as err:
            return _fail(str(err), 1)
        try:
            write_dashboard(study, page, storage_url=storage_url, studies_dir=studies_dir)
            reporter.note(f"dashboard: {page}")
        except Exception as err:  # noqa: BLE001 - the page must never fail a search
            reporter.note(f"dashboard not written: {type(err).__name__}: {err}")
        if got or ran < 0:
            signum = got[0] if got else signal.SIGINT
            print(f"stopped by {signal.Signals(signum).name}: {n_finished(study)}/{target} trials finished; "
                  f"interrupted trials are queued: verl-hpo resume --study {study_name}"
                  + (f" --storage {storage_url}" if "sqlite" not in storage_url else ""), file=sys.stderr)
            return EXIT_INTERRUPTED.get(signum, 130)
        if ran == 0:
            reporter.note(f"study {study_name} already has {n_finished(study)} finished trials (target {target})")
        print(driver.summary(storage_url))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    studies_dir = _studies_dir(args.studies_dir)
    from hpo._storage import STORAGE_ERRORS, check_storage_url, default_storage_url, sqlite_path

    try:
        if args.cmd == "search":
            if args.n_trials is not None and args.n_trials <= 0:
                return _fail(f"--n-trials {args.n_trials}: must be positive")
            overrides = list(args.override)
            if args.n_trials is not None:
                overrides.append(f"study.n_trials={args.n_trials}")
            spaces_dir = Path(os.environ.get(ENV_SPACES_DIR, str(SPACES_DIR)))
            space = load_space(args.space, overrides, spaces_dir)
            study_name = args.study or space.name
            storage_url = args.storage or default_storage_url(studies_dir, study_name)
            check_storage_url(storage_url)
            studies_dir.mkdir(parents=True, exist_ok=True)
            return _run(space, study_name, storage_url, studies_dir, False, None)
        storage_url = args.storage or default_storage_url(studies_dir, args.study)
        check_storage_url(storage_url)
        db = sqlite_path(storage_url)
        if db is not None and not db.is_file():
            return _fail(f"no study {args.study!r}: {db} does not exist (start one with verl-hpo search)")
        if args.cmd == "dashboard":
            from hpo._dashboard import dashboard_command

            return dashboard_command(args.study, storage_url, studies_dir, args.out)
        if args.cmd == "resume":
            if args.n_trials is not None and args.n_trials <= 0:
                return _fail(f"--n-trials {args.n_trials}: must be positive")
            return _run(None, args.study, storage_url, studies_dir, True, args.n_trials)  # type: ignore[arg-type]
        return _best(args.study, storage_url, args.format, args.trial)
    except SpaceError as err:
        return _fail(str(err))
    except STORAGE_ERRORS as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return _fail(f"storage {args.storage or 'default'}: {first}", 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _best(study_name: str, storage_url: str, fmt: str, trial_number: int | None = None) -> int:
    from hpo._driver import load_stored, quiet_optuna
    from hpo._report import best_trial, front_table, objective_names, pareto_front, render_best

    quiet_optuna()
    space, study = load_stored(study_name, storage_url, None)
    if space.objective.multi and trial_number is None:
        front = pareto_front(study)
        if not front:
            return _fail(f"study {study_name!r} has no feasible completed trial with finite values yet", 1)
        print(f"# pareto front of study {study_name} ({space.objective.label}); "
              f"overrides of one: verl-hpo best --study {study_name} --trial N", file=sys.stderr)
        print(front_table(study))
        return 0
    if trial_number is not None:
        trial = next((t for t in study.get_trials(deepcopy=False) if t.number == trial_number), None)
        if trial is None or trial.state.name != "COMPLETE":
            return _fail(f"--trial {trial_number}: no completed trial with that number in study {study_name!r}")
    else:
        trial = best_trial(study)
    if trial is None:
        return _fail(f"study {study_name!r} has no feasible completed trial with a finite value yet", 1)
    shown = ", ".join(f"{n}={v:.4g}" for n, v in zip(objective_names(study), trial.values, strict=True))
    print(f"# trial {trial.number} of study {study_name} ({space.objective.label}): {shown}", file=sys.stderr)
    print(render_best(space, trial, fmt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
