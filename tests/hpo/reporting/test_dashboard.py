"""The study dashboard: one self-contained HTML page, checked in headless Chromium with the network off.

Studies are built directly in SQLite (no trainer runs) with the user attrs the driver writes: finished,
converged, pruned, failed (worst value or FAIL), interrupted, running and queued trials. A failed trial's
error and stderr tail carry markup that must show as text, never run.

The browser tests need the ``playwright`` package and Debian's ``chromium`` (``/usr/bin/chromium``; set
``CHROMIUM`` to use another binary); Playwright's own browser download is not used. They skip when either is
missing, unless ``VERL_HPO_REQUIRE_BROWSER=1`` (CI), where they fail instead. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from hpo.reporting._dashboard import DashboardCallback, dashboard_command
from hpo.reporting._figures import reference_point, timeline_figure
from hpo.reporting._page import build_html, write_dashboard

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts"
XSS = "<script>window.__xss=1</script>"
XSS_IMG = '<img src=x onerror="window.__xss=2">'
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
               "--disable-default-apps", "--host-resolver-rules=MAP * ~NOTFOUND"]
MO_NAMES = ["eval/reward_mean", "eval/toxicity", "perf/latency_s"]
DIST: dict[str, Any] = {
    "kl_coef": FloatDistribution(1e-3, 0.2, log=True),
    "lr": FloatDistribution(1e-6, 1e-4, log=True),
    "rollout_n": IntDistribution(2, 8),
    "loss_agg_mode": CategoricalDistribution(["token-mean", "seq-mean-token-sum"]),
}
T0 = datetime.datetime.now().replace(microsecond=0) - datetime.timedelta(minutes=40)  # trial 13 still runs


# ----------------------------------------------------------------------------- studies
def _trial(n: int, state: TrialState, values: list[float] | None = None, attrs: dict[str, Any] | None = None,
           inter: dict[int, float] | None = None, minutes: float = 3.0, started: bool = True,
           done: bool = True) -> FrozenTrial:
    params = {"kl_coef": 0.002 * (n + 1) ** 1.7, "lr": 1e-6 * (1 + 7 * n % 90), "rollout_n": 2 + n % 7,
              "loss_agg_mode": ["token-mean", "seq-mean-token-sum"][n % 2]}
    start = T0 + datetime.timedelta(minutes=2.0 * n)
    user = {"trial_dir": f"TRIALS/{n}", "worker": {"host": "h", "pid": 1, "started": 0.0}, **(attrs or {})}
    return FrozenTrial(number=n, state=state, value=None, values=values,
                       datetime_start=start if started else None,
                       datetime_complete=start + datetime.timedelta(minutes=minutes) if done and started else None,
                       params=params, distributions=DIST, user_attrs=user, system_attrs={},
                       intermediate_values=inter or {}, trial_id=n)


def _ran(wall: float, peak: float = 1.5, code: int | None = 0, **extra: Any) -> dict[str, Any]:
    return {"wall_time_s": wall, "peak_memory_gb": peak, "exit_code": code, **extra}


def _add(study: optuna.Study, trials: list[FrozenTrial], trials_dir: Path) -> None:
    for t in trials:
        t.user_attrs["trial_dir"] = str(trials_dir / str(t.number))
        study.add_trial(t)


def _space_attrs(study: optuna.Study, metric: str) -> None:
    study.set_user_attr("hpo:source", "search_spaces/kl_lr.yaml")
    study.set_user_attr("hpo:space", {"config": "tiny_arith", "objective": {"metric": metric},
                                      "params": {k: {} for k in DIST}})


def single_study(studies: Path, name: str = "demo") -> optuna.Study:
    """14 trials: ok, converged, pruned, oom/crash (-inf), timeout (FAIL), interrupted, running, queued."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{studies / (name + '.db')}",
                                direction="maximize")
    _space_attrs(study, "eval/reward_mean")

    def curve(n: int, last: int = 10) -> dict[int, float]:
        return {s: 0.1 + 0.05 * s * (1 + (n % 4) / 4) for s in range(2, last + 1, 2)}

    trials = []
    for n in range(7):
        c = curve(n)
        attrs = {**_ran(180.0 + n), "score/reward": c[10], "score/kl_penalty": -0.01 * n}
        trials.append(_trial(n, TrialState.COMPLETE, [c[10]], attrs, c))
    trials += [
        _trial(7, TrialState.COMPLETE, [curve(7, 6)[6]],
               _ran(90.0, stop_reason="converged", compute_saved_s=60.0), curve(7, 6), minutes=1.5),
        _trial(8, TrialState.PRUNED, [0.2], _ran(40.0, stop_reason="pruned", compute_saved_s=150.0),
               {2: 0.15, 4: 0.2}, minutes=0.7),
        _trial(9, TrialState.COMPLETE, [-math.inf],
               _ran(30.0, peak=7.9, code=-9, fail_reason="oom", stderr_tail="torch.OutOfMemoryError: CUDA out"
                    " of memory. Tried to allocate 2.00 GiB"), {2: 0.12}, minutes=0.5),
        _trial(10, TrialState.COMPLETE, [-math.inf],
               _ran(12.0, code=1, fail_reason="crash", error=f"exited 1 without a finite metric {XSS}",
                    stderr_tail=f"Traceback (most recent call last):\n  ValueError: bad {XSS} {XSS_IMG}"),
               minutes=0.2),
        _trial(11, TrialState.FAIL, None, _ran(600.0, code=-15, fail_reason="timeout",
                                               stderr_tail="still running at 600 s"), {2: 0.1, 4: 0.11}),
        _trial(12, TrialState.FAIL, None, _ran(20.0, code=-2, interrupted=True, stop_reason="interrupted"),
               minutes=0.3),
        _trial(13, TrialState.RUNNING, None, {}, {2: 0.3}, done=False),
        _trial(14, TrialState.WAITING, None, {}, started=False, done=False),
    ]
    _add(study, trials, studies / name / "trials")
    return study


def multi_study(studies: Path, name: str = "pareto") -> optuna.Study:
    """3 objectives (maximize reward, minimize toxicity, minimize latency), a failed and an interrupted trial."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{studies / (name + '.db')}",
                                directions=["maximize", "minimize", "minimize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(MO_NAMES)
    _space_attrs(study, MO_NAMES[0])
    trials = [_trial(n, TrialState.COMPLETE, [0.2 + 0.07 * n, 0.3 - 0.02 * (n % 5), 1.0 + 0.3 * ((n * 3) % 7)],
                     _ran(100.0 + 10 * n)) for n in range(9)]
    trials += [
        _trial(9, TrialState.COMPLETE, [-math.inf, math.inf, math.inf],
               _ran(15.0, code=-9, fail_reason="oom", stderr_tail=f"CUDA out of memory {XSS}")),
        _trial(10, TrialState.FAIL, None, _ran(5.0, code=-2, interrupted=True, stop_reason="interrupted")),
    ]
    _add(study, trials, studies / name / "trials")
    return study


def small_study(studies: Path, n_complete: int) -> optuna.Study:
    name = f"small{n_complete}"
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{studies / (name + '.db')}",
                                direction="maximize")
    _space_attrs(study, "eval/reward_mean")
    trials = [_trial(n, TrialState.COMPLETE, [0.5], _ran(60.0), {2: 0.3, 4: 0.5}) for n in range(n_complete)]
    _add(study, trials, studies / name / "trials")
    return study


# ----------------------------------------------------------------------------- page content (no browser)
def _outside_plotlyjs(page: str) -> str:
    """The page without the embedded plotly.js bundle (the first <script> in <head>)."""
    start = page.index("<script>")
    return page[:start] + page[page.index("</script>", start):]


def test_page_is_self_contained_and_escaped(tmp_path: Path) -> None:
    study = single_study(tmp_path)
    page = build_html(study, storage_url="sqlite:///x.db", out_dir=tmp_path / "demo")
    rest = _outside_plotlyjs(page)
    assert page.count("<script") == page.count("</script>") == 3, "plotly.js, the figures' JSON, the draw loop"
    assert "<script src" not in page and "<link" not in rest and "<iframe" not in rest
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", rest), "no network URL in the page"
    assert "NaN" not in rest and "Infinity" not in rest, "non-finite values must not reach the figure JSON"
    assert XSS not in page and XSS_IMG not in page
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page
    assert 'onerror="window' not in page
    assert 'href="trials/10/"' in page, "relative link to the trial's log directory"
    assert "score/kl_penalty" in page and "search_spaces/kl_lr.yaml" in page


def test_timeline_draws_every_trial_as_one_row(tmp_path: Path) -> None:
    """Issue 20 item 12: two collapsed trials 8 numbers apart (one trace) were drawn 8 rows tall each, since plotly
    sizes a trace's bars by the smallest gap between its positions. Every bar is one trial, at most one row tall."""
    study = optuna.create_study(study_name="rows", storage=f"sqlite:///{tmp_path / 'rows.db'}", direction="maximize")
    trials = [_trial(n, TrialState.COMPLETE, [0.1], _ran(6.0, stop_reason="collapsed"), minutes=0.1)
              if n in (0, 8) else _trial(n, TrialState.COMPLETE, [0.5], _ran(180.0)) for n in range(9)]
    _add(study, trials, tmp_path / "trials")
    fig = timeline_figure(study, ["eval/reward_mean"]).figure
    assert fig is not None
    rows: list[int] = []
    for trace in fig.data:
        assert trace.type == "bar" and trace.orientation == "h"
        assert trace.width is not None and len(trace.width) == len(trace.y), f"{trace.name}: bar width left to plotly"
        assert all(0 < w <= 1 for w in trace.width), f"{trace.name}: bars {trace.width} rows tall"
        rows += list(trace.y)
    assert sorted(rows) == list(range(9)), "one bar per trial, on its own row"
    assert {t.name: list(t.y) for t in fig.data}["collapsed"] == [0, 8]


def test_reference_point_is_worse_than_every_trial() -> None:
    dirs = [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    trials = [optuna.trial.create_trial(values=v) for v in ([0.2, 1.0], [0.6, 3.0])]
    assert reference_point(trials, dirs) == pytest.approx([0.16, 3.2])


def test_callback_rewrites_every_n_trials_and_never_raises(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    study = small_study(tmp_path, 2)
    out = tmp_path / "small2" / "dashboard.html"
    url = f"sqlite:///{tmp_path / 'small2.db'}"  # the page is written by a process of its own, from the storage
    cb = DashboardCallback(out, url, every=2)
    cb(study, study.trials[0])
    assert not out.exists()
    cb(study, study.trials[1])  # written in the background: the trial loop goes on meanwhile
    cb.wait(120)
    assert out.exists() and not list(out.parent.glob(".*.tmp"))
    bad = DashboardCallback(tmp_path / "a-file" / "dashboard.html", url, every=1)
    (tmp_path / "a-file").write_text("")
    bad(study, study.trials[0])
    bad.wait(120)
    bad(study, study.trials[1])
    bad.wait(120)
    assert capsys.readouterr().err.count("dashboard not written") == 1


def test_dashboard_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    single_study(tmp_path)
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    assert dashboard_command("demo", url, tmp_path) == 0
    assert Path(capsys.readouterr().out.strip()) == tmp_path / "demo" / "dashboard.html"
    assert dashboard_command("nope", url, tmp_path) == 2


# ----------------------------------------------------------------------------- in the browser
def _chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _need_browser() -> tuple[Any, str]:
    required = os.environ.get("VERL_HPO_REQUIRE_BROWSER") == "1"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            pytest.fail("VERL_HPO_REQUIRE_BROWSER=1 but playwright is not installed (pip install playwright)")
        pytest.skip("browser test: the playwright package is not installed (pip install playwright)")
    exe = _chromium()
    if exe is None:
        if required:
            pytest.fail("VERL_HPO_REQUIRE_BROWSER=1 but chromium is not installed (apt-get install -y chromium)")
        pytest.skip("browser test: no chromium binary (apt-get install -y chromium, or set CHROMIUM)")
    return sync_playwright, exe


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright, exe = _need_browser()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROME_ARGS)
        yield b
        b.close()


def _open(browser: Any, page_path: Path, shot: str) -> dict[str, Any]:
    """Load the page offline; every request other than the page itself is aborted and recorded."""
    url = page_path.resolve().as_uri()
    ctx = browser.new_context(offline=True, viewport={"width": 1400, "height": 900}, java_script_enabled=True)
    foreign: list[str] = []
    errors: list[str] = []

    def route(r: Any) -> None:
        if r.request.url == url:
            r.continue_()
        else:
            foreign.append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    page = ctx.new_page()
    def on_request(req: Any) -> None:
        if req.url != url:
            foreign.append(req.url)

    def on_console(msg: Any) -> None:
        if msg.type == "error":
            errors.append(f"console: {msg.text}")

    page.on("request", on_request)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", on_console)
    page.goto(url, wait_until="load")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('svg.main-svg'))",
        timeout=30_000)
    page.wait_for_timeout(300)  # let async plot work (and any late error) finish
    info: dict[str, Any] = page.evaluate("""() => ({
        plots: [...document.querySelectorAll('.plotly-graph-div')].map(d => ({
            id: d.id, svg: d.querySelectorAll('svg.main-svg').length,
            drawn: d.querySelectorAll('.plot .trace, .barlayer .trace, .contourlayer .trace, .scatterlayer .trace')
                .length})),
        sections: [...document.querySelectorAll('section.plot')].map(s => ({
            key: s.dataset.plot, plot: !!s.querySelector('.plotly-graph-div'),
            reason: (s.querySelector('p.not-yet') || {}).textContent || null})),
        rows: [...document.querySelectorAll('#trials tbody tr[data-trial]')].map(r => Number(r.dataset.trial)),
        xss: window.__xss === undefined ? null : window.__xss,
        scripts: document.querySelectorAll('script').length,
        injected: document.querySelectorAll('#trials script, #trials img, #header script').length,
        text: document.body.innerText,
    })""")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    ctx.close()
    info["errors"], info["foreign"] = errors, foreign
    return info


def _check_page(info: dict[str, Any], study: optuna.Study) -> None:
    assert info["errors"] == [], info["errors"]
    assert info["foreign"] == [], f"the page made network requests: {info['foreign']}"
    assert info["plots"], "no plot was drawn"
    for p in info["plots"]:
        assert p["svg"] >= 1, f"plot {p['id']} rendered no SVG"
    assert sorted(info["rows"]) == [t.number for t in study.trials], "the table lists every trial once"
    assert info["xss"] is None and info["injected"] == 0, "markup from a trial string was injected"


def test_single_objective_page_in_browser(tmp_path: Path, browser: Any) -> None:
    study = single_study(tmp_path)
    out = write_dashboard(study, tmp_path / "demo" / "dashboard.html", storage_url=f"sqlite:///{tmp_path}/demo.db",
                          studies_dir=tmp_path)
    info = _open(browser, out, "dashboard_single_objective.png")
    _check_page(info, study)
    drawn = {s["key"] for s in info["sections"] if s["plot"]}
    assert {"history", "intermediate", "importances", "parallel", "contour", "slice", "timeline"} <= drawn, info
    assert all(p["drawn"] > 0 for p in info["plots"]), info["plots"]
    text = info["text"]
    assert XSS in text, "the error message shows as text"
    for word in ("converged", "pruned", "oom", "crash", "timeout", "interrupted", "running", "queued"):
        assert word in text
    assert "Pareto" not in text


def test_multi_objective_page_in_browser(tmp_path: Path, browser: Any) -> None:
    study = multi_study(tmp_path)
    out = write_dashboard(study, tmp_path / "pareto" / "dashboard.html",
                          storage_url=f"sqlite:///{tmp_path}/pareto.db")
    info = _open(browser, out, "dashboard_multi_objective.png")
    _check_page(info, study)
    drawn = {s["key"] for s in info["sections"] if s["plot"]}
    assert {"pareto-0-1", "pareto-0-2", "pareto-1-2", "hypervolume", "history-0", "history-1", "history-2",
            "importances", "parallel", "contour", "slice", "timeline"} <= drawn, info["sections"]
    assert "Pareto-optimal trial(s)" in info["text"] and all(n in info["text"] for n in MO_NAMES)


@pytest.mark.parametrize("n_complete", [0, 1])
def test_plots_not_drawable_yet_are_explained(tmp_path: Path, browser: Any, n_complete: int) -> None:
    study = small_study(tmp_path, n_complete)
    out = write_dashboard(study, tmp_path / study.study_name / "dashboard.html", storage_url="sqlite:///x.db")
    info = _open(browser, out, f"dashboard_{n_complete}_complete.png")
    _check_page(info, study) if n_complete else None
    assert info["errors"] == [] and info["foreign"] == []
    assert sorted(info["rows"]) == list(range(n_complete))
    reasons = {s["key"]: s["reason"] for s in info["sections"] if not s["plot"]}
    assert "importances" in reasons and "at least 2 completed trials" in reasons["importances"]
    assert all(r and r.count("\n") == 0 and "Traceback" not in r for r in reasons.values()), reasons
    if n_complete == 0:
        assert "history" in reasons and "none yet" in info["text"]
    else:
        assert {"history", "intermediate", "timeline"} <= {s["key"] for s in info["sections"] if s["plot"]}


def test_browser_harness_sees_requests_and_errors(tmp_path: Path, browser: Any) -> None:
    """The checks above would catch a fetch or a script error (the guard itself works)."""
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="https://example.com/x.png"><img src="other.png">'
                   "<script>undefinedFunction()</script></body></html>")
    info = _open(browser, bad, "harness_canary.png")
    assert any("example.com" in u for u in info["foreign"]) and any("other.png" in u for u in info["foreign"])
    assert any("undefinedFunction" in e for e in info["errors"]), info["errors"]


def test_the_driver_never_loads_the_page_s_libraries(tmp_path: Path) -> None:
    """The page is written by a process of its own (every 5 trials and at the end): the driver's memory holds no
    plotly or scikit-learn, and the page is there when the search returns (issue 23, a lighter driver)."""
    import subprocess

    from tests.hpo.conftest import PY, cli_env, fake_space

    space = fake_space(tmp_path, study={"n_trials": 5, "pruner": {"type": "none"}})
    probe = ("import runpy, sys\nout = sys.argv.pop()\n"
             "try:\n    runpy.run_module('hpo', run_name='__main__')\n"
             "finally:\n    open(out, 'w').write(' '.join(m for m in ('plotly', 'sklearn', 'scipy', 'torch')"
             " if m in sys.modules))\n")
    loaded = tmp_path / "loaded.txt"
    studies = tmp_path / "studies"
    res = subprocess.run([PY, "-c", probe, "search", "--space", str(space), "--studies-dir", str(studies),
                          str(loaded)], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert loaded.read_text() == ""
    page = studies / "fake" / "dashboard.html"
    assert page.is_file() and "Plotly.newPlot" in page.read_text()
    assert "dashboard not written" not in res.stderr


def test_the_page_process_draws_with_plotly_and_loads_no_matplotlib_or_scikit_learn(tmp_path: Path) -> None:
    """``optuna.visualization`` and ``optuna.importance`` import Optuna's matplotlib plots and its fANOVA evaluator,
    which would load matplotlib.pyplot and scikit-learn in every page process (once per search and every 5 trials);
    the page draws with plotly, and its importances are PED-ANOVA's."""
    import subprocess

    from tests.hpo.conftest import PY, cli_env

    small_study(tmp_path, 3)
    out, loaded = tmp_path / "page.html", tmp_path / "loaded.txt"
    probe = ("import runpy, sys\nloaded = sys.argv.pop()\n"
             "try:\n    runpy.run_module('hpo.reporting._dashboard', run_name='__main__')\n"
             "finally:\n    open(loaded, 'w').write(' '.join(m for m in ('plotly', 'matplotlib', 'sklearn')"
             " if sys.modules.get(m) is not None))\n")
    res = subprocess.run([PY, "-c", probe, "small3", str(out), str(tmp_path), str(loaded)], cwd=ROOT,
                         env=cli_env(VERL_HPO_PAGE_STORAGE=f"sqlite:///{tmp_path / 'small3.db'}"), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert loaded.read_text() == "plotly"
    page = out.read_text()
    assert "Plotly.newPlot" in page and "Parameter importances" in page and "Cannot be drawn yet" not in page


def test_successive_halving_rungs_steps_and_spending_are_shown(tmp_path: Path) -> None:
    """A study run by successive halving: each trial's rungs and steps in the table, what it spent in the header."""
    from hpo.samplers import ChainHalvingPruner

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="asha", direction="maximize",
                                pruner=ChainHalvingPruner(min_resource=2, reduction_factor=3))
    for curve in ({2: 0.5, 6: 0.6, 8: 0.7}, {2: 0.4, 4: 0.45}, {2: 0.8, 6: 0.9, 8: 0.95}):
        t = study.ask({"x": FloatDistribution(0.0, 1.0)})
        pruned = False
        for step, v in curve.items():
            t.report(v, step)
            t.set_user_attr("last_step", step)
            if t.should_prune():
                pruned = True
                break
        t.set_user_attr("total_steps", 8)
        study.tell(t, None if pruned else curve[8], state=TrialState.PRUNED if pruned else TrialState.COMPLETE)
    html = build_html(study, storage_url=f"sqlite:///{tmp_path / 's.db'}", out_dir=tmp_path)
    table = html[html.index('id="trials"'):]
    head = re.findall(r"<th>(.*?)</th>", table[:table.index("</thead>")])
    rows = re.findall(r'<tr data-trial="(\d+)">(.*?)</tr>', table)
    cells = {int(n): re.findall(r"<td[^>]*>(.*?)</td>", body) for n, body in rows}
    rung, steps = head.index("rungs"), head.index("steps")
    assert [cells[n][rung] for n in range(3)] == ["2", "1", "2"]  # trial 1 was pruned at rung 0 (step 2)
    assert [cells[n][steps] for n in range(3)] == ["8", "2", "8"]
    assert "18 steps" not in html and "2.2 full-run equivalents (2.2 search + 0.0 confirmation" in html
