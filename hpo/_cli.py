"""``verl-hpo search | resume | worker | confirm | validate | rehearse | dashboard | track | best``.

Exit codes: 0 done; 2 bad input (one ``error: ...`` line on stderr, no study created or touched);
1 runtime error; 130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP (running trials queued for ``resume``;
a second signal forces the exit at once, and a signal that arrives once the study is done changes nothing).

Untrusted input: study names are checked (:func:`hpo.storages._storage.check_study_name`), files are written only
under the studies directory, storage passwords are masked wherever a URL is shown, and a stored experiment
that runs code is run only when it matches a local file or the user says so (:mod:`hpo.experiment._trust`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NoReturn

from hpo.analysis import FileRefused, check_regular
from hpo.backends import load_checked_space, load_space
from hpo.experiment._space import SPACES_DIR, Space, SpaceError, StudySpec
from hpo.experiment._tracking import TRACKING_FLAG_HELP
from hpo.storages._storage import mask_url

EXIT_SIGNAL: dict[int, int] = {int(signal.SIGINT): 130, int(signal.SIGTERM): 143, int(signal.SIGHUP): 129}
ENV_STUDIES_DIR = "VERL_HPO_STUDIES_DIR"
ENV_SPACES_DIR = "VERL_HPO_SPACES_DIR"
MAX_METRICS_BYTES = 256 << 20  # validate --metrics: a long verl run's metrics file is tens of MB
MAX_ERROR_CHARS = 2000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + message)
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="verl-hpo", description="Hyperparameter search over verl_core trainer runs (Optuna).")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    def trust_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--space", default=None, metavar="FILE",
                        help="local experiment file to check the stored one against (default: the file the study "
                             "was made from, if it is here)")
        sp.add_argument("--trust-stored-experiment", action="store_true",
                        help="run the stored experiment's commands, environment and user code even when no local "
                             "file matches (only for storages nobody else can write)")

    def tracking_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--tracking", action="append", default=[], metavar="SPEC", help=TRACKING_FLAG_HELP)
        sp.add_argument("--tracking-optional", action="store_true",
                        help="a tracker whose package is missing or whose server does not answer is a warning and "
                             "the study runs without it (default: an error before the study starts)")

    def ray_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--ray-address", default=None, metavar="URL",
                        help="trial.executor ray: the cluster's dashboard (http://head:8265); default "
                             "trial.ray.address, else $RAY_ADDRESS")

    def budget_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--budget", type=float, default=None, metavar="RUNS",
                        help="full-run equivalents the search and its confirmation may spend together (default: "
                             "study.budget; none)")

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
    tracking_args(s)
    budget_arg(s)
    ray_arg(s)
    common(s)

    r = sub.add_parser("resume", help="continue a study until it has n_trials finished trials")
    r.add_argument("--study", required=True)
    r.add_argument("--n-trials", type=int, help="raise (or lower) the study's target")
    ray_arg(r)
    trust_args(r)
    tracking_args(r)
    budget_arg(r)
    common(r)

    w = sub.add_parser("worker", help="join an existing study (its stored experiment) and run trials until the "
                                      "study's target is reached; run one per host or GPU box")
    w.add_argument("--study", required=True)
    w.add_argument("--n-jobs", type=int, default=None, help="trials this worker runs at once (default: the "
                                                            "experiment's trial.n_jobs)")
    w.add_argument("--devices", default=None, metavar="0,1,..",
                   help="GPU ids this worker may use (default: the experiment's trial.devices, else detected)")
    ray_arg(w)
    trust_args(w)
    tracking_args(w)
    budget_arg(w)
    common(w)

    c = sub.add_parser("confirm", help="re-run the top trials with fresh seeds (as tagged trials of the study); "
                                       "best then ranks by the confirmed mean")
    c.add_argument("--study", required=True)
    c.add_argument("--top", type=int, default=None, metavar="K",
                   help="configurations to confirm, best first (default: the experiment's study.confirm.top_k)")
    c.add_argument("--seeds", type=int, default=None, metavar="S",
                   help="fresh seeds per configuration (default: study.confirm.seeds); never a tuning seed")
    trust_args(c)
    tracking_args(c)
    budget_arg(c)
    common(c)

    v = sub.add_parser("validate", help="check an experiment file without running it: the space, every corner "
                                        "against the trainer config, and each corner's memory estimate")
    v.add_argument("--space", required=True, help="search_spaces/<NAME>.yaml or a path")
    v.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="as for search")
    v.add_argument("--metrics", type=Path, default=None, metavar="JSONL",
                   help="verl spaces: a previous run's verl metrics file; its largest response_length/mean and "
                        "prompt_length/mean are the expected lengths (a corner is refused only when it does not "
                        "fit at those; the worst case only warns)")

    rh = sub.add_parser("rehearse", help="verl experiments: run the experiment's own pipeline (config, data, reward, "
                                         "objective, corners, a resume) shrunk to a small model on this CPU, and "
                                         "report what would fail a real study; exit 0 it would run, 1 it would fail, 3 "
                                         "a corner could not finish on this machine (not a failure)")
    rh.add_argument("--space", required=True, help="search_spaces/<NAME>.yaml or a path (trial.backend: verl)")
    rh.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="as for search (e.g. "
                    "actor_rollout_ref.model.path=/local/model/dir)")
    rh.add_argument("--tokenizer", type=Path, default=None, metavar="DIR",
                    help="the model's tokenizer (tokenizer.json, tokenizer_config.json) when neither the model path "
                         "nor the Hugging Face cache has it")
    rh.add_argument("--format", choices=("text", "md"), default="text", help="md: a report to paste into a ticket")
    rh.add_argument("--quick", action="store_true", help="the default point only, without the kill and resume: a "
                                                         "first look in a third of the time")
    rh.add_argument("--recheck", action="store_true", help="run nothing: the checks again on this experiment's last "
                                                           "rehearsal (after fixing e.g. the objective's name)")
    rh.add_argument("--corner-timeout", type=float, default=None, metavar="S",
                    help="seconds each corner's run may take before it is reported as not finished here (exit 3, "
                         "not a failure); default trial.timeout_s, else 1800")
    rh.add_argument("--gpus", type=int, default=None, metavar="N",
                    help="estimate each corner's GPU memory for trials of N GPUs (default trial.gpus_per_trial)")
    rh.add_argument("--gpu-memory", default=None, metavar="SIZE",
                    help="the real study's GPU size for that estimate, e.g. 80GiB (default: this host's GPU, else 80)")
    rh.add_argument("--reward-timeout", type=float, default=120.0, metavar="S",
                    help="seconds the reward function may take over all its calls of the reward check (default 120)")
    rh.add_argument("--studies-dir", type=Path, default=None,
                    help=f"its files go to <studies-dir>/rehearsals/<space> (default ${ENV_STUDIES_DIR} or ./studies)")

    d = sub.add_parser("dashboard", help="write <studies-dir>/<study>/dashboard.html (one self-contained page)")
    d.add_argument("--study", required=True)
    d.add_argument("--out", type=Path, help="default <studies-dir>/<study>/dashboard.html; any path of yours")
    common(d)

    t = sub.add_parser("track", help="log to MLflow / W&B what this host's drivers of a study could not (a tracking "
                                     "server that was down past tracking.flush_s)")
    t.add_argument("--study", required=True)
    t.add_argument("--tracking", action="append", default=[], metavar="SPEC", help=TRACKING_FLAG_HELP)
    common(t)

    b = sub.add_parser("best", help="print the best trial as trainer overrides (pareto studies: the front); after "
                                    "confirm, the best confirmed mean")
    b.add_argument("--study", required=True)
    b.add_argument("--format", choices=("overrides", "yaml", "command", "schedule"), default="overrides",
                   help="schedule: a pbt study's winning lineage and hyperparameter schedule as JSON")
    b.add_argument("--trial", type=int, default=None, help="print this trial's overrides instead of the best")
    common(b)
    return p


def _studies_dir(arg: Path | None) -> Path:
    return arg if arg is not None else Path(os.environ.get(ENV_STUDIES_DIR, "studies"))


def follow_up(cmd: str, study_name: str, storage_url: str, studies_dir: Path) -> str:
    """A complete command line to go on with this study: ``--studies-dir`` unless it is the default, ``--storage``
    (its password masked) unless it is the study's default SQLite file there (issue 43: a hint that finds nothing)."""
    from hpo.storages._storage import default_storage_url

    line = f"verl-hpo {cmd} --study {study_name}"
    if studies_dir.resolve() != _studies_dir(None).resolve():
        line += f" --studies-dir {shlex.quote(str(studies_dir.resolve()))}"  # works from any directory
    if storage_url and storage_url != default_storage_url(studies_dir, study_name):
        line += f" --storage {shlex.quote(mask_url(storage_url))}"
    return line


def _fail(msg: str, code: int = 2) -> int:
    if len(msg) > MAX_ERROR_CHARS:  # a value echoed from hostile input: the line stays readable
        msg = f"{msg[:MAX_ERROR_CHARS]}... ({len(msg)} characters)"
    print(f"error: {msg}", file=sys.stderr)
    return code


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _stop_on_signals(stop: threading.Event, got: list[int]) -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP set ``stop`` (trials see it within ~0.1 s) instead of raising mid-storage-write.
    A second signal exits at once: trial processes die with the driver (their wrapper's death signal) and
    their trials stay RUNNING until the next ``resume`` or a heartbeat finds them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        if got:
            print(f"\n{signal.Signals(signum).name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(EXIT_SIGNAL.get(got[0], 130))
        got.append(signum)
        print(f"\n{signal.Signals(signum).name}: stopping running trials (again to exit now) ...", file=sys.stderr,
              flush=True)
        stop.set()

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(space: Space | None, study_name: str, storage_url: str, studies_dir: Path, args: argparse.Namespace) -> int:
    """search (``space`` given), or resume / worker / confirm of the stored study; the exit code."""
    from hpo.reporting._dashboard import DashboardCallback, dashboard_path, write_final_page
    from hpo.reporting._report import Reporter, summary
    from hpo.storages._retrying import StorageUnavailable
    from hpo.study._driver import Driver, check_search, open_stored, queue_confirm, study_target
    from hpo.study._errors import DriverError, TrialInterrupted
    from hpo.study._optuna import open_study, quiet_optuna
    from hpo.study._population import NoHealthyMember
    from hpo.study._slots import n_finished

    quiet_optuna()
    stop, got = threading.Event(), list[int]()
    with _stop_on_signals(stop, got), ExitStack() as closing:  # closing: the trackers' flush (hpo.tracking)
        if space is None:
            space, study, devices = open_stored(
                study_name, storage_url, local_space=args.space, trust=args.trust_stored_experiment,
                n_trials=getattr(args, "n_trials", None), n_jobs=getattr(args, "n_jobs", None),
                devices=_device_list(getattr(args, "devices", None)), ray_address=getattr(args, "ray_address", None),
                studies_dir=studies_dir,
                # a worker (often started by a scheduler) waits for a database that is starting or restarting
                wait_s=StudySpec().storage_retry_s if args.cmd == "worker" else 0.0)
            tracking = _tracking_spec(space, args)
        else:
            space, devices = check_search(space, getattr(args, "ray_address", None), study_name,
                                          studies_dir)
            tracking = _tracking_spec(space, args)
            study = open_study(space, study_name, storage_url)
        from hpo.record import ATTR_BUDGET

        budget = getattr(args, "budget", None)
        if budget is None:  # the budget the search was given, kept in the study (an untrusted value: checked)
            kept = study.user_attrs.get(ATTR_BUDGET)
            budget = float(kept) if isinstance(kept, (int, float)) and not isinstance(kept, bool) and \
                math.isfinite(kept) and kept >= 1 else None
        elif args.cmd == "search" or budget != study.user_attrs.get(ATTR_BUDGET):
            study.set_user_attr(ATTR_BUDGET, budget)
        if budget is not None:
            space = dataclasses.replace(space, study=dataclasses.replace(space.study, budget=budget))
        target = study_target(space)
        reporter = Reporter(sys.stdout, target, space.objective.direction_literal, space.study.budget)
        progress = _start_tracking(tracking, study_name, storage_url, studies_dir, reporter, closing)
        driver = Driver(space, study, studies_dir, progress, stop, devices=devices)
        confirming = args.cmd == "confirm"
        if confirming:
            from hpo.study._confirm import pending

            speed = space.study.kind == "throughput"  # re-measured against the user's config (hpo.reporting._speed)
            top_k = args.top or (space.study.throughput.top_k if speed else space.study.confirm.top_k)
            n_seeds = args.seeds or (space.study.throughput.repeats if speed else space.study.confirm.seeds)
            try:
                queued = queue_confirm(study, space, top_k, n_seeds, studies_dir, reporter.note)
            except NoHealthyMember as err:  # every member collapsed: nothing to confirm (exit 1, not a bad file)
                return _fail(str(err), 1)
            how = (f"re-measuring the {top_k} fastest configuration(s) against your config, interleaved, {n_seeds} "
                   "time(s) each, one run at a time" if speed else
                   f"racing the top {top_k} configuration(s) seed by seed (at most {n_seeds} fresh seeds each)"
                   if space.study.confirm.race else
                   f"confirming the top {top_k} configuration(s) with {n_seeds} fresh seed(s) each")
            reporter.note(f"study {study_name}: {how}: {len(queued)} run(s) queued, {pending(study)} pending")
        else:
            if space.study.budget is not None:  # said before any run: a budget the confirmation alone would spend
                from hpo.study._confirm import baseline_cache, confirm_reserve

                conf, reserve = space.study.confirm, confirm_reserve(space, baseline_cache(studies_dir))
                left = space.study.budget - reserve
                if left < 1:
                    reporter.note(f"warning: a budget of {space.study.budget:g} full runs leaves the search "
                                  f"{max(0.0, left):g} after the confirmation's least ({reserve} runs: the top "
                                  f"{conf.top_k} and the baseline on {conf.min_seeds if conf.race else conf.seeds} "
                                  "seeds); the search may run no trial")
            speed_info = getattr(args, "speed_info", None)
            if speed_info is not None:  # study.speed_from: what each learning trial saves
                from hpo.reporting._speed import speed_from_note

                reporter.note(speed_from_note(speed_info))
                study.set_user_attr("speed_from", speed_info)
            reporter.header(study_name, storage_url, str(driver.trials_dir), n_finished(study), target)
        pages = DashboardCallback(dashboard_path(studies_dir, study_name), storage_url, studies_dir, every=5)
        try:
            ran = driver.run_confirm([pages]) if confirming else driver.run(target, [pages])
        except TrialInterrupted:
            ran = -1
        except DriverError as err:
            return _fail(str(err), 1)
        except StorageUnavailable as err:
            return _fail(f"{err}; finished trials are kept: "
                         f"{follow_up('resume', study_name, storage_url, studies_dir)} once it is back", 1)
        write_final_page(pages, study_name, storage_url, studies_dir, reporter.note)
        signum = (got[0] if got else signal.SIGINT) if got or ran < 0 else None
        if confirming:
            return _confirm_exit(study, space, follow_up("confirm", study_name, storage_url, studies_dir), signum)
        done = n_finished(study)
        if signum is not None and (done < target or space.study.strategy == "pbt"):
            print(f"stopped by {signal.Signals(signum).name}: {done}/{target} trials finished; "
                  f"interrupted trials are queued: {follow_up('resume', study_name, storage_url, studies_dir)}",
                  file=sys.stderr)
            return EXIT_SIGNAL.get(signum, 130)
        if ran == 0:
            reporter.note(f"study {study_name} already has {done} finished trials (target {target})")
        print(summary(study, storage_url, str(driver.trials_dir)))
    return 0


def _confirm_exit(study: Any, space: Space, again: str, signum: int | None) -> int:
    """After ``confirm``: the confirmed table and the verdict, or (stopped by a signal) how many runs are left."""
    from hpo.reporting._report import confirmed_table
    from hpo.reporting._verdict import verdict_lines
    from hpo.study._confirm import pending

    if signum is not None:
        print(f"stopped by {signal.Signals(signum).name}: {pending(study)} confirmation run(s) left; run {again} "
              "again to finish them", file=sys.stderr)
        return EXIT_SIGNAL.get(signum, 130)
    if space.study.kind == "throughput":
        from hpo.reporting._speed import speed_lines, speed_report

        report = speed_report(study, space)
        print("\n".join(speed_lines(report, space)) if report else "no run of your config finished")
        return 0
    print(confirmed_table(study, space))
    for line in verdict_lines(study, space):
        print(line)
    return 0


def _tracking_spec(space: Space, args: argparse.Namespace) -> Any:
    """The experiment's ``tracking:`` section with ``--tracking`` applied, each tracker checked (package, server)
    before the study starts: SpaceError, or with ``--tracking-optional`` a warning and that tracker dropped."""
    from hpo.experiment._tracking import apply_flags

    spec = apply_flags(space.tracking, getattr(args, "tracking", []), SpaceError)
    if not spec.enabled:
        return spec
    from hpo.tracking._check import checked_tracking

    return checked_tracking(spec, space.source, getattr(args, "tracking_optional", False),
                            lambda line: print(line, file=sys.stderr))


def _start_tracking(spec: Any, study_name: str, storage_url: str, studies_dir: Path, reporter: Any,
                    closing: ExitStack) -> Any:
    """The progress reporter the driver gets: ``reporter`` itself, or (trackers configured) one that also feeds this
    driver's tracking process (:mod:`hpo.tracking`), which ``closing`` flushes at the end."""
    if not spec.enabled:
        return reporter
    from hpo.execution._identity import driver_identity
    from hpo.tracking import TrackingFeed, describe

    feed = TrackingFeed(spec, study_name, storage_url, studies_dir, driver_identity())

    def close() -> None:
        line = feed.close()
        if line:
            print(line, file=sys.stderr)

    closing.callback(close)
    reporter.note(f"tracking: {describe(spec, studies_dir)} (log: {feed.log_path})")
    return feed.wrap(reporter)


def _track(study_name: str, storage_url: str, studies_dir: Path, flags: Sequence[str]) -> int:
    """``verl-hpo track``: finish what this host's tracking processes of the study left (their spools)."""
    from hpo.experiment._tracking import apply_flags
    from hpo.study._optuna import load_stored, quiet_optuna
    from hpo.tracking import catch_up
    from hpo.tracking._check import checked_tracking

    quiet_optuna()
    space, _ = load_stored(study_name, storage_url, None)
    spec = apply_flags(space.tracking, flags, SpaceError)
    if not spec.enabled:
        return _fail(f"study {study_name!r} has no tracking section; name a tracker with --tracking mlflow=URI "
                     "or --tracking wandb")
    spec = checked_tracking(spec, space.source, False, lambda line: None)
    return catch_up(spec, study_name, storage_url, studies_dir)


def _device_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices:
        raise SpaceError(f"--devices {text!r}: expected GPU ids like 0,1")
    return devices


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    studies_dir = _studies_dir(getattr(args, "studies_dir", None))
    from hpo.storages._retrying import STORAGE_ERRORS, storage_error_line
    from hpo.storages._storage import check_storage_url, check_study_name, default_storage_url, scrub, sqlite_path

    storage_url = getattr(args, "storage", None) or ""
    try:
        for flag, n in (("--n-trials", getattr(args, "n_trials", None)), ("--top", getattr(args, "top", None)),
                        ("--seeds", getattr(args, "seeds", None))):
            if n is not None and n <= 0:
                return _fail(f"{flag} {n}: must be positive")
        budget = getattr(args, "budget", None)
        if budget is not None and not (math.isfinite(budget) and budget >= 1):  # before any study exists
            return _fail(f"--budget {budget:g}: must be a finite number of full-run equivalents, at least 1 (one "
                         "trial's full length)")
        if args.cmd == "validate":
            from hpo.backends._preflight import validate_space
            from hpo.study._driver import resolve_devices

            spaces_dir = Path(os.environ.get(ENV_SPACES_DIR, str(SPACES_DIR)))
            space = load_checked_space(args.space, list(args.override), spaces_dir)
            from hpo.backends import backend_of

            backend_of(space).check_launch(space, as_planned=True)  # e.g. a GPU study's interpreter has CUDA torch
            lengths = None
            if args.metrics is not None:
                from verl_core.config import ConfigError
                from verl_core.memory_verl import read_sequence_lengths

                try:  # a regular file (not a FIFO, not /dev/zero) of bounded size, then verl_core reads it
                    check_regular(args.metrics.expanduser(), f"--metrics {args.metrics}", MAX_METRICS_BYTES)
                    lengths = read_sequence_lengths(args.metrics)
                except (ConfigError, FileRefused) as err:
                    return _fail(str(err))
                except OSError as err:
                    return _fail(f"--metrics {args.metrics}: unreadable ({err.strerror or err})")
            return validate_space(space, resolve_devices(space.trial), sys.stdout, lengths=lengths)
        if args.cmd == "rehearse":
            from hpo.backends import rehearsal_of

            spaces_dir = Path(os.environ.get(ENV_SPACES_DIR, str(SPACES_DIR)))
            # --recheck reruns checks on kept runs: the quick load (a second), not every corner composed by verl
            space = (load_space if args.recheck else load_checked_space)(args.space, list(args.override), spaces_dir)
            tool = rehearsal_of(space)  # SpaceError: a trainer without a rehearsal
            if args.tokenizer is not None and not args.tokenizer.expanduser().is_dir():
                return _fail(f"--tokenizer {args.tokenizer}: not a directory")
            if args.recheck:
                return int(tool.recheck(space, studies_dir.resolve(), fmt=args.format))
            for flag, value in (("--reward-timeout", args.reward_timeout), ("--corner-timeout", args.corner_timeout)):
                if value is not None and not (math.isfinite(value) and value > 0):
                    return _fail(f"{flag} {value:g}: must be a positive number of seconds")
            if args.gpus is not None and args.gpus < 1:
                return _fail(f"--gpus {args.gpus}: must be 1 or more (GPUs per trial of the real study)")
            gpu_bytes = None if args.gpu_memory is None else tool.parse_size(args.gpu_memory)
            if args.gpu_memory is not None and gpu_bytes is None:
                return _fail(f"--gpu-memory {args.gpu_memory!r}: not a size (e.g. 80GiB, 141G, 24576MiB)")
            tokenizer = None if args.tokenizer is None else args.tokenizer.expanduser().resolve()
            return int(tool.rehearse(space, studies_dir.resolve(), tokenizer=tokenizer, fmt=args.format,
                                     quick=args.quick, reward_timeout_s=args.reward_timeout,
                                     timeout_s=args.corner_timeout, gpus=args.gpus, gpu_bytes=gpu_bytes))
        if args.cmd == "search":
            overrides = list(args.override)
            if args.n_trials is not None:
                overrides.append(f"study.n_trials={args.n_trials}")
            spaces_dir = Path(os.environ.get(ENV_SPACES_DIR, str(SPACES_DIR)))
            quick = load_space(args.space, overrides, spaces_dir)
            speed_name = quick.study.speed_from
            if speed_name is not None:  # a throughput study's confirmed speed settings, fixed for every trial
                from hpo.reporting._speed import speed_from

                speed_url = args.storage or default_storage_url(studies_dir, check_study_name(speed_name,
                                                                                              "study.speed_from"))
                check_storage_url(speed_url)
                extra, args.speed_info = speed_from(quick, speed_url)
                overrides += extra
            space = load_checked_space(args.space, overrides, spaces_dir)
            study_name = (check_study_name(args.study) if args.study is not None
                          else check_study_name(space.name, "space name"))
            storage_url = args.storage or default_storage_url(studies_dir, study_name)
            check_storage_url(storage_url)
            studies_dir.mkdir(parents=True, exist_ok=True)
            return _run(space, study_name, storage_url, studies_dir, args)
        check_study_name(args.study)
        storage_url = args.storage or default_storage_url(studies_dir, args.study)
        check_storage_url(storage_url)
        db = sqlite_path(storage_url)
        if db is not None and not db.is_file():
            return _fail(f"no study {args.study!r}: {db} does not exist (start one with verl-hpo search)")
        if args.cmd == "dashboard":
            from hpo.reporting._dashboard import dashboard_command

            if args.out is not None and args.out.is_dir():  # the user's own path: anywhere they can write
                return _fail(f"--out {args.out}: is a directory; give the page's file name (e.g. report.html)")
            return dashboard_command(args.study, storage_url, studies_dir, args.out)
        if args.cmd == "confirm":
            return _run(None, args.study, storage_url, studies_dir, args)
        if args.cmd == "track":
            return _track(args.study, storage_url, studies_dir, args.tracking)
        if args.cmd in ("resume", "worker"):
            if getattr(args, "n_jobs", None) is not None and args.n_jobs <= 0:
                return _fail(f"--n-jobs {args.n_jobs}: must be positive")
            return _run(None, args.study, storage_url, studies_dir, args)
        return _best(args.study, storage_url, args.format, args.trial, studies_dir)
    except SpaceError as err:
        return _fail(scrub(str(err), storage_url) if storage_url else str(err))
    except STORAGE_ERRORS as err:  # StorageUnavailable (past study.storage_retry_s), StorageInternalError, ...
        return _fail(storage_error_line(err, storage_url), 1)
    except RuntimeError as err:
        from hpo.execution.ray_jobs import RayClusterError

        if not isinstance(err, RayClusterError):
            raise
        return _fail(str(err), 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _best(study_name: str, storage_url: str, fmt: str, trial_number: int | None = None,
          studies_dir: Path | None = None) -> int:
    from hpo.reporting._report import best_trial, front_table, objective_names, pareto_front, render_best
    from hpo.study._optuna import load_stored, quiet_optuna

    quiet_optuna()
    space, study = load_stored(study_name, storage_url, None)
    if space.study.strategy == "pbt":  # the winning lineage and its schedule
        from hpo.reporting._pbt import best_lineage, render_pbt_best

        found = best_lineage(space, study, trial_number)
        if found is None and trial_number is not None:
            return _fail(f"--trial {trial_number}: no segment with a value in study {study_name!r}", 1)
        if found is None:  # none yet, or every member collapsed: which, and why
            from hpo.reporting._pbt import why_no_best

            return _fail(why_no_best(space, study), 1)
        header, out = render_pbt_best(space, found, fmt)
        print(header, file=sys.stderr)
        print(out)
        return 0
    if fmt == "schedule":
        return _fail(f"--format schedule: study {study_name!r} is not a pbt study (study.strategy: pbt)")
    if space.study.kind == "throughput" and trial_number is None:
        from hpo.reporting._speed import speed_lines, speed_report

        report = speed_report(study, space)
        if report is not None:  # re-measured: the recommended pick, never one whose math differs
            print("\n".join(f"# {line}" for line in speed_lines(report, space)), file=sys.stderr)
            if report.recommended is None:
                return 1
            print(render_best(space, report.recommended.trial, fmt))
            return 0
        again = follow_up("confirm", study_name, storage_url, studies_dir or _studies_dir(None))
        print(f"# not re-measured yet ({again} checks the pick against your config "
              "and its math); the fastest search trial:", file=sys.stderr)
    if space.objective.multi and trial_number is None:
        front = pareto_front(study)
        if not front:
            return _fail(f"study {study_name!r} has no feasible completed trial with finite values yet", 1)
        print(f"# pareto front of study {study_name} ({space.objective.label}); "
              f"overrides of one: {follow_up('best', study_name, storage_url, studies_dir or _studies_dir(None))} "
              "--trial N", file=sys.stderr)
        print(front_table(study))
        return 0
    if trial_number is not None:
        trial = next((t for t in study.get_trials(deepcopy=False) if t.number == trial_number), None)
        if trial is None or trial.state.name != "COMPLETE":
            return _fail(f"--trial {trial_number}: no completed trial with that number in study {study_name!r}")
    else:
        from hpo.study._confirm import confirmed

        ranked = confirmed(study)
        if ranked:  # seed-confirmed: the best confirmed mean (or a tied, preferred one), not the luckiest tuning run
            from hpo.reporting._verdict import study_verdict, verdict_lines

            v = study_verdict(study, space)
            top = ranked[0] if v is None else v.pick
            test = f"; held-out test {top.test_mean:.4g} +- {top.test_std:.3g}" if top.test_values else ""
            print(f"# trial {top.trial.number} of study {study_name} ({space.objective.label}): confirmed mean "
                  f"{top.mean:.4g} +- {top.std:.3g} over {top.n} fresh seed(s) (min {min(top.values):.4g}, max "
                  f"{max(top.values):.4g}; tuning run {top.trial.values[0]:.4g}){test}; ranking by confirmed mean:",
                  file=sys.stderr)
            from hpo.reporting._report import confirmed_table

            print("\n".join(f"#   {line}" for line in confirmed_table(study, space).splitlines()), file=sys.stderr)
            print("\n".join(f"# {line}" for line in verdict_lines(study, space)), file=sys.stderr)
            print(render_best(space, top.trial, fmt))
            return 0
        trial = best_trial(study)
    if trial is None:
        return _fail(f"study {study_name!r} has no feasible completed trial with a finite value yet", 1)
    shown = ", ".join(f"{n}={v:.4g}" for n, v in zip(objective_names(study), trial.values, strict=True))
    print(f"# trial {trial.number} of study {study_name} ({space.objective.label}): {shown}", file=sys.stderr)
    print(render_best(space, trial, fmt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
