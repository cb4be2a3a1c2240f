"""One self-contained HTML page per study: ``studies/<study>/dashboard.html`` (when and in which process it is
written is :mod:`hpo.reporting._dashboard`).

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
import html
import json
import math
import os
import threading
import urllib.parse
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from hpo.analysis import check_output_path, make_output_dir
from hpo.record import ATTR_SOURCE, is_confirm, is_failed, is_proxy, rungs, steps_run, study_cost
from hpo.reporting._figures import (
    PLOT_CONFIG,
    SCORE_PREFIX,
    Panel,
    build_panels,
    duration_s,
    is_finite_complete,
    objective_names,
    outcome_color,
    outcome_order,
    param_names,
    plottable_copy,
)
from hpo.reporting._report import fidelity_mark, fmt_value, outcome
from hpo.reporting._summary import fidelity_summary
from hpo.storages import mask_url
from hpo.study import confirmed

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
    order = outcome_order(trials)
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
    done = [t for t in trials if is_finite_complete(t) and not is_confirm(t) and not is_failed(t)]
    done = [t for t in done if not is_proxy(t)] or done  # a proxy search: its best target run once there is one
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
        ("spent", _e(study_cost(trials).text())),
        *([("proxy", _e(proxy))] if (proxy := fidelity_summary(study).strip().removeprefix("proxy: ")) else []),
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
    show_rungs = any(rungs(t) for t in trials)  # successive halving: the rungs each trial completed
    head = ["#", "state", "outcome", "diagnosis", *names, *scores, *params, *(["rungs"] if show_rungs else []),
            "steps", "duration", "peak memory", "saved", "logs", "error"]
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
            f'<span class="outcome" style="color: {outcome_color(outcome(t))}">{_e(outcome(t))}</span>'
            + (f' <span class="confirm">confirms #{_e(ua.get("confirm_of"))}, seed {_e(ua.get("confirm_seed"))}'
               "</span>" if is_confirm(t) else "")
            + (f' <span class="fidelity">{_e(fidelity_mark(t).strip(" ()"))}</span>' if fidelity_mark(t) else ""),
            f'<span class="diagnosis" title="{_e(json.dumps(ua.get("diagnosis_evidence", {}), default=str))}">'
            f'{_e(ua.get("diagnosis", "-"))}</span>',
            *(_num(v) for v in values), *(_num(ua.get(k)) for k in scores),
            *(_param_text(t.params[p]) if p in t.params else "-" for p in params),
            *([str(rungs(t))] if show_rungs else []), str(steps_run(t)),
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
    from hpo.reporting._pbt import pbt_panels, pbt_table_html

    panels = build_panels(study) + pbt_panels(study)  # pbt: the lineage tree, members' curves, the schedule
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
{pbt_table_html(study)}
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
    make_output_dir(out.parent, "dashboard")
    text = build_html(study, storage_url=storage_url, out_dir=out.parent, studies_dir=studies_dir)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        check_output_path(out, "dashboard")  # right before the rename: a FIFO or device put there meanwhile stays
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return out
