"""What a person reads: live progress lines and tables (``_report``), the summary when a search ends (``_summary``),
what ``verl-hpo best`` prints (``_best``) and the overrides, and the self-contained dashboard page (``_page``, written
in a process of its own by ``_dashboard``). Experiment tracking (MLflow, W&B) is the layer above: :mod:`hpo.tracking`.

May import: ``hpo.study`` and everything below it."""

from hpo.reporting._best import NoBest, print_best
from hpo.reporting._report import Reporter, best_trial, render_best, top_table
from hpo.reporting._summary import summary

__all__ = ["NoBest", "Reporter", "best_trial", "print_best", "render_best", "summary", "top_table"]
