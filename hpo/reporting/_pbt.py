"""``best`` of a population-based training study (``study.strategy: pbt``): the winning lineage, its
hyperparameter schedule (values by step range), final value and checkpoint, as a table or exported as JSON
(``--format schedule``); and the lineage rows the dashboard draws.

Only a healthy segment (it ran to its end with a value) is ever the best; with none, :func:`why_no_best` is the one
line ``best`` prints (exit 1). The checkpoint is shown only when it is still there and no symbolic link leads to it
(else ``checkpoint`` is None and ``checkpoint_problem`` says why)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from hpo.backends import backend_of
from hpo.experiment import Space, format_value
from hpo.record import ATTR_SPACE
from hpo.study import CHECKPOINTS, best_final, checkpoint_problem, lineage_of, no_healthy_line, pbt_total, step_name


def why_no_best(space: Space, study: optuna.Study) -> str:
    """The line ``best`` prints when :func:`best_lineage` finds nothing: no segment with a value yet, or no member
    healthy and how each member's newest segment ended."""
    return no_healthy_line(study, pbt_total(space))


def best_lineage(space: Space, study: optuna.Study, number: int | None = None) -> dict[str, Any] | None:
    """The winning member's lineage (or the one ending in trial ``number``): trials, schedule, value, checkpoint.
    None when no member is healthy (:func:`why_no_best`)."""
    from hpo.study import confirmed

    trials = study.get_trials(deepcopy=False)
    ranked = confirmed(study) if number is None else []
    if ranked:  # confirmed schedules: the best confirmed mean, as for fixed configs
        final: FrozenTrial | None = ranked[0].trial
    elif number is None:
        final = best_final(study, pbt_total(space))
    else:
        final = next((t for t in trials if t.number == number), None)
    if final is None or not final.values:
        return None
    chain = lineage_of(trials, final.number)
    by_number = {t.number: t for t in trials}
    steps: list[dict[str, Any]] = []
    for seg in chain:
        ps = {p.key: seg.params[p.name] for p in space.params if p.name in seg.params}
        if steps and steps[-1]["params"] == seg.params and steps[-1]["end"] == seg.start:
            steps[-1]["end"] = seg.end
            steps[-1]["trials"].append(seg.number)
            continue
        steps.append({"start": seg.start, "end": seg.end, "params": dict(seg.params), "trials": [seg.number],
                      "overrides": [f"{k}={format_value(v)}" for k, v in ps.items()]})
    end = int(final.system_attrs.get("pbt:end", 0))
    trial_dir = final.user_attrs.get("trial_dir")
    ckpt: str | None = None
    problem: str | None = "the trial has no directory"
    if trial_dir:
        parts = [Path(trial_dir).name, CHECKPOINTS, step_name(space, end)]
        problem = checkpoint_problem(Path(trial_dir).parent, parts)
        ckpt = None if problem else str(Path(trial_dir).joinpath(*parts[1:]))
    return {"study": study.study_name, "trial": final.number, "member": final.system_attrs.get("pbt:member"),
            "value": final.values[0], "end": end, "checkpoint": ckpt, "checkpoint_problem": problem,
            "lineage": [{"trial": s.number, "member": s.member, "action": s.action, "start": s.start, "end": s.end,
                         "value": by_number[s.number].values[0] if by_number[s.number].values else None}
                        for s in chain],
            "schedule": steps,
            "confirmed": None if not ranked else {"mean": ranked[0].mean, "std": ranked[0].std, "n": ranked[0].n,
                                                  "values": list(ranked[0].values), "seeds": list(ranked[0].seeds)}}


def render_pbt_best(space: Space, found: dict[str, Any], fmt: str) -> tuple[str, str]:
    """(header for stderr, output for stdout). ``schedule``: the JSON of :func:`best_lineage`; ``overrides`` /
    ``yaml`` / ``command``: the values in force at the end, the schedule in the header."""
    shown = found["checkpoint"] or f"none ({found.get('checkpoint_problem')})"
    lines = [f"# trial {found['trial']} of study {found['study']} (member {found['member']}, step {found['end']}): "
             f"{space.objective.label} {found['value']:.4g}; checkpoint {shown}",
             "# lineage: " + " -> ".join(f"{x['trial']}({x['action']} m{x['member']} {x['start']}-{x['end']})"
                                         for x in found["lineage"]),
             "# schedule (values by step range):"]
    if found.get("confirmed"):
        c = found["confirmed"]
        lines.insert(1, f"# confirmed mean {c['mean']:.4g} +- {c['std']:.3g} over {c['n']} fresh seed(s) "
                        f"(schedule re-run from scratch; min {min(c['values']):.4g}, max {max(c['values']):.4g})")
    lines += [f"#   steps {s['start']}-{s['end']}: {shlex.join(s['overrides'])}" for s in found["schedule"]]
    header = "\n".join(lines)
    if fmt == "schedule":
        return header, json.dumps(found, indent=2)
    last = found["schedule"][-1]
    if fmt == "yaml":
        import yaml

        from hpo.reporting._report import nest

        return header, yaml.safe_dump(nest({o.partition("=")[0]: v for o, v in zip(
            last["overrides"], last["params"].values(), strict=False)}), sort_keys=False).rstrip()
    if fmt == "command":
        fixed = [f"{k}={format_value(v)}" for k, v in space.fixed_overrides().items()]  # secrets: references
        resumable = backend_of(space).resumable  # the trainer's own keys that continue its checkpoint
        resume = [] if found["checkpoint"] is None or resumable is None else \
            resumable.resume_overrides(Path(found["checkpoint"]))
        from hpo.reporting._command_line import command_for

        return header, command_for(space, [*fixed, *last["overrides"], *resume])
    return header, shlex.join(last["overrides"])


def lineage_rows(trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    """One row per segment for the dashboard: member, step range, action, parent, donor, source, value."""
    rows = []
    for t in trials:
        s = t.system_attrs
        if "pbt:member" not in s or t.user_attrs.get("stop_reason") == "surplus":
            continue
        rows.append({"trial": t.number, "member": s["pbt:member"], "start": s["pbt:start"], "end": s["pbt:end"],
                     "action": s.get("pbt:action"), "parent": s.get("pbt:parent_trial"), "donor": s.get("pbt:donor"),
                     "source": s.get("pbt:source"), "state": t.state.name, "params": dict(t.params),
                     "value": t.values[0] if t.values else None, "stop": t.user_attrs.get("stop_reason")})
    return rows


# ----------------------------------------------------------------------------- dashboard
ACTION_COLORS = {"start": "#1f77b4", "continue": "#2ca02c", "exploit": "#ff7f0e", "rollback": "#d62728",
                 "retry": "#9467bd"}


def _hover(r: dict[str, Any]) -> str:
    import html as _html

    stop = f", {r['stop']}" if r["stop"] else ""
    params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items())
    return _html.escape(f"trial {r['trial']} ({r['state'].lower()}{stop}): steps {r['start']}-{r['end']}, "
                        f"value {r['value']}, {params}")


def pbt_panels(study: optuna.Study) -> list[Any]:
    """The dashboard's PBT plots (none for another study): the lineage tree (each segment a bar over its step range
    on its member's row, an arrow from the checkpoint it continued), each member's curve across exploits, and the
    winning lineage's schedule."""

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from hpo.reporting._figures import Panel

    trials = study.get_trials(deepcopy=False)
    rows = lineage_rows(trials)
    if not rows:
        return []
    by_trial = {r["trial"]: r for r in rows}
    tree = go.Figure()
    for action, color in [*ACTION_COLORS.items(), ("stopped early", "#444444")]:
        stopped = action == "stopped early"  # collapsed / failed: a thin bar over the one that replaced it
        mine = [r for r in rows if (r["stop"] is not None) == stopped and (stopped or r["action"] == action)]
        if not mine:
            continue
        tree.add_trace(go.Bar(width=0.3 if stopped else None,
            base=[r["start"] for r in mine], x=[max(r["end"] - r["start"], 0.5) for r in mine],
            y=[f"member {r['member']}" for r in mine], orientation="h", name=action, marker={"color": color},
            opacity=0.8, hovertext=[_hover(r) for r in mine],
            hovertemplate="%{hovertext}<extra></extra>"))
    for r in rows:  # an arrow from the segment whose checkpoint this one continued
        src = by_trial.get(r["source"]) if r["source"] is not None else None
        if src is not None and src["member"] != r["member"]:
            tree.add_annotation(x=r["start"], y=f"member {r['member']}", ax=src["end"], ay=f"member {src['member']}",
                                xref="x", yref="y", axref="x", ayref="y", showarrow=True, arrowhead=2, arrowwidth=2,
                                arrowcolor=ACTION_COLORS.get(r["action"], "#555"))
    tree.update_layout(barmode="overlay", xaxis_title="trainer step", legend_title_text="segment")
    panels = [Panel("pbt-lineage", "PBT lineage (segments by member; arrows: exploited checkpoints)", figure=tree,
                    wide=True, caption="Each bar is one segment (trial) over its step range; an arrow from another "
                    "member's segment marks an exploit, a red bar a rollback after a collapse.")]

    curves = go.Figure()
    for member in sorted({r["member"] for r in rows}):
        points: dict[int, float] = {}
        for r in sorted((r for r in rows if r["member"] == member), key=lambda r: r["trial"]):
            t = next(x for x in trials if x.number == r["trial"])
            for step, v in t.intermediate_values.items():
                if v == v and abs(v) != float("inf"):
                    points[int(step)] = float(v)  # a later segment over the same steps (rollback) replaces them
        steps = sorted(points)
        curves.add_trace(go.Scatter(x=steps, y=[points[s] for s in steps], mode="lines+markers",
                                    name=f"member {member}"))
    for r in rows:
        if r["action"] == "exploit":
            curves.add_vline(x=r["start"], line={"dash": "dot", "width": 1, "color": ACTION_COLORS["exploit"]})
    curves.update_layout(xaxis_title="trainer step", yaxis_title="objective")
    panels.append(Panel("pbt-curves", "PBT members' curves across exploits", figure=curves,
                        caption="One line per member over all its segments; dotted lines: exploits."))

    space_raw = study.user_attrs.get(ATTR_SPACE)
    from hpo.study import best_final

    final = best_final(study)
    if final is not None and isinstance(space_raw, dict):
        chain = lineage_of(trials, final.number)
        names = sorted({k for s in chain for k in s.params})
        fig = make_subplots(rows=max(len(names), 1), cols=1, shared_xaxes=True, subplot_titles=names)
        for i, name in enumerate(names, start=1):
            xs: list[float] = []
            ys: list[Any] = []
            for s in chain:
                xs += [s.start, s.end]
                ys += [s.params.get(name)] * 2
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, showlegend=False), row=i, col=1)
            spec = (space_raw.get("params") or {}).get(name) or {}
            if isinstance(spec, dict) and spec.get("log"):
                fig.update_yaxes(type="log", row=i, col=1)
        fig.update_xaxes(title_text="trainer step", row=max(len(names), 1), col=1)
        panels.append(Panel("pbt-schedule", f"PBT schedule of the best lineage (trial {final.number})", figure=fig,
                            caption="The hyperparameters in force over the winning member's steps "
                                    "(verl-hpo best --format schedule exports them)."))
    return panels


def pbt_table_html(study: optuna.Study) -> str:
    """The segments' lineage as a table (empty for another study)."""
    import html as _html

    rows = lineage_rows(study.get_trials(deepcopy=False))
    if not rows:
        return ""

    def cell(v: Any) -> str:
        return _html.escape("" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))

    head = "".join(f"<th>{h}</th>" for h in ("trial", "member", "steps", "action", "parent", "donor",
                                             "continued from", "value", "stop", "hyperparameters"))
    body = "".join(
        f"<tr data-trial=\"{r['trial']}\"><td>{r['trial']}</td><td>{r['member']}</td><td>{r['start']}-{r['end']}</td>"
        f"<td>{cell(r['action'])}</td><td>{cell(r['parent'])}</td><td>{cell(r['donor'])}</td><td>{cell(r['source'])}"
        f"</td><td>{cell(r['value'])}</td><td>{cell(r['stop'])}</td><td>"
        + cell(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items()))
        + "</td></tr>" for r in rows)
    return (f'<h2 id="pbt-title">PBT lineage ({len(rows)} segments)</h2>\n<table class="trials" id="pbt">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
