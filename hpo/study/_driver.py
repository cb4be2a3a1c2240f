"""The Optuna loop: each of a driver's ``n_jobs`` jobs takes a slot of the study's target (:mod:`hpo.study._slots`),
asks Optuna for a trial, runs it (:class:`hpo.study._trial.TrialRunner`; the trial outcomes:
:mod:`hpo.study._trial._outcome`), tells the result and calls the callbacks; stale trials of dead drivers are recovered
first (:mod:`hpo.study._recovery`).
Interrupts (Ctrl-C, SIGTERM, SIGHUP) stop every job; the interrupted trials are queued again for ``resume``.

"Finished" trials, which count towards ``study.n_trials``: COMPLETE, PRUNED, and FAIL with a recorded result
(``on_failure: fail``). Several drivers (``search``, ``resume``, ``worker`` on any host) may run one study.

Confirmation trials (``verl-hpo confirm``, :mod:`hpo.study._confirm`) are queued copies of a top trial's parameters
with a fresh seed (system attrs ``hpo:confirm_of`` / ``hpo:confirm_seed``, shown as user attrs ``confirm_of`` /
``confirm_seed``). Any driver of the study that picks one up runs it to the end (never pruned), and they never
count towards ``study.n_trials``.

A proxy search (``study.fidelity.proxy``) runs its trials on the proxy model (a runner of its own, with the proxy's
overrides and transfer rules), then its best settings' queued target runs, then (the proxy did not hold) a search on
the target: :func:`hpo.study._slots.proxy_stage` says which, and each trial claims a slot among its own kind.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.analysis import OutputRefused, make_output_dir
from hpo.backends import DEFAULT_BACKEND, backend_named, backend_of, resolve_devices, stored_space
from hpo.execution import DevicePool, driver_identity, sweep_orphans
from hpo.experiment import SPACES_DIR, Space, SpaceError, read_space
from hpo.record import (
    ATTR_FIDELITY_CHECK,
    ATTR_PROMOTED_FROM,
    ATTR_RETRY_OF,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
    fidelity_of,
    is_baseline,
    is_promoted,
    is_proxy,
    is_tie_run,
)
from hpo.samplers import promotion_twin, tie_twin
from hpo.storages import StorageUnavailable, check_study_name
from hpo.study._compare import advance_race, twin_of
from hpo.study._confirm import baseline_cache, is_confirm, remember_baseline, search_over_budget
from hpo.study._errors import TrialInterrupted, TrialLost, TrialRetried
from hpo.study._population import Population, pbt_total
from hpo.study._progress import Progress
from hpo.study._recovery import Heartbeat, finish, record_result, recover_stale_trials, sweep_scratch
from hpo.study._schedules import schedule_confirms
from hpo.study._slots import Slots, n_finished, proxy_search_over, proxy_stage, same_kind
from hpo.study._trial import TrialRunner, frozen_trial
from hpo.study._trial_files import prepare

WAIT_S = 1.0  # poll period of a driver waiting for others' trials to finish or die
Callback = Callable[[optuna.Study, FrozenTrial], None]


# ----------------------------------------------------------------------------- opening a run
def with_ray_address(space: Space, address: str | None) -> Space:
    """``--ray-address`` over ``trial.ray.address`` (not stored: each driver names the cluster as it reaches it)."""
    if address is None:
        return space
    from hpo.experiment import parse_ray

    ray = parse_ray({**space.raw.get("trial", {}).get("ray", {}), "address": address},
                    lambda where, msg: SpaceError(f"--ray-address: {msg}"))
    return dataclasses.replace(space, trial=dataclasses.replace(space.trial, ray=ray))


def _check_ray(space: Space, study: str | None = None, studies_dir: Path | None = None) -> None:
    """A Ray-job study's cluster must be named, answer, have nodes that can hold one trial, and pass the backend's
    check of its nodes (:meth:`~hpo.backends.Backend.check_cluster`) before any trial is asked for
    (RayClusterError, one line); the backend's notes go to stderr."""
    if space.trial.executor != "ray":
        return
    from hpo.execution.ray_jobs import RayClusterError, cluster_view, fits_now
    from hpo.study._ray_trials import address, needs

    where = address(space.trial)
    nodes, _ = cluster_view(where)
    if nodes:  # a head just started may not list its nodes yet: admission waits for them
        try:
            fits_now(nodes, needs(space.trial), [])  # raises when no node set could ever hold one trial
        except RayClusterError as err:  # the cluster answers, the experiment asks too much of it: a bad input
            raise SpaceError(f"{space.source}: trial.ray: {err} ({where})") from None
    trials_dir = None if study is None or studies_dir is None else studies_dir / study / "trials"
    for line in backend_of(space).check_cluster(space, where, study or space.name, trials_dir):
        print(f"note: {line}", file=sys.stderr, flush=True)


def check_search(space: Space, ray_address: str | None = None, study: str | None = None,
                 studies_dir: Path | None = None) -> tuple[Space, list[str]]:
    """What ``search`` checks before its study is created (nothing half-written on a refusal): the devices, the
    backend's launch check, the memory pre-flight (this host's devices, not a Ray cluster's) and the Ray cluster.
    The space (with ``--ray-address``) and the devices; SpaceError / RayClusterError with one line."""
    from hpo.backends import check_space_fits

    space = with_ray_address(space, ray_address)
    devices = [] if space.trial.executor == "ray" else resolve_devices(space.trial)
    backend_of(space).check_launch(space)
    if space.trial.executor != "ray":
        check_space_fits(space, devices)
    _check_ray(space, study, studies_dir)
    return space, devices


def make_trials_dir(trials_dir: Path) -> None:
    """``<study>/trials`` made; SpaceError naming the directory and the OS error (not the storage) when it cannot."""
    try:
        make_output_dir(trials_dir, "trials directory")
    except OutputRefused as err:
        raise SpaceError(str(err)) from None


def read_as_stored(path: str) -> Space:
    """A local experiment file read as a study's stored copy is (its trainer's defaults, its relative paths beside
    it), for comparing the two: a path the trainer's backend makes absolute when ``search`` loads the file (a verl
    experiment's reward function, data files, interpreter: ``Backend.resolve_paths``) is stored absolute, so it is
    made absolute here too, beside this file."""
    local, origin = read_space(path)
    space = stored_space(local.raw, local.source, local.name)
    return backend_of(space).resolve_paths(space, origin)


def open_stored(study_name: str, storage_url: str, *, local_space: str | None = None, trust: bool = False,
                n_trials: int | None = None, n_jobs: int | None = None, devices: Sequence[str] | None = None,
                ray_address: str | None = None, wait_s: float = 0.0, studies_dir: Path | None = None,
                confirming: bool = False, spaces_dir: Path = SPACES_DIR) -> tuple[Space, optuna.Study, list[str]]:
    """The stored study for ``resume``, ``worker`` and ``confirm``: its experiment may run here
    (:mod:`hpo.experiment._trust`), with this driver's ``n_jobs``, Ray address and devices, and the backend's launch
    check. ``local_space`` (``--space``): the local experiment file, found as ``search`` finds its own (a name in
    ``spaces_dir``, else a shipped one, or a path: :func:`~hpo.experiment.resolve_space_path`), beside which its
    relative paths are read (as ``search`` reads its file's). ``wait_s``: ride out a database that is (re)starting
    this long (a worker started by a scheduler). ``confirming``: the baseline's secrets are needed too (its runs are
    queued here), so a missing one is refused before any run."""
    from hpo.experiment import check_stored_experiment, missing_secrets, resolve_space_path
    from hpo.record import ATTR_DIGEST, ATTR_SOURCE
    from hpo.study._optuna import load_stored

    if local_space is not None:  # SpaceError, the line search gives, for a name that is in no place
        local_space = str(resolve_space_path(local_space, spaces_dir))
    space, study = load_stored(study_name, storage_url, n_trials, wait_s, source=local_space)
    missing = missing_secrets(space.overrides, space.trial.env, os.environ,
                              baseline=space.study.baseline if confirming else None)
    if missing:  # a secret is never stored: this driver's environment must carry it
        raise SpaceError(f"study {study_name!r}: its experiment's secrets are not stored; export "
                         f"{', '.join(missing)} in this driver's environment")
    check_stored_experiment(space, study_name, local_space, study.user_attrs.get(ATTR_SOURCE), trust,
                            study.user_attrs.get(ATTR_DIGEST), backend_named(space.trial.backend).code_rules(),
                            DEFAULT_BACKEND, read_local=read_as_stored)
    if n_jobs is not None:
        space = dataclasses.replace(space, trial=dataclasses.replace(space.trial, n_jobs=n_jobs))
    space = with_ray_address(space, ray_address)
    found = [] if space.trial.executor == "ray" else resolve_devices(space.trial, devices)
    backend_of(space).check_launch(space)
    _check_ray(space, study_name, studies_dir)
    return space, study, found


def study_target(space: Space) -> int:
    """The finished trials a search aims at: ``study.n_trials``, or for PBT the segments of its plan (population x
    segments per member; rollbacks add some)."""
    if space.study.strategy != "pbt":
        return space.study.n_trials
    pbt = space.study.pbt
    return pbt.population * -(-pbt_total(space) // pbt.interval_steps)


def queue_confirm(study: optuna.Study, space: Space, top_k: int, n_seeds: int,
                  studies_dir: Path | None = None, note: Callable[[str], None] | None = None
                  ) -> list[tuple[int, int]]:
    """``verl-hpo confirm``: queue the top ``top_k`` configurations' runs on ``n_seeds`` fresh seeds (a PBT study:
    its winning schedules, re-run from scratch; a racing confirmation: its next round); the (trial, seed) runs
    queued. Baseline runs this host kept under ``studies_dir`` are reused. SpaceError for a study that cannot be
    confirmed; NoHealthyMember (one line) when every PBT member collapsed."""
    from hpo.study._compare import start_race
    from hpo.study._confirm import baseline_cache, queue_confirmations
    from hpo.study._population import NoHealthyMember
    from hpo.study._schedules import queue_schedule_confirmations

    if space.study.kind == "throughput":  # the picks against the user's config, interleaved (hpo.reporting._speed)
        from hpo.study._confirm import queue_speed_check

        try:
            return queue_speed_check(study, space, top_k, n_seeds)
        except ValueError as err:
            raise SpaceError(str(err)) from None
    if space.objective.multi:
        raise SpaceError(f"study {study.study_name!r} is multi-objective (pareto): confirm ranks by one objective")
    if space.study.fidelity.proxy is not None and not isinstance(study.user_attrs.get(ATTR_FIDELITY_CHECK), dict):
        raise SpaceError(f"study {study.study_name!r}: its proxy search has not been checked against the target yet "
                         "(the promoted settings' target runs have not all finished); run verl-hpo resume first")
    try:
        if space.study.strategy == "pbt":
            return queue_schedule_confirmations(study, space, top_k, n_seeds)
        cache = baseline_cache(studies_dir) if studies_dir is not None else None
        if space.study.confirm.race:
            return start_race(study, space, top_k, n_seeds, cache, note)
        return queue_confirmations(study, space, top_k, n_seeds, cache, note)
    except NoHealthyMember:
        raise
    except ValueError as err:
        raise SpaceError(str(err)) from None


# ----------------------------------------------------------------------------- the driver
class Driver:
    """Runs trials of one study until it has its target number of finished trials, alone or beside other
    drivers on the same storage (``n_jobs`` loops in threads; see :class:`~hpo.study._slots.Slots` and
    :mod:`hpo.study._recovery`)."""

    def __init__(self, space: Space, study: optuna.Study, studies_dir: Path, reporter: Progress,
                 stop_event: threading.Event, cwd: str | None = None, devices: list[str] | None = None) -> None:
        self.space = space
        self.study = study
        self.study_dir = studies_dir / check_study_name(study.study_name)
        self.trials_dir = self.study_dir / "trials"
        self.reporter = reporter
        self.stop_event = stop_event
        self.cwd = cwd or os.getcwd()
        self.identity = driver_identity()
        self.pool = DevicePool(devices if devices is not None else resolve_devices(space.trial),
                               space.trial.gpus_per_trial)
        self.runner = TrialRunner(space, study, self.trials_dir, reporter, stop_event, self.cwd, self.identity,
                                  self.pool, self._trial_over_budget if space.study.budget is not None and
                                  space.study.strategy != "pbt" else None)
        self.factors: dict[str, float] = {}  # study.fidelity.proxy: the transfer rules' factors
        self.proxy_runner = self._proxy_runner()  # ... and the runner of the search's trials on the proxy model
        self.heartbeat: Heartbeat | None = None
        self.ran = 0
        self.confirming = False  # run_confirm: only the queued confirmation trials
        self.more: Callable[[], bool] | None = None  # run_confirm: queues further confirmation runs when asked
        # study.strategy pbt: the population queues every trial itself (hpo.study._population)
        self.population = Population(space, study, self.study_dir, pbt_total(space), reporter.note) \
            if space.study.strategy == "pbt" else None
        self._errors: list[BaseException] = []
        self.cache = baseline_cache(studies_dir)  # baseline runs kept for later studies on this host
        self._said_budget = False
        self._said_check = False
        self._count_lock = threading.Lock()
        self._ask_lock = threading.Lock()

    def run(self, target: int, callbacks: Sequence[Callback] = ()) -> int:
        """Run trials until the study has ``target`` finished trials (counting every driver's). Returns the
        number of trials this driver ran; raises TrialInterrupted when stopped, DriverError on a runtime
        problem."""
        make_trials_dir(self.trials_dir)
        killed = sweep_orphans(self.study.study_name)
        if killed:
            self.reporter.note(f"killed {killed} leftover trial process(es) of a dead driver")
        self._sweep_jobs(final=False)
        self.recover()
        if self.runner.backend.leaves_scratch:  # a killed driver's trials left their scratch behind
            sweep_scratch(self.study, self.trials_dir, self.runner.backend.cleanup)
        if not self.confirming and self.population is None and self._search_over(target):
            return 0
        ready = self.space
        heldout = self.confirming and self.space.study.kind != "throughput"  # speed re-measurements read no test data
        if heldout:  # the held-out data the confirmation runs read, which the search never named
            confirmation = self.runner.backend.confirmation
            held = confirmation.heldout_overrides(self.space) if confirmation is not None else {}
            ready = dataclasses.replace(self.space, overrides={**self.space.overrides, **held})
        prepare(ready, self.study_dir, self.cwd, self.reporter, self.stop_event)
        if self.proxy_runner is not None and not self.confirming:  # the proxy's model too (its log: proxy/prepare)
            prepare(self.proxy_runner.space, self.study_dir / "proxy", self.cwd, self.reporter, self.stop_event)
        if heldout and self.runner.backend.confirmation is not None:  # one line now, not a crash in every run
            self.runner.backend.confirmation.check_heldout(self.space)
        # a throughput study's re-measurements run one at a time, in their interleaved order (hpo.reporting._speed)
        n_jobs = 1 if self.confirming and self.space.study.kind == "throughput" else self.space.trial.n_jobs
        with Heartbeat(self.study, self.space.study.heartbeat_interval) as self.heartbeat:
            if n_jobs == 1:
                self._loop(target, callbacks)
            else:
                threads = [threading.Thread(target=self._loop, args=(target, callbacks), name=f"verl-hpo-job-{i}",
                                            daemon=True) for i in range(n_jobs)]
                for t in threads:
                    t.start()
                for t in threads:
                    while t.is_alive():
                        t.join(timeout=0.2)
        if not self._errors and not self.stop_event.is_set():
            self._sweep_jobs(final=True)
        if self._errors:
            gone = [e for e in self._errors if isinstance(e, StorageUnavailable)]  # the others stopped because of it
            interrupted = [e for e in self._errors if isinstance(e, TrialInterrupted)]
            raise (gone or interrupted or self._errors)[0]
        return self.ran

    def run_confirm(self, callbacks: Sequence[Callback] = (), more: Callable[[], bool] | None = None) -> int:
        """Run the study's queued confirmation trials (``verl-hpo confirm``) until none is waiting; other
        drivers of the study may take some of them. ``more``: asked once nothing is waiting or running; it queues
        further runs (a throughput study's next seed while its pick is not separated) and says whether it did.
        Returns the number this driver ran."""
        self.confirming, self.more = True, more
        try:
            return self.run(0, callbacks)
        finally:
            self.confirming, self.more = False, None

    def _sweep_jobs(self, final: bool) -> None:
        """Ray-job studies: stop the study's jobs no trial follows (:func:`hpo.study._ray_trials.sweep_jobs`)."""
        if self.space.trial.executor != "ray":
            return
        from hpo.execution.ray_jobs import RayClusterError
        from hpo.study._ray_trials import sweep_jobs

        try:
            stopped = sweep_jobs(self.study, self.space.trial, final)
        except RayClusterError as err:  # the cluster is away: the next driver's sweep stops them
            self.reporter.note(f"Ray jobs not swept: {err}")
            return
        if stopped:
            self.reporter.note(f"stopped {stopped} Ray job(s) of the study that no running trial follows")

    def recover(self) -> None:
        spec = self.space.study
        for number, what in recover_stale_trials(self.study, spec.grace_period, spec.max_retry):
            self.reporter.note(f"trial {number}: its driver is gone (dead pid or no heartbeat for "
                               f"{spec.grace_period}s); {what}")

    def _loop(self, target: int, callbacks: Sequence[Callback]) -> None:
        """One job: take a slot of the target, run a trial, tell it; until the target is reached."""
        try:
            while not self.stop_event.is_set() and not self._errors:
                self.recover()
                with self._ask_lock:  # this driver's jobs ask one at a time: none asks for a slot another just took
                    trials = self.study.get_trials(deepcopy=False)
                    if self.confirming:
                        if self.population is not None and schedule_confirms(self.study, self.space, self.study_dir,
                                                                             trials):
                            trials = self.study.get_trials(deepcopy=False)  # a schedule's next step range
                        if not any(is_confirm(t) and t.state == TrialState.WAITING for t in trials):
                            if self.more is not None and not any(is_confirm(t) and t.state == TrialState.RUNNING
                                                                 for t in trials) and self.more():
                                continue  # one more seed queued: its runs decide
                            if not self.space.study.confirm.race:
                                return
                            if advance_race(self.study, self.space, self.cache, self.reporter.note):  # next round
                                continue
                            if not any(is_confirm(t) and t.state == TrialState.RUNNING for t in trials):
                                return  # the race is decided
                            full = True  # its running runs decide the next round
                        else:
                            full = False
                    elif self.population is not None:  # pbt: done when the population is; asks only its queue
                        schedule_confirms(self.study, self.space, self.study_dir, trials)
                        if self.population.schedule(trials):
                            return
                        full = not self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                    else:
                        over, full = self._search_step(trials, target)
                        if over:
                            return
                    trial = None if full else self.study.ask()
                if trial is None:
                    self.stop_event.wait(WAIT_S)  # running trials (ours or others') hold the rest; they may die
                    continue
                frozen = self._one_trial(trial, target)
                if frozen is not None:
                    with self._count_lock:
                        self.ran += 1
                    done = n_finished(self.study) if self.proxy_runner is None else Slots.count(
                        self._kind(self.study.get_trials(deepcopy=False), frozen), None).finished
                    self.reporter.trial_finished(self.study, frozen, done)
                    for cb in callbacks:
                        cb(self.study, frozen)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
            self._errors.append(err)
            if isinstance(err, StorageUnavailable):  # past study.storage_retry_s: stop the other jobs' trials too
                self.stop_event.set()  # (they stay RUNNING in the storage; resume or any worker recovers them)

    def _budget_spent(self, trials: list[FrozenTrial]) -> bool:
        """``study.budget``: no room for a new search trial (:func:`search_over_budget`; said once)."""
        over = search_over_budget(trials, self.space, self.cache, starting=1,
                                  check=self.study.user_attrs.get(ATTR_FIDELITY_CHECK))
        if over is None:
            return False
        self._say_budget(*over)
        return True

    # ------------------------------------------------------------------ study.fidelity.proxy
    def _proxy_runner(self) -> TrialRunner | None:
        """A proxy search's runner of the proxy's trials (the proxy's overrides, its transfer rules); the study's
        sampler and pruner each see one fidelity's trials (:mod:`hpo.samplers._fidelity`)."""
        if self.space.study.fidelity.proxy is None:
            return None
        from hpo.backends import proxy_space, transfer_factors
        from hpo.samplers import with_fidelity
        from hpo.study._optuna import make_sampler

        self.factors = transfer_factors(self.space, self.runner.backend)
        with_fidelity(self.study, make_sampler(self.space.study.sampler, len(self.study.trials) + 1, joining=True))
        return TrialRunner(proxy_space(self.space, self.factors), self.study, self.trials_dir, self.reporter,
                           self.stop_event, self.cwd, self.identity, self.pool, self.runner.over_budget)

    def _kind(self, trials: list[FrozenTrial], like: FrozenTrial) -> list[FrozenTrial]:
        return trials if self.proxy_runner is None else same_kind(trials, like)

    def _search_over(self, target: int) -> bool:
        """Nothing left for this search to run (a proxy search: :func:`~hpo.study._slots.proxy_search_over`)."""
        if self.proxy_runner is None:
            return n_finished(self.study) >= target
        return proxy_search_over(self.study, target, self.space.study.max_retry)

    def _search_step(self, trials: list[FrozenTrial], target: int) -> tuple[bool, bool]:
        """(the search is done, every slot is held: wait) for a search job about to ask for a trial; a proxy search's
        stage is :func:`~hpo.study._slots.proxy_stage`'s."""
        if self.proxy_runner is not None:
            stage = proxy_stage(self.study, self.space, trials, target, self.factors)
            if stage.check is not None:
                self._say_check(stage.check)
            if stage.fallback and not stage.done and self._budget_spent(trials):
                return True, False
            return stage.done, stage.full
        slots = Slots.count(trials, self.space.study.max_retry)
        if slots.finished >= target or self._budget_spent(trials):
            return True, False
        return False, not slots.waiting and len(slots.held) >= target

    def _say_check(self, check: dict[str, object]) -> None:
        """The proxy's check, one line, once per driver."""
        from hpo.samplers import check_line, ties_line

        if not self._said_check:
            self._said_check = True
            ties = ties_line(self.study)  # the proxy's best settings it could not tell apart, on its own seeds
            if ties is not None:
                self.reporter.note(ties)
            self.reporter.note(check_line(check))

    def _trial_over_budget(self) -> bool:
        """Asked by a running search trial at each evaluation: ``study.budget`` leaves it no room to go on
        (:func:`search_over_budget`), so it stops (``stop_reason=budget``)."""
        if self.confirming:
            return False
        over = search_over_budget(self.study.get_trials(deepcopy=False), self.space, self.cache,
                                  check=self.study.user_attrs.get(ATTR_FIDELITY_CHECK))
        if over is not None:
            self._say_budget(*over)
        return over is not None

    def _say_budget(self, spent: float, reserve: float) -> None:
        if not self._said_budget:
            self._said_budget = True
            self.reporter.note(f"budget: {spent:.1f} of {self.space.study.budget:g} full-run equivalents spent and "
                               f"{reserve:.3g} kept for confirmation: no new search trial")

    def _one_trial(self, trial: Trial, target: int) -> FrozenTrial | None:
        """Check the slot of an asked trial (another driver may have taken it), run, record and tell it; None when
        it was surplus or lost."""
        frozen = frozen_trial(self.study, trial.number)
        promoted = is_promoted(frozen)  # study.fidelity.proxy: a proxy setting's queued target run
        tie = is_tie_run(frozen)  # ... or a tied proxy setting's run on another seed
        queued = ATTR_RETRY_OF in frozen.system_attrs or is_confirm(frozen) or promoted or tie  # never surplus
        twin = is_confirm(frozen) and twin_of(self.study, frozen) is not None  # two drivers queued one race run
        twin = twin or promoted and promotion_twin(self.study, frozen) is not None  # ... or one promoted run
        twin = twin or tie and tie_twin(self.study, frozen) is not None  # ... or one tie run
        if self.population is not None and not self.confirming:  # pbt: its own segments, each once
            queued = not self.population.is_surplus(frozen, self.study.get_trials(deepcopy=False))
        if twin or not queued and (self.confirming or self.population is not None or not Slots.count(
                self._kind(self.study.get_trials(deepcopy=False), frozen),
                self.space.study.max_retry).admits(trial.number, target)):
            trial.set_user_attr("stop_reason", "surplus")
            finish(self.study, trial._trial_id, TrialState.FAIL, None)
            return None
        trial.set_user_attr("worker", self.identity)
        runner = self.runner
        if self.proxy_runner is not None and not is_confirm(frozen):
            trial.set_user_attr("fidelity", fidelity_of(frozen))
            if promoted:
                trial.set_user_attr("promoted_from", frozen.system_attrs.get(ATTR_PROMOTED_FROM))
            if tie:
                trial.set_user_attr("tie_of", frozen.system_attrs.get(ATTR_TIE_OF))
                trial.set_user_attr("tie_seed", frozen.system_attrs.get(ATTR_TIE_SEED))
            runner = self.proxy_runner if is_proxy(frozen) else self.runner
        assert self.heartbeat is not None
        lost = self.heartbeat.add(trial._trial_id)
        try:
            try:
                state, values = runner.run(trial, lost)
            except TrialInterrupted:
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                raise
            except TrialRetried as err:  # its Ray node died: FAIL, not counted; its retry is queued
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                self.reporter.note(str(err))
                return None
            record_result(self.study, trial._trial_id, state, values)
            try:
                self.study.tell(trial, values, state=state)
            except (ValueError, UpdateFinishedTrialError):
                raise TrialLost(f"trial {trial.number} was finished by another driver before its result was "
                                "told") from None
            if is_baseline(frozen) and self.space.study.kind != "throughput":  # a timing is this run's own
                try:
                    remember_baseline(self.cache, self.space, self.study.study_name,
                                      frozen_trial(self.study, trial.number))
                except OSError as err:  # a full or read-only disk: the run stands, it is just not kept
                    self.reporter.note(f"baseline run {trial.number} not kept for later studies: {err}")
        except (TrialLost, UpdateFinishedTrialError) as err:
            why = str(err) if isinstance(err, TrialLost) else f"trial {trial.number} was finished by another driver"
            self.reporter.note(f"{why}; its result here is dropped (its retry runs instead)")
            return None
        finally:
            self.heartbeat.remove(trial._trial_id)
        return frozen_trial(self.study, trial.number)
