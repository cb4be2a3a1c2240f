"""What a person reads: live progress lines and tables (``_report``), the summary when a search ends (``_summary``),
what ``verl-hpo best`` prints (``_best``) and the overrides, and the self-contained dashboard page (``_page``, written
in a process of its own by ``_dashboard``). Experiment tracking (MLflow, W&B) is the layer above: :mod:`hpo.tracking`.

May import: ``hpo.study`` and everything below it."""

from hpo.reporting._best import NoBest, print_best
from hpo.reporting._dashboard import DashboardCallback, dashboard_command, dashboard_path, write_final_page
from hpo.reporting._figures import plottable_copy
from hpo.reporting._report import Reporter, best_trial, confirmed_table, outcome, render_best, top_table
from hpo.reporting._speed import speed_lines, speed_report, unresolved
from hpo.reporting._speed_from import speed_from, speed_from_note, speed_recheck, withdrawn_note, without_speed
from hpo.reporting._summary import summary
from hpo.reporting._verdict import verdict_lines

__all__ = ["DashboardCallback", "NoBest", "Reporter", "best_trial", "confirmed_table", "dashboard_command",
           "dashboard_path", "outcome", "plottable_copy", "print_best", "render_best", "speed_from",
           "speed_from_note", "speed_lines", "speed_recheck", "speed_report", "summary", "top_table", "unresolved",
           "verdict_lines", "withdrawn_note", "without_speed", "write_final_page"]
