"""The summary a search or resume prints when it ends (:func:`summary`): the table of top trials, the trials by
outcome, the trainer time early stopping and pruning saved, the driver's peak RSS, the trial directories' disk use,
what the study spent, then a line for each thing to look at (a proxy search's check, trials not launched for memory or
infeasibility, rows the trainers dropped and logs cut, a throughput search's spread, health labels, storage outages).
``best`` and the dashboard show the proxy search's line too (:func:`fidelity_summary`)."""

from __future__ import annotations

import resource
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from hpo.analysis import HEALTH_KNOBS
from hpo.record import ATTR_FIDELITY_CHECK, is_promoted, is_proxy, steps_run, study_cost
from hpo.reporting._report import dropped_rows, fmt_params, is_surplus, outcome, top_table
from hpo.reporting._speed_search import speed_search_summary
from hpo.samplers import ties_line, unmeasured_words
from hpo.storages import mask_url, storage_downtime, storage_outages


def dropped_summary(trials: list[FrozenTrial]) -> str:
    """The summary's lines on rows the trainers dropped and logs cut at their cap ("" when none)."""
    lost = [t for t in trials if dropped_rows(t)]
    out = ""
    if lost:
        shown = ", ".join(f"{t.number} ({dropped_rows(t)})" for t in lost[:8]) + (" ..." if len(lost) > 8 else "")
        failed = sum(1 for t in lost if t.user_attrs.get("fail_reason") == "dropped_rows")
        out += (f"dropped rows: the trainer went on without rows of its data (their generation or reward raised) in "
                f"trial(s) {shown}: their values were computed without them; {failed} failed for dropping more than "
                f"$VERL_HPO_MAX_DROPPED_ROWS; first: {lost[0].user_attrs.get('dropped_rows_error')}\n")
    cut = [t for t in trials if isinstance(t.user_attrs.get("logs_cut"), dict) and t.user_attrs["logs_cut"]]
    if cut:
        out += ("logs cut at their cap ($VERL_HPO_LOG_CAP_MIB; head and tail kept, the cut said in each): trial(s) "
                + ", ".join(f"{t.number} ({', '.join(map(str, t.user_attrs['logs_cut']))})" for t in cut[:8])
                + (" ..." if len(cut) > 8 else "") + "\n")
    return out


def fidelity_summary(study: optuna.Study) -> str:
    """A proxy search's check in the summary (the agreement figures and what followed); "" for any other study."""
    check = study.user_attrs.get(ATTR_FIDELITY_CHECK)
    if not isinstance(check, dict):
        if any(is_proxy(t) for t in study.get_trials(deepcopy=False)):
            return "proxy: not checked against the target yet (its promoted settings' target runs have not finished)\n"
        return ""
    tau, iv = check.get("tau"), check.get("interval")
    figures = f"tau {tau:.2f}" if isinstance(tau, (int, float)) else "tau n/a"
    if isinstance(iv, list) and len(iv) == 2:
        figures += f" [{iv[0]:.2f}, {iv[1]:.2f}]"
    gap, res = check.get("gap"), check.get("resolution")
    if isinstance(gap, (int, float)) and isinstance(res, (int, float)):
        figures += f"; its best {gap:.4g} from the target's best (resolution {res:.4g})"
    rules = ", ".join(f"{k} {v.get('rule')} x{v.get('factor'):.4g}" for k, v in (check.get("transfer") or {}).items()
                      if isinstance(v, dict) and isinstance(v.get("factor"), (int, float)))
    other = check.get("without_transfer")
    if rules and isinstance(other, dict) and isinstance(other.get("tau"), (int, float)):
        rules += f" (without it, estimated: tau {other['tau']:.2f})"
    what = "held: confirm races the promoted settings on the target" if check.get("holds") else \
        "did not hold: the search went on on the target"
    ties = ties_line(study)  # the proxy's best settings it could not tell apart, re-run on its own seeds
    tied = f"; {ties.removeprefix('proxy tie: ')}" if ties else ""
    words = unmeasured_words(check) if check.get("holds") else None
    if words is not None:
        tied += f"; {words}: a catch-up it never measured, so the race took both"
    return (f"proxy: {what} ({figures} over {check.get('n')} promoted settings at {check.get('steps')} steps"
            f"{'; transfer ' + rules if rules else ''}); {proxy_effect(study, bool(check.get('holds')))}{tied}\n")


def proxy_effect(study: optuna.Study, holds: bool) -> str:
    """What the proxy saved (it held: its search against the same trials' steps on the target) or wasted (it did not:
    its search and the promoted runs), in target full runs at the measured cost ratio."""
    trials = study.get_trials(deepcopy=False)
    cost = study_cost(trials)
    if not cost.full or cost.proxy_ratio is None:
        return "its cost ratio to the target is not measured yet"
    spent = cost.proxy_runs
    if holds:
        same = cost.runs(cost.proxy_steps)
        return (f"its search cost {spent:.1f} target full runs where the same trials on the target would have cost "
                f"{same:.1f}: {same - spent:.1f} saved")
    promoted = cost.runs(sum(steps_run(t) for t in trials if is_promoted(t)))
    return (f"its search ({spent:.1f} target full runs) and the promoted runs ({promoted:.1f}) were spent on a proxy "
            "that did not hold")


def _peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM`` (its own address space; ``ru_maxrss`` carries over a forking parent's
    peak across exec), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM")) / 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def summary(study: optuna.Study, storage: str, trials_dir: str) -> str:
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        if not is_surplus(t):  # asked for and never run: not a trial of the study's
            counts[outcome(t)] = counts.get(outcome(t), 0) + 1
    saved = sum(float(t.user_attrs.get("compute_saved_s", 0.0)) for t in study.get_trials(deepcopy=False))
    parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    driver_mb = _peak_rss_mb()
    from hpo.study import disk_usage

    kept = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("checkpoint_kept")]
    disk = (f"trial directories hold {disk_usage(Path(trials_dir)):.2f} GB"
            + (f" (checkpoints kept of trial(s) {', '.join(str(t.number) for t in kept)})" if kept else ""))
    trials = study.get_trials(deepcopy=False)
    skipped = sum(1 for t in trials if t.user_attrs.get("fail_reason") == "predicted_oom")
    ooms = sum(1 for t in trials if t.user_attrs.get("fail_reason") == "oom")
    memory = (f"memory: {skipped} trial(s) not launched (predicted OOM: their estimate did not fit), {ooms} ran out "
              "of memory; both recorded with the worst value\n") if skipped or ooms else ""
    spread = speed_search_summary(study, trials)  # a throughput search: spread, host load, noise, timeouts
    infeasible = [t for t in trials if t.user_attrs.get("fail_reason") == "infeasible"]
    if infeasible:
        memory += (f"infeasible: {len(infeasible)} trial(s) not launched, their tuned values refused together by the "
                   f"trainer (each value is valid with others: the sampler learns to avoid them; recorded with the "
                   f"worst value); first: trial {infeasible[0].number} {fmt_params(infeasible[0].params)}: "
                   f"{infeasible[0].user_attrs.get('error')}\n")
    health: dict[str, list[int]] = {}
    for t in trials:
        labels = t.user_attrs.get("health")
        for label in labels if isinstance(labels, list) else []:
            health.setdefault(str(label), []).append(t.number)
    speed = "".join(f"health {label}: trial(s) {', '.join(map(str, ns[:8]))}{' ...' if len(ns) > 8 else ''}; look at "
                    f"{HEALTH_KNOBS.get(label, 'its evidence')}\n" for label, ns in sorted(health.items()))
    n_out = storage_outages(study._storage)
    outages = (f"storage unreachable for {storage_downtime(study._storage):.0f} s ({n_out} outage"
               f"{'s' if n_out != 1 else ''}), ridden out: every call waited and went through\n") if n_out else ""
    return (f"{top_table(study)}\n"
            f"trials: {parts}; early stopping and pruning saved ~{saved:.0f}s of trainer time; "
            f"driver peak RSS {driver_mb:.0f} MB; {disk}\n"
            f"spent: {study_cost(study.get_trials(deepcopy=False)).text()}\n"
            f"{fidelity_summary(study)}{memory}{dropped_summary(trials)}{spread}{speed}{outages}"
            f"study {study.study_name} in {mask_url(storage)}\n"
            f"trial logs in {trials_dir}/<number>/ (command.json, config.yaml, stdout.log, stderr.log, "
            f"metrics.jsonl)")
