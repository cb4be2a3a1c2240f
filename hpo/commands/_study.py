"""A study run, which ``search``, ``resume``, ``worker`` and ``confirm`` share: each builds a :class:`StudyRun` from
its own flags (``resume``, ``worker`` and ``confirm`` through :func:`run_stored`); :func:`run_study` opens (or
creates) the study, the budget and the trackers, runs the driver under the stop signals, and gives the exit code with
its last lines.

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

from hpo.commands._base import EXIT_SIGNAL, Invocation, fail, follow_up, open_existing, spaces_dir
from hpo.commands._speed_from import recheck_speed
from hpo.experiment import Space, SpaceError, repeat_cap

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """What ``confirm`` queues before it runs (each None: the experiment's own)."""

    top: int | None = None  # --top: configurations, best first (study.confirm.top_k; throughput: .throughput.top_k)
    seeds: int | None = None  # --seeds: fresh seeds each (study.confirm.seeds; throughput: .throughput.repeats)
    baseline_runs: tuple[str, ...] = ()  # --baseline-runs: the user's own runs of study.baseline, imported first


@dataclasses.dataclass(frozen=True)
class StudyRun:
    """One study run as its subcommand asks for it, built from that command's own flags: ``search`` hands in the
    experiment it loaded; ``resume``, ``worker`` and ``confirm`` open the study's stored one (``space`` None), and
    ``confirm`` says what to confirm. A flag not given is None: the experiment's or the study's own value."""

    study: str  # the study's name
    space: Space | None = None  # search: its experiment, loaded and checked; None: the study's stored one
    storage: str | None = None  # --storage as given (study.speed_from's throughput study is looked up there too)
    budget: float | None = None  # --budget (None: the budget kept in the study)
    tracking: tuple[str, ...] = ()  # --tracking, over the experiment's tracking section
    tracking_optional: bool = False  # --tracking-optional
    ray_address: str | None = None  # --ray-address
    speed_info: dict[str, Any] | None = None  # search with study.speed_from: its settings, reported and kept
    # how resume, worker and confirm open the stored study (hpo.study._driver.open_stored)
    local_space: str | None = None  # --space: a local file or name (found as search finds it) to check against
    trust: bool = False  # --trust-stored-experiment
    n_trials: int | None = None  # resume --n-trials: the study's new target
    n_jobs: int | None = None  # worker --n-jobs
    devices: str | None = None  # worker --devices as given (checked when the study is opened)
    wait_s: float = 0.0  # worker: how long to ride out a database that is (re)starting
    confirm: Confirmation | None = None  # confirm: queue these runs and run them, instead of searching


def run_stored(args: argparse.Namespace, inv: Invocation, **own: Any) -> int:
    """``resume``, ``worker``, ``confirm``: the existing study ``--study`` (the exit code when it is not there), run
    with the flags the three share and ``own``, the command's own :class:`StudyRun` fields."""
    refused = open_existing(args, inv)
    if refused is not None:
        return refused
    return run_study(StudyRun(args.study, storage=args.storage, budget=args.budget, tracking=tuple(args.tracking),
                              tracking_optional=args.tracking_optional, local_space=args.space,
                              trust=args.trust_stored_experiment, **own), inv)


def run_study(run: StudyRun, inv: Invocation) -> int:
    """A search (``run.space`` given), a confirmation (``run.confirm``), or a resume / worker of the stored study;
    the exit code."""
    from hpo.execution import knob_problem
    from hpo.reporting import DashboardCallback, Reporter, dashboard_path, summary, write_final_page
    from hpo.storages import StorageUnavailable
    from hpo.study import Driver, DriverError, TrialInterrupted, n_finished, quiet_optuna, study_target

    study_name, storage_url, studies_dir = run.study, inv.storage_url, inv.studies_dir
    problem = knob_problem()  # a bad $VERL_HPO_LOG_CAP_MIB / $VERL_HPO_MAX_DROPPED_ROWS: before anything is made
    if problem:
        return fail(problem)
    quiet_optuna()
    stop, got = threading.Event(), list[int]()
    with _stop_on_signals(stop, got), ExitStack() as closing:  # closing: the trackers' flush (hpo.tracking)
        space, study, devices, tracking = _open(run, storage_url, studies_dir)
        space = _with_budget(space, study, run.budget)
        target = study_target(space)
        reporter = Reporter(sys.stdout, target, space.objective.direction_literal, space.study.budget)
        progress = _start_tracking(tracking, study_name, storage_url, studies_dir, reporter, closing)
        driver = Driver(space, study, studies_dir, progress, stop, devices=devices)
        if run.confirm is not None:
            refused = _queue_confirm(study, space, study_name, studies_dir, run.confirm, reporter)
            if refused is not None:
                return refused
        else:
            _search_notes(study, space, studies_dir, run.speed_info, reporter)
            finished, on_target = _finished(study, space)
            reporter.header(study_name, storage_url, str(driver.trials_dir), finished, target, on_target)
        pages = DashboardCallback(dashboard_path(studies_dir, study_name), storage_url, studies_dir, every=5)
        try:
            ran = driver.run(target, [pages]) if run.confirm is None \
                else driver.run_confirm([pages], _speed_more(study, space, run.confirm, reporter))
        except TrialInterrupted:
            ran = -1
        except DriverError as err:
            return fail(str(err), 1)
        except StorageUnavailable as err:
            return fail(f"{err}; finished trials are kept: "
                        f"{follow_up('resume', study_name, storage_url, studies_dir)} once it is back", 1)
        write_final_page(pages, study_name, storage_url, studies_dir, reporter.note)
        signum = (got[0] if got else signal.SIGINT) if got or ran < 0 else None
        if run.confirm is not None:
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
    target; its tie runs not), and apart its runs on the target model (None without a proxy)."""
    from hpo.record import is_finished, is_proxy, is_tie_run

    done = [t for t in study.get_trials(deepcopy=False) if is_finished(t)]
    if space.study.fidelity.proxy is None:
        return len(done), None
    proxy = sum(1 for t in done if is_proxy(t) and not is_tie_run(t))  # a tie run is evidence, not a search trial
    return proxy, sum(1 for t in done if not is_proxy(t))


def _open(run: StudyRun, storage_url: str, studies_dir: Path) -> tuple[Space, Any, Any, Any]:
    """``(space, study, devices, tracking)``: the stored study and its experiment (``run.space`` None: resume, worker,
    confirm) or the search's study, created if new; the trackers checked before any trial runs."""
    from hpo.study import check_search, open_stored, open_study

    if run.space is not None:
        space, devices = check_search(run.space, run.ray_address, run.study, studies_dir)
        tracking = _tracking_spec(space, run.tracking, run.tracking_optional)
        return space, open_study(space, run.study, storage_url), devices, tracking
    space, study, devices = open_stored(
        run.study, storage_url, local_space=run.local_space, trust=run.trust, n_trials=run.n_trials,
        n_jobs=run.n_jobs, devices=_device_list(run.devices), ray_address=run.ray_address, studies_dir=studies_dir,
        confirming=run.confirm is not None, wait_s=run.wait_s, spaces_dir=spaces_dir())
    space = recheck_speed(space, study, run.storage, studies_dir)
    return space, study, devices, _tracking_spec(space, run.tracking, run.tracking_optional)


def _with_budget(space: Space, study: Any, budget: float | None) -> Space:
    """``space`` with ``--budget``, else the budget kept in the study; a new ``--budget`` is kept."""
    from hpo.record import ATTR_BUDGET

    if budget is None:  # the budget the search was given, kept in the study (an untrusted value: checked)
        kept = study.user_attrs.get(ATTR_BUDGET)
        budget = float(kept) if isinstance(kept, (int, float)) and not isinstance(kept, bool) and \
            math.isfinite(kept) and kept >= 1 else None
    elif budget != study.user_attrs.get(ATTR_BUDGET):
        study.set_user_attr(ATTR_BUDGET, budget)
    if budget is not None:
        space = dataclasses.replace(space, study=dataclasses.replace(space.study, budget=budget))
    return space


def _queue_confirm(study: Any, space: Space, study_name: str, studies_dir: Path, want: Confirmation,
                   reporter: Any) -> int | None:
    """``confirm``: queue the top configurations' runs and say so; the exit code when there is nothing to confirm."""
    from hpo.study import NoHealthyMember, pending, proxy_race_line, queue_confirm, unused_top_line

    speed = space.study.kind == "throughput"  # re-measured against the user's config (hpo.reporting._speed)
    top_k = want.top or (space.study.throughput.top_k if speed else space.study.confirm.top_k)
    n_seeds = want.seeds or (space.study.throughput.repeats if speed else space.study.confirm.seeds)
    if want.baseline_runs:  # the user's own runs of the baseline, checked, before any is queued
        from hpo.commands._baseline_runs import import_baseline_runs

        import_baseline_runs(study, space, list(want.baseline_runs), n_seeds, reporter.note)
    try:
        queued = queue_confirm(study, space, top_k, n_seeds, studies_dir, reporter.note)
    except NoHealthyMember as err:  # every member collapsed: nothing to confirm (exit 1, not a bad file)
        return fail(str(err), 1)
    how = (f"re-measuring the {top_k} fastest configuration(s) against your config, interleaved, {n_seeds} "
           f"time(s) each (up to {repeat_cap(space.study.throughput, n_seeds)} while the fastest is not separated "
           "from yours), one run at a time" if speed else
           f"racing the top {_raced(study, top_k)} configuration(s) seed by seed (at most {n_seeds} fresh seeds each)"
           if space.study.confirm.race else
           f"confirming the top {top_k} configuration(s) with {n_seeds} fresh seed(s) each")
    reporter.note(f"study {study_name}: {how}: {len(queued)} run(s) queued, {pending(study)} pending")
    unused = None if speed or want.top is None else unused_top_line(study, want.top)
    if unused:  # a held proxy races its own field: --top chose nothing
        print(f"note: {unused}", file=sys.stderr)
    proxy = None if speed else proxy_race_line(study, space)
    if proxy:  # a proxy search: the race's field and the promoted runs its first seeds continue
        reporter.note(proxy)
    return None


def _raced(study: Any, top_k: int) -> int:
    """The race's candidates (a proxy search whose proxy held races its own field: ``confirm_top``), else ``top_k``."""
    from hpo.record import ATTR_RACE

    race = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    candidates = race.get("candidates") if isinstance(race, dict) else None
    return len(candidates) if isinstance(candidates, list) and candidates else top_k


def _speed_more(study: Any, space: Space, want: Confirmation, reporter: Any) -> Callable[[], bool] | None:
    """A throughput study's ``confirm``: once its queued runs are done, one more seed's interleaved runs while the
    fastest pick of the same math is not separated from the user's config (:func:`hpo.reporting._speed.unresolved`),
    up to ``study.throughput.max_repeats`` seeds (at least ``--seeds``); None for any other study."""
    if space.study.kind != "throughput":
        return None
    from hpo.record import ATTR_CONFIRM_SEED, ATTR_SPEED_BLOCK, is_confirm
    from hpo.reporting import speed_report, unresolved
    from hpo.study import queue_speed_check

    top_k = want.top or space.study.throughput.top_k
    cap = repeat_cap(space.study.throughput, want.seeds or 0)

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


def _search_notes(study: Any, space: Space, studies_dir: Path, speed_info: dict[str, Any] | None,
                  reporter: Any) -> None:
    """Before a search's first run: a budget the confirmation alone would spend, and what ``study.speed_from``
    saves each trial (kept in the study)."""
    if space.study.budget is not None:  # said before any run: a budget the confirmation alone would spend
        from hpo.study import baseline_cache, confirm_reserve

        conf, reserve = space.study.confirm, confirm_reserve(space, baseline_cache(studies_dir))
        left = space.study.budget - reserve
        proxy = space.study.fidelity.proxy
        top = f"the proxy's {proxy.confirm_top}" if proxy is not None and conf.race else f"the top {conf.top_k}"
        if left < 1:
            reporter.note(f"warning: a budget of {space.study.budget:g} full runs leaves the search "
                          f"{max(0.0, left):.3g} after the confirmation's least ({reserve:.3g} runs: {top} and the "
                          f"baseline on {conf.min_seeds if conf.race else conf.seeds} seeds); the search may run no "
                          "trial")
    if speed_info is not None:  # study.speed_from: what each learning trial saves
        from hpo.reporting import speed_from_note

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
    from hpo.reporting import confirmed_table, verdict_lines
    from hpo.study import pending

    if signum is not None:
        print(f"stopped by {signal.Signals(signum).name}: {pending(study)} confirmation run(s) left; run {again} "
              "again to finish them", file=sys.stderr)
        return EXIT_SIGNAL.get(signum, 130)
    if space.study.kind == "throughput":
        from hpo.reporting import speed_lines, speed_report

        report = speed_report(study, space)
        print("\n".join(speed_lines(report, space)) if report else "no run of your config finished")
        return 0
    print(confirmed_table(study, space))
    for line in verdict_lines(study, space):
        print(line)
    return 0


def _tracking_spec(space: Space, flags: tuple[str, ...], optional: bool) -> Any:
    """The experiment's ``tracking:`` section with ``--tracking`` applied, each tracker checked (package, server)
    before the study starts: SpaceError, or with ``--tracking-optional`` a warning and that tracker dropped."""
    from hpo.experiment import apply_flags

    spec = apply_flags(space.tracking, list(flags), SpaceError)
    if not spec.enabled:
        return spec
    from hpo.tracking import checked_tracking

    return checked_tracking(spec, space.source, optional, lambda line: print(line, file=sys.stderr))


def _start_tracking(spec: Any, study_name: str, storage_url: str, studies_dir: Path, reporter: Any,
                    closing: ExitStack) -> Any:
    """The progress reporter the driver gets: ``reporter`` itself, or (trackers configured) one that also feeds this
    driver's tracking process (:mod:`hpo.tracking`), which ``closing`` flushes at the end."""
    if not spec.enabled:
        return reporter
    from hpo.execution import driver_identity
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
