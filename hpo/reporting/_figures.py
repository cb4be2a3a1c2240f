"""The dashboard's figures: Optuna's plots drawn from a copy of the study in which failed trials are FAIL, and
our own (intermediate values, the timeline) colored by outcome. Every string from a trial is escaped here."""

from __future__ import annotations

import datetime
import functools
import html
import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.record import ATTR_SPACE
from hpo.reporting._report import fmt_value, outcome

SCORE_PREFIX = "score/"  # weighted-objective terms, one user attr per term
PLOT_HEIGHT = 420
MAX_CONTOUR_PARAMS = 4  # contour draws every pair: n^2 panels
# importances, parallel coordinates, slice: at most this many parameters, the most important first. Optuna's plots
# cost the square of the parameters drawn (slice: one axis update per parameter scans every axis; importances:
# a copy of every trial per parameter): 1,000 parameters took 58 s, 7,500 over 300 s.
MAX_PLOT_PARAMS = 16
MAX_PARETO_PAIRS = 6
HOVER_CHARS = 160
# plotly.js config of every figure: no logo, no "edit in Chart Studio" link, nothing that goes online
PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "showSendToCloud": False}
# outcome (hpo.reporting._report.outcome) -> color, in legend order
OUTCOME_COLORS: dict[str, str] = {
    "ok": "#2ca02c", "converged": "#17becf", "plateau": "#9edae5", "collapsed": "#aec7e8", "pruned": "#ff7f0e",
    "budget": "#ffbb78", "oom": "#d62728",
    "predicted_oom": "#ff9896", "killed": "#c49c94", "timeout": "#9467bd", "crash": "#8c564b",
    "host": "#dbdb8d", "interrupted": "#7f7f7f", "running": "#1f77b4", "queued": "#bcbd22",
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


def plottable_copy(study: optuna.Study, only: Collection[str] | None = None) -> optuna.Study:
    """An in-memory copy for plotting: finite COMPLETE and PRUNED trials as they are, every other trial FAIL
    (so Optuna's plots skip it); non-finite intermediate values dropped; trial numbers unchanged. ``only``: the
    trials keep these parameters alone."""
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
            params={k: v for k, v in t.params.items() if only is None or k in only},
            distributions={k: v for k, v in t.distributions.items() if only is None or k in only},
            user_attrs={}, system_attrs={},
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


def outcome_color(o: str) -> str:
    if o.startswith("collapsed:"):  # stopped by the diagnosis (collapsed:nan, collapsed:kl_blowup, ...)
        return OUTCOME_COLORS["collapsed"]
    return OUTCOME_COLORS.get(o, OTHER_COLOR)


def outcome_order(trials: Sequence[FrozenTrial]) -> list[str]:
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
    for o in outcome_order(trials):
        first = True
        for t in (t for t in trials if outcome(t) == o):
            steps = sorted(s for s, v in t.intermediate_values.items() if math.isfinite(v))
            hover = _trial_hover(t, names)
            fig.add_trace(go.Scatter(
                x=steps, y=[t.intermediate_values[s] for s in steps], mode="lines+markers",
                name=html.escape(o), legendgroup=html.escape(o), showlegend=first,
                line={"color": outcome_color(o), "width": 1.5}, marker={"size": 4},
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
    for o in outcome_order(trials):
        group = [t for t in trials if outcome(t) == o]
        starts = [t.datetime_start or now for t in group]
        ends = [t.datetime_complete or now for t in group]
        # one row per trial: without a width plotly makes a trace's bars as thick as the smallest gap between
        # its own trial numbers (two collapsed trials 8 apart drew bars 8 trials tall)
        fig.add_trace(go.Bar(
            name=html.escape(o), orientation="h", y=[t.number for t in group], width=[0.8] * len(group),
            x=[max(1.0, (e - s).total_seconds() * 1000) for s, e in zip(starts, ends)],  # ms on a date axis
            base=[s.isoformat() for s in starts], marker_color=outcome_color(o),
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


def most_important(copy: optuna.Study, params: list[str], n_done: int) -> tuple[list[str], str]:
    """At most :data:`MAX_PLOT_PARAMS` of ``params``, the most important first (the first objective's PED-ANOVA,
    linear in parameters x trials), and a caption saying so; all of them (and no caption) when that few."""
    if len(params) <= MAX_PLOT_PARAMS:
        return params, ""
    if n_done >= 2:
        sign = -1.0 if copy.directions[0] == StudyDirection.MAXIMIZE else 1.0  # PED-ANOVA minimizes a target
        try:
            ranked = list(optuna.importance.get_param_importances(copy, params=params, target=_objective(0, sign)))
            return ranked[:MAX_PLOT_PARAMS], (f"The {MAX_PLOT_PARAMS} most important of {len(params)} parameters "
                                              "(importances among them).")
        except (ValueError, RuntimeError, ZeroDivisionError, IndexError, KeyError):
            pass
    return params[:MAX_PLOT_PARAMS], f"The first {MAX_PLOT_PARAMS} of {len(params)} parameters."


def build_panels(study: optuna.Study) -> list[Panel]:
    """Every plot of the page, in page order."""
    import optuna.visualization as vis

    names = objective_names(study)
    copy = plottable_copy(study)
    done = [t for t in copy.get_trials(deepcopy=False) if is_finite_complete(t)]
    tuned = param_names(study, done)
    params = [p for p in tuned if any(p in t.params for t in done)]  # those with values to plot
    params, few = most_important(copy, params, len(done))
    if few:  # Optuna's plots draw from trials holding the shown parameters alone
        copy = plottable_copy(study, only=set(params))
        done = [t for t in copy.get_trials(deepcopy=False) if is_finite_complete(t)]
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
               caption="PED-ANOVA (Optuna's default)" + ("; one bar per objective." if multi else ".")
               + (f" {few}" if few else "")),
         len(done) >= 2 and bool(params),
         "Cannot be drawn yet: importances need at least 2 completed trials with a finite value "
         f"and a tuned parameter ({need_done}).",
         lambda: importances_figure(copy, names) if multi else vis.plot_param_importances(copy, **first))
    suffix = f" ({names[0]})" if multi else ""
    gate(Panel("parallel", f"Parallel coordinates{suffix}", caption=few), len(done) >= 2 and bool(params),
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
    gate(Panel("slice", f"Slice (objective against each parameter){suffix}", wide=len(params) > 2, caption=few),
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
