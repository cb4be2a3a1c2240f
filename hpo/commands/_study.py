"""A study run, which ``search``, ``resume``, ``worker`` and ``confirm`` share: open (or create) the study, the
budget and the trackers, run the driver under the stop signals, and the exit code with its last lines.

SIGINT/SIGTERM/SIGHUP stop running trials (queued for ``resume``) and exit 130 / 143 / 129; a second signal forces
the exit at once."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from hpo.commands._base import EXIT_SIGNAL, Invocation, fail, follow_up
from hpo.experiment._space import Space, SpaceError, StudySpec
from hpo.experiment._throughput import repeat_cap

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_study(space: Space | None, study_name: str, inv: Invocation, args: argparse.Namespace) -> int:
    """search (``space`` given), or resume / worker / confirm of the stored study; the exit code."""
    from hpo.execution import knob_problem
    from hpo.reporting._dashboard import DashboardCallback, dashboard_path, write_final_page
    from hpo.reporting._report import Reporter
    from hpo.reporting._summary import summary
    from hpo.storages._retrying import StorageUnavailable
    from hpo.study._driver import Driver, study_target
    from hpo.study._errors import DriverError, TrialInterrupted
    from hpo.study._optuna import quiet_optuna
    from hpo.study._slots import n_finished

    storage_url, studies_dir = inv.storage_url, inv.studies_dir
    problem = knob_problem()  # a bad $VERL_HPO_LOG_CAP_MIB / $VERL_HPO_MAX_DROPPED_ROWS: before anything is made
    if problem:
        return fail(problem)
    quiet_optuna()
    stop, got = threading.Event(), list[int]()
    with _stop_on_signals(stop, got), ExitStack() as closing:  # closing: the trackers' flush (hpo.tracking)
        space, study, devices, tracking = _open(space, study_name, storage_url, args, studies_dir)
        space = _with_budget(space, study, args)
        target = study_target(space)
        reporter = Reporter(sys.stdout, target, space.objective.direction_literal, space.study.budget)
        progress = _start_tracking(tracking, study_name, storage_url, studies_dir, reporter, closing)
        driver = Driver(space, study, studies_dir, progress, stop, devices=devices)
        confirming = args.cmd == "confirm"
        if confirming:
            refused = _queue_confirm(study, space, study_name, studies_dir, args, reporter)
            if refused is not None:
                return refused
        else:
            _search_notes(study, space, studies_dir, args, reporter)
            finished, on_target = _finished(study, space)
            reporter.header(study_name, storage_url, str(driver.trials_dir), finished, target, on_target)
        pages = DashboardCallback(dashboard_path(studies_dir, study_name), storage_url, studies_dir, every=5)
        try:
            ran = driver.run_confirm([pages], _speed_more(study, space, args, reporter)) if confirming \
                else driver.run(target, [pages])
        except TrialInterrupted:
            ran = -1
        except DriverError as err:
            return fail(str(err), 1)
        except StorageUnavailable as err:
            return fail(f"{err}; finished trials are kept: "
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


def _finished(study: Any, space: Space) -> tuple[int, int | None]:
    """The header's count of finished trials (confirmation runs never count): a proxy search's proxy trials (its
    target), and apart its runs on the target model (None without a proxy)."""
    from hpo.record import is_finished, is_proxy

    done = [t for t in study.get_trials(deepcopy=False) if is_finished(t)]
    if space.study.fidelity.proxy is None:
        return len(done), None
    proxy = sum(1 for t in done if is_proxy(t))
    return proxy, len(done) - proxy


def _open(space: Space | None, study_name: str, storage_url: str, args: argparse.Namespace,
          studies_dir: Path | None = None) -> tuple[Space, Any, Any, Any]:
    """``(space, study, devices, tracking)``: the stored study and its experiment (``space`` None: resume, worker,
    confirm) or the search's study, created if new; the trackers checked before any trial runs."""
    from hpo.study._driver import check_search, open_stored
    from hpo.study._optuna import open_study

    if space is None:
        space, study, devices = open_stored(
            study_name, storage_url, local_space=args.space, trust=args.trust_stored_experiment,
            n_trials=getattr(args, "n_trials", None), n_jobs=getattr(args, "n_jobs", None),
            devices=_device_list(getattr(args, "devices", None)), ray_address=getattr(args, "ray_address", None),
            studies_dir=studies_dir, confirming=args.cmd == "confirm",
            # a worker (often started by a scheduler) waits for a database that is starting or restarting
            wait_s=StudySpec().storage_retry_s if args.cmd == "worker" else 0.0)
        space = _recheck_speed(space, study, args, studies_dir)
        tracking = _tracking_spec(space, args)
    else:
        space, devices = check_search(space, getattr(args, "ray_address", None), study_name, studies_dir)
        tracking = _tracking_spec(space, args)
        study = open_study(space, study_name, storage_url)
    return space, study, devices, tracking


def _recheck_speed(space: Space, study: Any, args: argparse.Namespace, studies_dir: Path | None) -> Space:
    """A stored learning study with ``study.speed_from``: its source asked again; settings it no longer recommends
    (its math now differs on new seeds, another pick won, the study is gone) are taken out for this run's trials,
    the user's own values back, with one line, and the reason is kept in the study (``speed_from.withdrawn``)."""
    from hpo.commands._base import default_studies_dir
    from hpo.reporting._speed_from import speed_recheck, withdrawn_note, without_speed

    info = study.user_attrs.get("speed_from")
    if space.study.speed_from is None or not isinstance(info, dict) or not isinstance(info.get("settings"), dict):
        return space
    try:
        why = speed_recheck(space, info, speed_url(space, getattr(args, "storage", None),
                                                   studies_dir or default_studies_dir()))
    except SpaceError as err:  # its storage is not there any more
        why = str(err).removeprefix(f"{space.source}: study.speed_from: {space.study.speed_from!r}: ")
    if why is None:
        if "withdrawn" in info:  # withdrawn by an earlier run, recommended again
            print(f"{space.source}: study.speed_from: throughput study {space.study.speed_from} recommends "
                  + " ".join(f"{k}={v}" for k, v in info["settings"].items()) + " again; this run's trials run "
                  "with them", flush=True)
            study.set_user_attr("speed_from", {k: v for k, v in info.items() if k != "withdrawn"})
        return space
    space, shown = without_speed(space, info)
    print(withdrawn_note(space, info, why, shown), flush=True)
    study.set_user_attr("speed_from", {**info, "withdrawn": why})
    return space


def speed_url(space: Space, storage: str | None, studies_dir: Path) -> str:
    """The storage of the throughput study ``study.speed_from`` names (``--storage``, else its SQLite file in the
    studies directory), checked; SpaceError (one line naming the key) when its SQLite file is not there: nothing is
    created looking for it."""
    from hpo.storages._storage import check_storage_url, check_study_name, default_storage_url, sqlite_path

    name = space.study.speed_from
    assert name is not None
    url = storage or default_storage_url(studies_dir, check_study_name(name, "study.speed_from"))
    check_storage_url(url)
    db = sqlite_path(url)
    if db is not None and not db.is_file():
        raise SpaceError(f"{space.source}: study.speed_from: {name!r}: no study {name!r}: {db} does not exist (a "
                         "throughput study searched and confirmed first)")
    return url


def speed_overrides(space: Space, storage: str | None, studies_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """``study.speed_from``: the named throughput study's recommended settings as ``--override`` texts, and what the
    search reports and keeps of them; SpaceError (one line) unless it has a complete confirmation."""
    from hpo.reporting._speed_from import speed_from

    return speed_from(space, speed_url(space, storage, studies_dir))


def _with_budget(space: Space, study: Any, args: argparse.Namespace) -> Space:
    """``space`` with ``--budget``, else the budget kept in the study; a new ``--budget`` (or a search's) is kept."""
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
    return space


def _queue_confirm(study: Any, space: Space, study_name: str, studies_dir: Path, args: argparse.Namespace,
                   reporter: Any) -> int | None:
    """``confirm``: queue the top configurations' runs and say so; the exit code when there is nothing to confirm."""
    from hpo.study._confirm import pending
    from hpo.study._driver import queue_confirm
    from hpo.study._population import NoHealthyMember

    speed = space.study.kind == "throughput"  # re-measured against the user's config (hpo.reporting._speed)
    top_k = args.top or (space.study.throughput.top_k if speed else space.study.confirm.top_k)
    n_seeds = args.seeds or (space.study.throughput.repeats if speed else space.study.confirm.seeds)
    if getattr(args, "baseline_runs", None):  # the user's own runs of the baseline, checked, before any is queued
        from hpo.commands._baseline_runs import import_baseline_runs

        import_baseline_runs(study, space, args.baseline_runs, n_seeds, reporter.note)
    try:
        queued = queue_confirm(study, space, top_k, n_seeds, studies_dir, reporter.note)
    except NoHealthyMember as err:  # every member collapsed: nothing to confirm (exit 1, not a bad file)
        return fail(str(err), 1)
    how = (f"re-measuring the {top_k} fastest configuration(s) against your config, interleaved, {n_seeds} "
           f"time(s) each (up to {repeat_cap(space.study.throughput, n_seeds)} while the fastest is not separated "
           "from yours), one run at a time" if speed else
           f"racing the top {top_k} configuration(s) seed by seed (at most {n_seeds} fresh seeds each)"
           if space.study.confirm.race else
           f"confirming the top {top_k} configuration(s) with {n_seeds} fresh seed(s) each")
    reporter.note(f"study {study_name}: {how}: {len(queued)} run(s) queued, {pending(study)} pending")
    return None


def _speed_more(study: Any, space: Space, args: argparse.Namespace, reporter: Any) -> Callable[[], bool] | None:
    """A throughput study's ``confirm``: once its queued runs are done, one more seed's interleaved runs while the
    fastest pick of the same math is not separated from the user's config (:func:`hpo.reporting._speed.unresolved`),
    up to ``study.throughput.max_repeats`` seeds (at least ``--seeds``); None for any other study."""
    if space.study.kind != "throughput":
        return None
    from hpo.record import ATTR_CONFIRM_SEED, ATTR_SPEED_BLOCK, is_confirm
    from hpo.reporting._speed import speed_report, unresolved
    from hpo.study._confirm import queue_speed_check

    top_k = args.top or space.study.throughput.top_k
    cap = repeat_cap(space.study.throughput, args.seeds or 0)

    def more() -> bool:
        report = speed_report(study, space)
        why = None if report is None else unresolved(report)
        seeds = len({t.system_attrs.get(ATTR_CONFIRM_SEED) for t in study.get_trials(deepcopy=False)
                     if is_confirm(t) and ATTR_SPEED_BLOCK in t.system_attrs})
        if why is None or seeds >= cap:
            return False
        queued = queue_speed_check(study, space, top_k, seeds + 1)
        reporter.note(f"{why}: re-measuring on one more seed ({seeds + 1} of at most {cap}: "
                      "study.throughput.max_repeats)")
        return bool(queued)

    return more


def _search_notes(study: Any, space: Space, studies_dir: Path, args: argparse.Namespace, reporter: Any) -> None:
    """Before a search's first run: a budget the confirmation alone would spend, and what ``study.speed_from``
    saves each trial (kept in the study)."""
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
        from hpo.reporting._speed_from import speed_from_note

        reporter.note(speed_from_note(speed_info))
        study.set_user_attr("speed_from", speed_info)


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


# what CUDA_VISIBLE_DEVICES names a GPU by: its index, or its UUID as nvidia-smi -L prints it (GPU-..., MIG-...)
_GPU_ID = re.compile(r"(0|[1-9][0-9]{0,3}|(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]{0,99})")


def _device_list(text: str | None) -> list[str] | None:
    """``--devices``: distinct GPU indices (0,1) or UUIDs; SpaceError (one line) for anything else (a name, -1, a
    GPU twice), which CUDA_VISIBLE_DEVICES would read as 'no GPU after this one'."""
    if text is None:
        return None
    devices = [d.strip() for d in text.split(",")]
    bad = next((d for d in devices if not _GPU_ID.fullmatch(d)), None) if text.strip() else ""
    if bad is not None:
        shown = f" ({bad!r} is not one)" if bad else ""
        raise SpaceError(f"--devices {text!r}: expected distinct GPU indices or UUIDs, comma-separated, like 0,1 or "
                         f"GPU-8f2a...{shown}")
    twice = next((d for i, d in enumerate(devices) if d in devices[:i]), None)
    if twice is not None:
        raise SpaceError(f"--devices {text!r}: GPU {twice} is named twice")
    return devices
