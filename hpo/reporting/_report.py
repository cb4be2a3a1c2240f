"""Plain-text progress (works without a TTY), the final table of top trials, and ``best`` output; the summary around
that table when a search ends is :mod:`hpo.reporting._summary`."""

from __future__ import annotations

import math
import shlex
import sys
import threading
import time
from typing import Any, TextIO

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Space, format_value
from hpo.record import (
    ATTR_PROMOTED_FROM,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
    is_confirm,
    is_failed,
    is_promoted,
    is_proxy,
    is_tie_run,
    study_cost,
)
from hpo.storages import mask_url
from hpo.study import Confirmed, baseline_confirmed, confirmed

BAR_WIDTH = 20


def fmt_value(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        return str(value)
    return f"{value:.4g}"


def fmt_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def outcome(t: FrozenTrial) -> str:
    """One word for how a trial ended: ok, converged, collapsed, pruned, budget, oom, predicted_oom, killed, timeout,
    crash, bad_metrics, dropped_rows, host, interrupted, driver_error, surplus, running, queued."""
    ua = t.user_attrs
    if t.state == TrialState.RUNNING:
        return "running"
    if t.state == TrialState.WAITING:
        return "queued"
    if "fail_reason" in ua:
        return str(ua["fail_reason"])
    if t.state == TrialState.FAIL:  # surplus (never run), driver_error (could not be launched), or interrupted
        return str(ua.get("stop_reason", "interrupted"))
    if t.state == TrialState.PRUNED:  # by the pruner, or by study.budget
        return "budget" if ua.get("stop_reason") == "budget" else "pruned"
    return str(ua.get("stop_reason", "ok"))


def is_surplus(t: FrozenTrial) -> bool:
    """A trial asked for when another driver had just taken the study's last slot: FAIL, never run, no params."""
    return t.state == TrialState.FAIL and t.user_attrs.get("stop_reason") == "surplus"


class Reporter:
    """Progress over trials (with the running best) and a live line per running trial.

    On a TTY the live line is redrawn in place; otherwise one line is printed per evaluation, so logs
    and tests see the same information."""

    def __init__(self, stream: TextIO | None = None, target: int = 0, direction: str = "maximize",
                 budget: float | None = None) -> None:
        self.stream = stream or sys.stdout
        self.budget = budget  # study.budget (full-run equivalents), shown beside what the study spent
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.target = target
        self.direction = direction
        self._lock = threading.Lock()
        self._live = False
        self._last_tick: dict[int, float] = {}

    def _write(self, line: str, live: bool = False) -> None:
        with self._lock:
            if self.tty:
                self.stream.write("\r\033[K" + line + ("" if live else "\n"))
                self._live = live
            elif not live:
                self.stream.write(line + "\n")
            self.stream.flush()

    def header(self, study: str, storage: str, trials_dir: str, finished: int, target: int,
               target_runs: int | None = None) -> None:
        """``target_runs``: a proxy search's (``study.fidelity.proxy``) finished runs on the target model, apart from
        its ``finished`` proxy trials (``target`` is the proxy's)."""
        self.target = target
        what = "finished trials" if target_runs is None else \
            f"finished proxy trials (and {target_runs} finished on the target model)"
        self._write(f"study {study}: {finished}/{target} {what}; storage {mask_url(storage)}; logs {trials_dir}")

    def note(self, text: str) -> None:
        self._write(text)

    def trial_started(self, number: int, params: dict[str, Any], retry_of: int | None) -> None:
        again = f" (retry of trial {retry_of})" if retry_of is not None else ""
        self._write(f"  trial {number} started{again}: {fmt_params(params)}")

    def trial_eval(self, number: int, step: int, total: int | None, value: float, mem_gb: float) -> None:
        of = f"/{total}" if total else ""
        line = f"  trial {number} step {step}{of} objective {fmt_value(value)} mem {mem_gb:.2f} GB"
        self._write(line, live=self.tty)

    def trial_tick(self, number: int, step: int | None, total: int | None, mem_gb: float) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self._last_tick.get(number, 0.0) < 1.0:
            return
        self._last_tick[number] = now
        of = f"/{total}" if total else ""
        self._write(f"  trial {number} step {'-' if step is None else step}{of} mem {mem_gb:.2f} GB", live=True)

    def trial_finished(self, study: optuna.Study, trial: FrozenTrial, finished: int) -> None:
        done = min(finished, self.target) if self.target else finished
        filled = int(BAR_WIDTH * done / self.target) if self.target else 0
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        if len(study.directions) > 1:
            best_txt = f"pareto front {len(pareto_front(study))} trial(s)"
        else:
            best = best_trial(study)
            best_txt = f"best {fmt_value(best.value)} (trial {best.number}{', proxy' if is_proxy(best) else ''})" \
                if best is not None else "best -"
        ua = trial.user_attrs
        wall = ua.get("wall_time_s")
        extra = f" {wall:.1f}s" if isinstance(wall, (int, float)) else ""
        if isinstance(ua.get("peak_memory_gb"), (int, float)):
            extra += f" peak {ua['peak_memory_gb']:.2f} GB"
        cost = study_cost(study.get_trials(deepcopy=False))
        spent = f" | spent {cost.total_runs:.1f}{f'/{self.budget:g}' if self.budget else ''} runs" \
            if cost.full else ""
        self._write(f"[{bar}] {finished}/{self.target} | {best_txt}{spent} | trial {trial.number} "
                    f"{trial.state.name} {fmt_values(trial.values)} {outcome(trial)}{extra}")


def fmt_values(values: list[float] | None) -> str:
    if not values:
        return "-"
    return fmt_value(values[0]) if len(values) == 1 else "(" + ", ".join(fmt_value(v) for v in values) + ")"


def feasible(t: FrozenTrial) -> bool:
    """All constraints satisfied (<= 0); trials without constraints are feasible."""
    return all(v <= 0 for v in t.constraints.values())


def _finite_complete(study: optuna.Study) -> list[FrozenTrial]:
    """Search trials (not confirmation runs) that can be best: finished, feasible, finite, not failed (a timed-out
    throughput trial's finite value ranks it below every finished trial, never among them)."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not is_confirm(t) and not is_failed(t) and t.values is not None
            and all(math.isfinite(v) for v in t.values) and feasible(t)]


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible COMPLETE trial with a finite value (failed trials complete with +-inf); a proxy search's
    best target run, or its proxy's best before any target run finished (a proxy value is not a target value)."""
    done = _finite_complete(study)
    done = [t for t in done if not is_proxy(t)] or done
    if not done:
        return None
    sign = 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
    return max(done, key=lambda t: sign * float(t.values[0]))


def pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible, finite, non-dominated COMPLETE trials of a multi-objective study (by trial number)."""
    done = _finite_complete(study)
    signs = [1.0 if d == optuna.study.StudyDirection.MAXIMIZE else -1.0 for d in study.directions]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        pa = [s * v for s, v in zip(signs, a.values, strict=True)]
        pb = [s * v for s, v in zip(signs, b.values, strict=True)]
        return all(x >= y for x, y in zip(pa, pb, strict=True)) and pa != pb

    return [t for t in done if not any(dominates(o, t) for o in done)]


def objective_names(study: optuna.Study) -> list[str]:
    names = study.metric_names
    return list(names) if names else [f"value{i}" if len(study.directions) > 1 else "value"
                                      for i in range(len(study.directions))]


def front_table(study: optuna.Study) -> str:
    """The Pareto front as a table: trial, each objective (with its direction), parameters."""
    front = sorted(pareto_front(study), key=lambda t: t.number)
    dirs = ["max" if d == optuna.study.StudyDirection.MAXIMIZE else "min" for d in study.directions]
    names = sorted({k for t in front for k in t.params})
    head = ["trial", *(f"{n} ({d})" for n, d in zip(objective_names(study), dirs, strict=True)), *names]
    rows = [head] + [[str(t.number), *(fmt_value(v) for v in t.values),
                      *(fmt_value(t.params[n]) if isinstance(t.params.get(n), float) else str(t.params.get(n, "-"))
                        for n in names)] for t in front]
    return _table(rows)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def confirmed_table(study: optuna.Study, space: Space | None = None) -> str:
    """Confirmed trials (``verl-hpo confirm``), best first: tuning value, confirmed mean +- std (n), min..max, the
    held-out test mean +- std where measured, parameters; then ``study.baseline`` (given ``space``) on the same
    seeds."""
    ranked = confirmed(study)
    if not ranked:
        return "no confirmation runs have finished yet"
    base = baseline_confirmed(study) if space is not None and space.study.baseline else None
    names = sorted({k for c in ranked for k in c.trial.params})
    tested = any(c.test_values for c in [*ranked, *([base] if base else [])])
    rows = [["trial", "tuning value", "confirmed mean", "std", "n", "min", "max",
             *(["test mean", "test std"] if tested else []), *names]]

    def test_cells(c: Confirmed) -> list[str]:
        if not tested:
            return []
        return [fmt_value(c.test_mean), fmt_value(c.test_std)] if c.test_values else ["-", "-"]

    for c in ranked:
        rows.append([str(c.trial.number), fmt_value(c.trial.values[0] if c.trial.values else None),
                     fmt_value(c.mean), fmt_value(c.std), str(c.n), fmt_value(min(c.values)), fmt_value(max(c.values)),
                     *test_cells(c),
                     *(fmt_value(c.trial.params[n]) if isinstance(c.trial.params.get(n), float)
                       else str(c.trial.params.get(n, "-")) for n in names)])
    if base is not None and space is not None:
        by_name = {p.name: k for p in space.params for k in space.study.baseline if k.lstrip("+") == p.key}
        rows.append(["baseline", "-", fmt_value(base.mean), fmt_value(base.std), str(base.n),
                     fmt_value(min(base.values)), fmt_value(max(base.values)), *test_cells(base),
                     *(fmt_value(space.study.baseline[by_name[n]]) if n in by_name else "(config)" for n in names)])
    return _table(rows)


def top_table(study: optuna.Study, limit: int = 10) -> str:
    """A text table of the top trials (best first; failures and pruned trials after)."""
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    trials = [t for t in study.get_trials(deepcopy=False)
              if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) and not is_surplus(t)]

    def key(t: FrozenTrial) -> tuple[int, float]:
        v = t.values[0] if t.values else None
        if t.state != TrialState.COMPLETE or v is None or not math.isfinite(v):
            return (2, 0.0)
        return (0 if feasible(t) and not is_failed(t) else 1, -v if maximize else v)  # a timed-out one: after

    trials.sort(key=key)
    names = sorted({k for t in trials for k in t.params})
    lost = any(dropped_rows(t) for t in trials[:limit])  # a column only when a shown trial's trainer dropped rows
    head = ["trial", *objective_names(study), "outcome", "diagnosis", *(["dropped_rows"] if lost else []), *names,
            "steps", "wall_s", "peak_gb"]
    rows = [head]
    for t in trials[:limit]:
        ua = t.user_attrs
        values = t.values or [None] * len(study.directions)
        rows.append([
            str(t.number), *(fmt_value(v) for v in values),
            outcome(t) + ("" if feasible(t) else " infeasible")
            + (f" (confirms {ua.get('confirm_of')}, seed {ua.get('confirm_seed')})" if is_confirm(t) else "")
            + fidelity_mark(t),
            str(ua.get("diagnosis", "-")), *([str(dropped_rows(t))] if lost else []),
            *(fmt_value(t.params[n]) if isinstance(t.params.get(n), float) else str(t.params.get(n, "-"))
              for n in names),
            str(ua.get("last_step", "-")), fmt_value(ua.get("wall_time_s")), fmt_value(ua.get("peak_memory_gb")),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if len(trials) > limit:
        lines.append(f"... {len(trials) - limit} more")
    return "\n".join(lines)


def dropped_rows(t: FrozenTrial) -> int:
    """The rows of its data the trial's trainer said it dropped (``Backend.dropped_row_patterns``)."""
    n = t.user_attrs.get("dropped_rows")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def fidelity_mark(t: FrozenTrial) -> str:
    """`` (proxy)`` for a proxy search's trial on the proxy model (with the setting and seed for a tie run),
    `` (promoted from N)`` for a promoted setting's target run, else nothing (``study.fidelity.proxy``)."""
    if is_tie_run(t):
        of, seed = t.system_attrs.get(ATTR_TIE_OF), t.system_attrs.get(ATTR_TIE_SEED)
        return f" (proxy, trial {of}'s setting on seed {seed})"
    if is_proxy(t):
        return " (proxy)"
    if is_promoted(t):
        return f" (promoted from {t.system_attrs.get(ATTR_PROMOTED_FROM)})"
    return ""


# ----------------------------------------------------------------------------- best
def best_overrides(space: Space, trial: FrozenTrial) -> list[str]:
    return [f"{p.key}={format_value(trial.params[p.name])}" for p in space.params if p.name in trial.params]


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def render_best(space: Space, trial: FrozenTrial, fmt: str) -> str:
    """``overrides``: one shell-ready line of tuned ``key=value``; ``yaml``: the same as a nested config
    fragment; ``command``: the full trainer command (config, fixed overrides, tuned values)."""
    if fmt == "yaml":
        flat = {p.key: trial.params[p.name] for p in space.params if p.name in trial.params}
        return yaml.safe_dump(nest(flat), sort_keys=False).rstrip()
    tuned = best_overrides(space, trial)
    if fmt == "command":  # what the trial ran, its environment first (hpo.reporting._command_line)
        from hpo.reporting._command_line import best_command

        return best_command(space, trial)
    return shlex.join(tuned)
