"""One self-contained HTML page per study: ``studies/<study>/dashboard.html``.

The page works offline and alone: plotly.js is embedded once, each figure is a ``Plotly.newPlot`` call on
inline JSON, and nothing is fetched (no CDN, fonts, MathJax or topojson). It shows a header (study, storage,
space file, directions, trials by outcome, best value and parameters, compute spent and saved), Optuna's
plots (optimization history, parameter importances, parallel coordinates, contour, slice; for multi-objective
studies the Pareto front and hypervolume history), two of our own (intermediate values and the timeline,
both colored by *outcome*: a trial that ran out of memory completes in Optuna with the worst value, so
Optuna's state alone does not say what happened), and a table of every trial.

Plots are drawn from a copy of the study in memory in which COMPLETE trials with a non-finite value (failed
trials record ``-inf``/``+inf``), and every other trial that is not PRUNED, are FAIL: Optuna's plots skip
them, trial numbers stay the same. The table lists every trial with its reason. A plot that cannot be drawn
yet (importances with one finished trial) is replaced by a one-line explanation.

Every string from a trial (reasons, errors, stderr tails, parameter values) is HTML-escaped, in the page
and in plot hover texts (plotly renders a few tags in them); plotly's own JSON escapes ``<``, ``>``, ``/``.

The live alternative is optuna-dashboard (``pip install optuna-dashboard``;
``optuna-dashboard sqlite:///studies/<study>.db``); it reads the database while workers write it, and on
SQLite that can fail with "database is locked" (optuna-dashboard #545): prefer this page, or a server
database, while a parallel search runs.
"""

from __future__ import annotations

import datetime
import functools
import html
import itertools
import json
import math
import os
import sys
import threading
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.reporting._report import fmt_value, outcome
from hpo.study._confirm import confirmed, is_confirm
from hpo.study._driver import ATTR_SOURCE, ATTR_SPACE, quiet_optuna
from hpo.study._storage import mask_url

SCORE_PREFIX = "score/"  # weighted-objective terms, one user attr per term
PLOT_HEIGHT = 420
MAX_CONTOUR_PARAMS = 4  # contour draws every pair: n^2 panels
MAX_PARETO_PAIRS = 6
HOVER_CHARS = 160
# plotly.js config of every figure: no logo, no "edit in Chart Studio" link, nothing that goes online
PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "showSendToCloud": False}
# outcome (hpo.reporting._report.outcome) -> color, in legend order
OUTCOME_COLORS: dict[str, str] = {
    "ok": "#2ca02c", "converged": "#17becf", "plateau": "#9edae5", "collapsed": "#aec7e8", "pruned": "#ff7f0e",
    "oom": "#d62728",
    "predicted_oom": "#ff9896", "killed": "#c49c94", "timeout": "#9467bd", "crash": "#8c564b",
    "interrupted": "#7f7f7f", "running": "#1f77b4", "queued": "#bcbd22",
}
OTHER_COLOR = "#e377c2"


@dataclass
class Panel:
    """One plot of the page: a figure, or the reason there is none yet."""

    key: str
    title: str
    figure: Any = None  # plotly.graph_objects.Figure
    reason: str | None = None
    caption: str = ""
    wide: bool = False  # spans the page width
    height: int = PLOT_HEIGHT


# ----------------------------------------------------------------------------- study facts
def objective_names(study: optuna.Study) -> list[str]:
    """``study.metric_names``, else the stored space's objective metric, else "objective i"."""
    names = study.metric_names
    if names:
        return [str(n) for n in names]
    space = study.user_attrs.get(ATTR_SPACE)
    metric = space.get("objective", {}).get("metric") if isinstance(space, dict) else None
    if len(study.directions) == 1:
        return [str(metric) if metric else "objective"]
    return [f"objective {i}" for i in range(len(study.directions))]


def param_names(study: optuna.Study, trials: Sequence[FrozenTrial]) -> list[str]:
    """Tuned parameters: the space file's (in its order), then any others the trials have, by name."""
    space = study.user_attrs.get(ATTR_SPACE)
    declared = [str(n) for n in space.get("params", {})] if isinstance(space, dict) else []
    seen = {k for t in trials for k in t.params}
    return declared + sorted(seen - set(declared))


def is_finite_complete(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and t.values is not None and all(math.isfinite(v) for v in t.values)


def duration_s(t: FrozenTrial) -> float | None:
    """The trainer's wall time (driver's measure), else Optuna's start-to-complete time."""
    wall = t.user_attrs.get("wall_time_s")
    if isinstance(wall, (int, float)) and math.isfinite(wall):
        return float(wall)
    if t.datetime_start is not None and t.datetime_complete is not None:
        return (t.datetime_complete - t.datetime_start).total_seconds()
    return None


def plottable_copy(study: optuna.Study) -> optuna.Study:
    """An in-memory copy for plotting: finite COMPLETE and PRUNED trials as they are, every other trial FAIL
    (so Optuna's plots skip it); non-finite intermediate values dropped; trial numbers unchanged."""
    storage = optuna.storages.InMemoryStorage()
    copy = optuna.Study(study_name=storage.get_study_name_from_id(
        storage.create_new_study(list(study.directions), study.study_name)), storage=storage)
    if study.metric_names:
        copy.set_metric_names(list(study.metric_names))
    for t in study.get_trials(deepcopy=False):
        keep = is_finite_complete(t) or t.state == TrialState.PRUNED
        state = t.state if keep else TrialState.FAIL
        values = t.values if is_finite_complete(t) else None
        if t.state == TrialState.PRUNED and not (t.values is not None and all(math.isfinite(v) for v in t.values)):
            values = None
        inter = {s: v for s, v in t.intermediate_values.items() if math.isfinite(v)}
        copy.add_trial(FrozenTrial(
            number=t.number, state=state, value=None, values=values,
            datetime_start=t.datetime_start or datetime.datetime.now(),
            datetime_complete=t.datetime_complete or datetime.datetime.now(),
            params=dict(t.params), distributions=dict(t.distributions), user_attrs={}, system_attrs={},
            intermediate_values=inter, trial_id=t.number))
    return copy


# ----------------------------------------------------------------------------- plots
def _safe_text(text: Any, limit: int = HOVER_CHARS) -> str:
    """For plotly hover text: first line, cut, escaped (plotly renders <b>, <br>, <a> ... in text)."""
    line = (str(text).strip().splitlines() or [""])[-1]
    return html.escape(line if len(line) <= limit else line[: limit - 3] + "...")


def _trial_hover(t: FrozenTrial, names: list[str]) -> str:
    parts = [f"trial {t.number}: {html.escape(outcome(t))}"]
    if t.values is not None:
        parts.append(", ".join(f"{html.escape(n)}={fmt_value(v)}" for n, v in zip(names, t.values)))
    err = t.user_attrs.get("error") or t.user_attrs.get("stderr_tail")
    if err:
        parts.append(_safe_text(err))
    return "<br>".join(parts)


def _color(o: str) -> str:
    if o.startswith("collapsed:"):  # stopped by the diagnosis (collapsed:nan, collapsed:kl_blowup, ...)
        return OUTCOME_COLORS["collapsed"]
    return OUTCOME_COLORS.get(o, OTHER_COLOR)


def _outcome_order(trials: Sequence[FrozenTrial]) -> list[str]:
    present = {outcome(t) for t in trials}
    return [o for o in OUTCOME_COLORS if o in present] + sorted(present - set(OUTCOME_COLORS))


def intermediate_figure(study: optuna.Study, names: list[str]) -> Panel:
    """Each trial's reported objective over trainer steps, one color per outcome."""
    import plotly.graph_objects as go

    panel = Panel("intermediate", "Intermediate values (objective at each evaluation)",
                  caption="One line per trial, colored by how it ended.")
    trials = [t for t in study.get_trials(deepcopy=False)
              if any(math.isfinite(v) for v in t.intermediate_values.values())]
    if not trials:
        panel.reason = ("Multi-objective trials report no intermediate values (Optuna's trial.report is "
                        "single-objective)." if len(study.directions) > 1 else
                        "No trial has reported an intermediate value yet.")
        return panel
    fig = go.Figure()
    for o in _outcome_order(trials):
        first = True
        for t in (t for t in trials if outcome(t) == o):
            steps = sorted(s for s, v in t.intermediate_values.items() if math.isfinite(v))
            hover = _trial_hover(t, names)
            fig.add_trace(go.Scatter(
                x=steps, y=[t.intermediate_values[s] for s in steps], mode="lines+markers",
                name=html.escape(o), legendgroup=html.escape(o), showlegend=first,
                line={"color": _color(o), "width": 1.5}, marker={"size": 4},
                hovertext=[hover] * len(steps), hovertemplate="step %{x}: %{y}<br>%{hovertext}<extra></extra>"))
            first = False
    fig.update_layout(xaxis_title="step", yaxis_title=html.escape(names[0]) if len(names) == 1 else "reported value",
                      legend_title_text="outcome")
    panel.figure = fig
    return panel


def timeline_figure(study: optuna.Study, names: list[str]) -> Panel:
    """When each trial ran, one color per outcome (the reason in the hover text)."""
    import plotly.graph_objects as go

    panel = Panel("timeline", "Timeline of trials", caption="Bars span start to end (running trials: to now); "
                  "hover for the reason.")
    now = datetime.datetime.now()
    trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_start is not None]
    if not trials:
        panel.reason = "No trial has started yet."
        return panel
    fig = go.Figure()
    for o in _outcome_order(trials):
        group = [t for t in trials if outcome(t) == o]
        starts = [t.datetime_start or now for t in group]
        ends = [t.datetime_complete or now for t in group]
        # one row per trial: without a width plotly makes a trace's bars as thick as the smallest gap between
        # its own trial numbers (two collapsed trials 8 apart drew bars 8 trials tall)
        fig.add_trace(go.Bar(
            name=html.escape(o), orientation="h", y=[t.number for t in group], width=[0.8] * len(group),
            x=[max(1.0, (e - s).total_seconds() * 1000) for s, e in zip(starts, ends)],  # ms on a date axis
            base=[s.isoformat() for s in starts], marker_color=_color(o),
            hovertext=[_trial_hover(t, names) for t in group], hovertemplate="%{hovertext}<extra></extra>"))
    dtick = max(1, math.ceil(max(t.number for t in trials) / 15))  # whole trial numbers only
    fig.update_layout(xaxis={"type": "date", "title": "time"}, yaxis={"title": "trial", "dtick": dtick},
                      barmode="overlay",
                      legend_title_text="outcome")
    panel.figure = fig
    return panel


def _optuna_panel(panel: Panel, make: Callable[[], Any]) -> Panel:
    """Run an Optuna plot function; an exception or an empty figure becomes the panel's reason."""
    try:
        fig = make()
    except (ValueError, RuntimeError, ZeroDivisionError, IndexError, KeyError) as err:
        panel.reason = f"Cannot be drawn yet: {(str(err).strip().splitlines() or [type(err).__name__])[0]}"
        return panel
    if not fig.data:
        panel.reason = "Cannot be drawn yet: no trial has data for it."
        return panel
    panel.figure = fig
    return panel


def reference_point(trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]) -> list[float]:
    """A point a bit worse than every finite trial in each objective (10% of the range, at least 1e-6)."""
    point = []
    for i, d in enumerate(directions):
        vals = [float(t.values[i]) for t in trials]
        span = max(vals) - min(vals)
        margin = 0.1 * span if span > 0 else max(0.1 * abs(vals[0]), 1e-6)
        point.append(max(vals) + margin if d == StudyDirection.MINIMIZE else min(vals) - margin)
    return point


def build_panels(study: optuna.Study) -> list[Panel]:
    """Every plot of the page, in page order."""
    import optuna.visualization as vis

    names = objective_names(study)
    copy = plottable_copy(study)
    done = [t for t in copy.get_trials(deepcopy=False) if is_finite_complete(t)]
    tuned = param_names(study, done)
    params = [p for p in tuned if any(p in t.params for t in done)]  # those with values to plot
    multi = len(study.directions) > 1
    panels: list[Panel] = []
    need_done = f"{len(done)} completed trial(s) with a finite value so far"

    def gate(panel: Panel, ok: bool, why: str, make: Callable[[], Any]) -> None:
        if not ok:
            panel.reason = why
            panels.append(panel)
        else:
            panels.append(_optuna_panel(panel, make))

    # single objective: Optuna knows the direction; several: plots of one objective show the first
    first: dict[str, Any] = {"target_name": names[0]}
    if multi:
        first["target"] = _objective(0)
        for i, j in list(itertools.combinations(range(len(names)), 2))[:MAX_PARETO_PAIRS]:
            gate(Panel(f"pareto-{i}-{j}", f"Pareto front: {names[i]} vs {names[j]}",
                       caption="Pareto-optimal over all objectives, projected on two of them."),
                 bool(done), f"Cannot be drawn yet: {need_done}.",
                 functools.partial(vis.plot_pareto_front, copy, targets=_pair(i, j), target_names=[names[i], names[j]]))
        gate(Panel("hypervolume", "Hypervolume history",
                   caption="Reference point: 10% beyond the worst finite value of each objective."),
             bool(done), f"Cannot be drawn yet: {need_done}.",
             lambda: vis.plot_hypervolume_history(copy, reference_point(done, study.directions)))
        for i, n in enumerate(names):
            gate(Panel(f"history-{i}", f"Optimization history: {n}"), bool(done),
                 f"Cannot be drawn yet: {need_done}.",
                 functools.partial(vis.plot_optimization_history, copy, target=_objective(i), target_name=n))
    else:
        gate(Panel("history", "Optimization history", caption="Each trial's value and the best so far."),
             bool(done), f"Cannot be drawn yet: {need_done}.",
             lambda: vis.plot_optimization_history(copy, target_name=names[0]))
    panels.append(intermediate_figure(study, names))
    gate(Panel("importances", "Parameter importances",
               caption="PED-ANOVA (Optuna's default)" + ("; one bar per objective." if multi else ".")),
         len(done) >= 2 and bool(params),
         "Cannot be drawn yet: importances need at least 2 completed trials with a finite value "
         f"and a tuned parameter ({need_done}).",
         lambda: importances_figure(copy, names) if multi else vis.plot_param_importances(copy, **first))
    suffix = f" ({names[0]})" if multi else ""
    gate(Panel("parallel", f"Parallel coordinates{suffix}"), len(done) >= 2 and bool(params),
         f"Cannot be drawn yet: parallel coordinates need at least 2 completed trials ({need_done}).",
         lambda: vis.plot_parallel_coordinate(copy, params=params, **first))
    numeric = [p for p in params if len({t.params.get(p) for t in done if p in t.params}) > 1]
    if len(tuned) >= 2:
        shown = numeric[:MAX_CONTOUR_PARAMS]
        gate(Panel("contour", f"Contour of tuned pairs{suffix}", wide=len(shown) > 2,
                   height=PLOT_HEIGHT if len(shown) <= 2 else 200 * len(shown),
                   caption=f"First {MAX_CONTOUR_PARAMS} varied parameters." if len(numeric) > MAX_CONTOUR_PARAMS
                   else ""),
             len(done) >= 2 and len(shown) >= 2,
             f"Cannot be drawn yet: a contour needs two parameters that took 2+ values in 2+ completed trials "
             f"({need_done}).",
             lambda: vis.plot_contour(copy, params=shown, **first))
    gate(Panel("slice", f"Slice (objective against each parameter){suffix}", wide=len(params) > 2),
         bool(done) and bool(params),
         f"Cannot be drawn yet: {need_done}" + ("" if tuned else ", no tuned parameter") + ".",
         lambda: vis.plot_slice(copy, params=params, **first))
    panels.append(timeline_figure(study, names))
    for p in panels:
        if p.figure is not None:  # Optuna sets fixed widths (300 px per slice panel): fit the page instead
            p.figure.update_layout(width=None, autosize=True, height=p.height, title=None,
                                   margin={"t": 30, "b": 50, "l": 60, "r": 20})
    return panels


def _objective(i: int, sign: float = 1.0) -> Callable[[FrozenTrial], float]:
    return lambda t: sign * float(t.values[i])


def _pair(i: int, j: int) -> Callable[[FrozenTrial], tuple[float, float]]:
    return lambda t: (float(t.values[i]), float(t.values[j]))


def importances_figure(copy: optuna.Study, names: list[str]) -> Any:
    """Optuna's importance bars, one trace per objective. PED-ANOVA treats a ``target`` as minimized, so a
    maximized objective is negated (Optuna's own multi-objective plot does not)."""
    import optuna.visualization as vis

    fig = None
    for i, (name, d) in enumerate(zip(names, copy.directions)):
        sign = -1.0 if d == StudyDirection.MAXIMIZE else 1.0
        one = vis.plot_param_importances(copy, target=_objective(i, sign), target_name=name)
        for trace in one.data:
            trace.name, trace.showlegend = name, True
        if fig is None:
            fig = one
        else:
            fig.add_traces(list(one.data))
    assert fig is not None
    fig.update_layout(barmode="group", showlegend=True, legend_title_text="objective")
    return fig


# ----------------------------------------------------------------------------- HTML
CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; margin: 1.5em;
       color: #222; background: #fff; }
h1 { font-size: 1.5em; margin: 0 0 .4em 0; } h2 { font-size: 1.1em; margin: .2em 0; }
dl.head { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; margin: 0 0 1em 0; }
dl.head dt { font-weight: 600; } dl.head dd { margin: 0; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 1em; }
section.plot { border: 1px solid #ddd; border-radius: 6px; padding: .5em; min-width: 0; }
section.plot.wide { grid-column: 1 / -1; }
p.caption { color: #666; font-size: .85em; margin: 0 0 .3em 0; }
p.not-yet { color: #8a6d3b; background: #fcf8e3; padding: .6em; border-radius: 4px; }
h2#trials-title { margin-top: 1em; }
table.trials { border-collapse: collapse; font-size: .85em; margin-top: .5em; }
table.trials th, table.trials td { border: 1px solid #ddd; padding: .2em .45em; text-align: right;
                                   vertical-align: top; white-space: nowrap; }
table.trials th { background: #f3f3f3; position: sticky; top: 0; }
table.trials td.text { text-align: left; }
table.trials td.error { text-align: left; white-space: normal; min-width: 16em; max-width: 40em;
                        overflow-wrap: anywhere; }
pre { white-space: pre-wrap; font-size: .9em; max-height: 20em; overflow: auto; }
footer { color: #666; font-size: .85em; margin-top: 2em; }
""".strip()


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, (int, float)):
        return fmt_value(float(value)) if isinstance(value, float) else str(value)
    return _e(value)


def _param_text(value: Any) -> str:
    return _e(f"{value:.4g}" if isinstance(value, float) else value)


def _trial_href(t: FrozenTrial, out_dir: Path, studies_dir: Path | None, study_name: str) -> str | None:
    """A relative link from the page to the trial's log directory (file://, never the network)."""
    raw = t.user_attrs.get("trial_dir")
    if isinstance(raw, str) and raw:
        path = Path(raw)
    elif studies_dir is not None:
        path = studies_dir / study_name / "trials" / str(t.number)
    else:
        return None
    try:
        rel = os.path.relpath(path.resolve(), out_dir.resolve())
    except ValueError:  # another drive (Windows)
        return None
    return urllib.parse.quote(Path(rel).as_posix()) + "/"


def _counts(trials: Sequence[FrozenTrial]) -> tuple[str, str]:
    states: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
        outcomes[outcome(t)] = outcomes.get(outcome(t), 0) + 1
    order = _outcome_order(trials)
    return (", ".join(f"{n} {s}" for s, n in states.items()), ", ".join(f"{outcomes[o]} {o}" for o in order))


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def header_html(study: optuna.Study, storage_url: str, names: list[str], params: list[str]) -> str:
    trials = study.get_trials(deepcopy=False)
    directions = ", ".join(f"{n}: {d.name.lower()}" for n, d in zip(names, study.directions))
    by_state, by_outcome = _counts(trials)
    total = sum(d for d in (duration_s(t) for t in trials) if d is not None)
    saved = sum(float(v) for t in trials if isinstance(v := t.user_attrs.get("compute_saved_s"), (int, float))
                and math.isfinite(v))
    done = [t for t in trials if is_finite_complete(t) and not is_confirm(t)]
    if not done:
        best = "none yet (no completed trial with a finite value)"
    elif len(study.directions) == 1:
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        b = max(done, key=lambda t: sign * float(t.values[0]))
        shown = " ".join(f"{k}={_param_text(b.params[k])}" for k in params if k in b.params)
        best = f"{_e(fmt_value(b.values[0]))} (trial {b.number}) {shown}"
    else:
        front = plottable_copy(study).best_trials
        best = f"{len(front)} Pareto-optimal trial(s): " + ", ".join(
            f"#{t.number} (" + ", ".join(_e(fmt_value(v)) for v in t.values) + ")" for t in front[:10])
        if len(front) > 10:
            best += ", ..."
    rows = [
        ("study", _e(study.study_name)), ("storage", _e(mask_url(storage_url))),
        ("space file", _e(study.user_attrs.get(ATTR_SOURCE, "-"))), ("direction(s)", _e(directions)),
        ("trials", _e(f"{len(trials)}" + (f" ({by_state})" if trials else ""))),
        ("outcomes", _e(by_outcome or "-")), ("best", best),
        ("compute", _e(f"{_seconds(total)} of trainer time; pruning and early stopping saved ~{_seconds(saved)}")),
        ("written", _e(datetime.datetime.now().isoformat(timespec="seconds"))),
    ]
    body = "\n".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<h1>Study {_e(study.study_name)}</h1>\n<dl class="head" id="header">\n{body}\n</dl>'


def confirmed_html(study: optuna.Study) -> str:
    """The seed-confirmed ranking (``verl-hpo confirm``); nothing when no confirmation run has finished."""
    ranked = confirmed(study)
    if not ranked:
        return ""
    rows = "\n".join(
        f'<tr data-confirmed="{c.trial.number}"><td>{c.trial.number}</td>'
        f"<td>{_num(c.trial.values[0] if c.trial.values else None)}</td>"
        f"<td>{_num(c.mean)}</td><td>{_num(c.std)}</td><td>{c.n}</td><td>{_num(min(c.values))}</td>"
        f"<td>{_num(max(c.values))}</td><td>{_e(', '.join(map(str, c.seeds)))}</td></tr>" for c in ranked)
    head = "".join(f"<th>{h}</th>" for h in ("trial", "tuning value", "confirmed mean", "std", "n", "min", "max",
                                             "seeds"))
    return ('<h2 id="confirmed-title">Seed-confirmed ranking</h2>\n<table class="trials" id="confirmed">'
            f"<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody></table>")


def table_html(study: optuna.Study, names: list[str], params: list[str], out_dir: Path,
               studies_dir: Path | None) -> str:
    trials = study.get_trials(deepcopy=False)
    scores = sorted({k for t in trials for k in t.user_attrs if k.startswith(SCORE_PREFIX)})
    head = ["#", "state", "outcome", "diagnosis", *names, *scores, *params, "duration", "peak memory", "saved",
            "logs", "error"]
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    rows = []
    for t in trials:
        ua = t.user_attrs
        values = list(t.values) if t.values is not None else [None] * len(names)
        href = _trial_href(t, out_dir, studies_dir, study.study_name)
        link = f'<a href="{_e(href)}">{_e(href)}</a>' if href else "-"
        err = ua.get("error")
        tail = ua.get("stderr_tail")
        detail = _e(err) if err else ""
        if tail:
            detail += f"<details><summary>stderr</summary><pre>{_e(tail)}</pre></details>"
        d = duration_s(t)
        peak = ua.get("peak_memory_gb")
        cells = [
            str(t.number), _e(t.state.name),
            f'<span class="outcome" style="color: {_color(outcome(t))}">{_e(outcome(t))}</span>'
            + (f' <span class="confirm">confirms #{_e(ua.get("confirm_of"))}, seed {_e(ua.get("confirm_seed"))}'
               "</span>" if is_confirm(t) else ""),
            f'<span class="diagnosis" title="{_e(json.dumps(ua.get("diagnosis_evidence", {}), default=str))}">'
            f'{_e(ua.get("diagnosis", "-"))}</span>',
            *(_num(v) for v in values), *(_num(ua.get(k)) for k in scores),
            *(_param_text(t.params[p]) if p in t.params else "-" for p in params),
            "-" if d is None else _e(_seconds(d)),
            f"{peak:.2f} GB" if isinstance(peak, (int, float)) else "-",
            _num(ua.get("compute_saved_s")), link, detail,
        ]
        last = len(cells) - 1
        tds = "".join(f'<td class="error">{c}</td>' if i == last else
                      f'<td class="text">{c}</td>' if i in (2, 3, last - 1) else f"<td>{c}</td>"
                      for i, c in enumerate(cells))
        rows.append(f'<tr data-trial="{t.number}">{tds}</tr>')
    body = "\n".join(rows) if rows else f'<tr><td colspan="{len(head)}">no trials yet</td></tr>'
    return (f'<h2 id="trials-title">Trials ({len(trials)})</h2>\n<table class="trials" id="trials">'
            f"<thead><tr>{th}</tr></thead>\n<tbody>\n{body}\n</tbody></table>")


def panel_html(panel: Panel, index: int) -> str:
    caption = f'<p class="caption">{_e(panel.caption)}</p>' if panel.caption else ""
    if panel.figure is None:
        return (f'<section class="plot" data-plot="{_e(panel.key)}"><h2>{_e(panel.title)}</h2>{caption}'
                f'<p class="not-yet">{_e(panel.reason or "Cannot be drawn yet.")}</p></section>')
    div = f'<div id="plot-{index}" class="plotly-graph-div" style="height: {panel.height}px; width: 100%"></div>'
    wide = " wide" if panel.wide else ""
    return (f'<section class="plot{wide}" data-plot="{_e(panel.key)}"><h2>{_e(panel.title)}</h2>{caption}'
            f"{div}</section>")


def build_html(study: optuna.Study, *, storage_url: str, out_dir: Path, studies_dir: Path | None = None) -> str:
    """The whole page as one string (``out_dir``: where it will be written, for the relative log links)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature and PED-ANOVA notes
        return _page(study, storage_url, out_dir, studies_dir)


def _page(study: optuna.Study, storage_url: str, out_dir: Path, studies_dir: Path | None) -> str:
    import plotly.offline

    names = objective_names(study)
    params = param_names(study, study.get_trials(deepcopy=False))
    panels = build_panels(study)
    plots = "\n".join(panel_html(p, i) for i, p in enumerate(panels))
    figures = {f"plot-{i}": p.figure for i, p in enumerate(panels) if p.figure is not None}
    db = mask_url(storage_url) if storage_url.startswith("sqlite:///") else "<storage URL>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; \
style-src 'unsafe-inline'; img-src data: blob:; font-src data:">
<title>{_e(study.study_name)}: verl-hpo study dashboard</title>
<style>{CSS}</style>
<script>{plotly.offline.get_plotlyjs()}</script>
</head><body>
{header_html(study, storage_url, names, params)}
<div class="plots">
{plots}
</div>
{confirmed_html(study)}
{table_html(study, names, params, out_dir, studies_dir)}
<footer>Written by <code>verl-hpo dashboard</code>; a snapshot: run it again (or let search/resume rewrite it)
to refresh. Live alternative: <code>pip install optuna-dashboard; optuna-dashboard {_e(db)}</code>. On SQLite,
reading the database while parallel workers write it can fail with "database is locked".</footer>
{figures_script(figures)}
</body></html>
"""


def figures_script(figures: dict[str, Any]) -> str:
    """The figures as one JSON block (not executed) and the loop that draws them, at the end of the body so the
    grid has its final layout (plotly sizes a plot from its container when it is drawn). ``JSON.parse``
    rejects NaN/Infinity: plotly's encoder writes null for them, and escapes ``<``, ``>`` and ``/``."""
    import plotly.io

    parts = [f"{json.dumps(key)}: {plotly.io.to_json(fig, validate=True)}" for key, fig in figures.items()]
    blob = "{" + ",\n".join(parts) + "}"
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e")  # plotly does this too; not relied upon
    return (f'<script id="figures" type="application/json">{blob}</script>\n<script>\n'
            "const FIGURES = JSON.parse(document.getElementById('figures').textContent);\n"
            f"const CONFIG = {json.dumps(PLOT_CONFIG)};\n"
            "for (const [id, fig] of Object.entries(FIGURES)) {  // one broken plot must not stop the others\n"
            "  try { Plotly.newPlot(id, fig.data, fig.layout || {}, CONFIG); }\n"
            "  catch (e) { console.error(id, e); document.getElementById(id).textContent = 'plot failed: ' + e; }\n"
            "}\n</script>")


def write_dashboard(study: optuna.Study, out: Path, *, storage_url: str, studies_dir: Path | None = None) -> Path:
    """Write the study's page to ``out`` (atomically: a browser reloading it never sees half a page)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = build_html(study, storage_url=storage_url, out_dir=out.parent, studies_dir=studies_dir)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


def dashboard_path(studies_dir: Path, study_name: str) -> Path:
    return studies_dir / study_name / "dashboard.html"


class DashboardCallback:
    """After-trial callback: rewrite the page every ``every`` finished trials, in a background thread (a page
    takes seconds: importances load scikit-learn; the trial loop must not wait for it; a write still
    running is not started twice). Never raises (a broken page must not stop a search): the first problem
    is printed once to stderr."""

    def __init__(self, out: Path, storage_url: str, studies_dir: Path | None = None, every: int = 5) -> None:
        self.out, self.storage_url, self.studies_dir, self.every = out, storage_url, studies_dir, max(1, every)
        self._lock = threading.Lock()
        self._count = 0
        self._warned = False
        self._thread: threading.Thread | None = None

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._count += 1
        if self._count % self.every or not self._lock.acquire(blocking=False):
            return
        self._thread = threading.Thread(target=self._write, args=(study,), name="verl-hpo-dashboard", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the write in flight (if any) is done."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _write(self, study: optuna.Study) -> None:
        try:
            write_dashboard(study, self.out, storage_url=self.storage_url, studies_dir=self.studies_dir)
        except Exception as err:  # noqa: BLE001 - the page is a convenience
            if not self._warned:
                self._warned = True
                print(f"warning: dashboard not written: {type(err).__name__}: {err}", file=sys.stderr)
        finally:
            self._lock.release()


def dashboard_command(study_name: str, storage_url: str, studies_dir: Path, out: Path | None = None) -> int:
    """``verl-hpo dashboard``: load the study (read only) and write its page; prints the path."""
    from hpo.experiment._space import StudySpec
    from hpo.study._storage import open_storage, study_exists

    quiet_optuna()
    storage = open_storage(storage_url, StudySpec())
    if not study_exists(storage, study_name):
        print(f"error: no study {study_name!r} in {mask_url(storage_url)}", file=sys.stderr)
        return 2
    study = optuna.load_study(study_name=study_name, storage=storage)
    path = write_dashboard(study, out or dashboard_path(studies_dir, study_name), storage_url=storage_url,
                           studies_dir=studies_dir)
    print(path)
    return 0
