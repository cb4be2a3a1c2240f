"""The metric names verl 0.9.1 logs, for checking that an experiment's objective, constraints and early stopping
name one of them (:func:`hpo.backends.verl._check.check_verl_metrics`): the namespaces of its training metrics, the
form of its validation metrics (:func:`verl_metric_ok`, :func:`val_core_metric`), and examples to show when a name
is not one (:func:`verl_metric_examples`). Pure functions of names; nothing here imports the project.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Namespaces of the training metrics verl 0.9.1 logs (verl/trainer/ppo/metric_utils.py, v1/trainer_base.py,
# workers/*); within them the names vary with the config (timing stages, losses, optional features).
_TRAIN_PREFIXES = ("actor/", "critic/", "response_length/", "prompt_length/", "timing_s/", "timing_per_token_ms/",
                   "perf/", "training/", "global_seqlen/", "num_turns/", "tool_call_counts/", "rollout_corr/",
                   "rollout/", "response/")
# verl's validation metrics (process_validation_metrics + _val_metrics_update): per data source and variable,
# mean@N and (N > 1) std@N over the N = val_kwargs.n samples of a prompt, best/worst/maj@k for 2 <= k <= N
_VAL = re.compile(r"^val-(?P<section>core|aux)/(?P<source>.+)/(?P<var>[^/]+)/"
                  r"(?:(?P<stat>mean|std)@(?P<n>\d+)|(?P<kind>best|worst|maj)@(?P<k>\d+)/(?:mean|std))$")


def val_core_metric(data_source: str = "openai/gsm8k", n: int = 1, var: str = "acc") -> str:
    """verl's validation score of one data source: ``val-core/<data_source>/<var>/mean@<val_kwargs.n>``.

    ``var`` is the core variable: verl 0.9.1's reward managers record a float score as ``acc`` as well as
    ``reward`` (``experimental/reward_loop/reward_manager/naive.py``), and ``_val_metrics_update``
    (``trainer/ppo/v1/trainer_base.py``) makes ``acc`` the core variable whenever it is there; only a reward
    function returning a dict without ``acc`` leaves ``reward`` as the core one."""
    return f"val-core/{data_source}/{var}/mean@{n}"


def verl_metric_ok(metric: str, val_n: int | None = None, data_sources: Sequence[str] | None = None,
                   core_var: str | None = None) -> bool:
    """Whether verl logs ``metric``: a training metric of its namespaces, or a validation metric of the form
    verl builds. With ``val_n`` (``actor_rollout_ref.rollout.val_kwargs.n``) and ``data_sources`` (those of
    the validation data) known, they must match: ``mean@N``/``std@N`` only at N = val_n (``std`` only for
    N > 1), ``best|worst|maj@k`` only for 2 <= k <= val_n; ``val-core`` holds the ``@val_n`` means (and
    best/maj) of the core variable (``core_var``: ``acc`` or ``reward``; None: either), everything else is
    ``val-aux`` (the core variable never is, except its std and worst)."""
    if metric in ("val-aux/num_turns/min", "val-aux/num_turns/max", "val-aux/num_turns/mean"):
        return True
    m = _VAL.match(metric)
    if m is None:
        return not metric.startswith("val-") and any(
            metric.startswith(p) and len(metric) > len(p) for p in _TRAIN_PREFIXES)
    if data_sources is not None and m.group("source") not in data_sources:
        return False
    core = m.group("section") == "core"
    var = m.group("var")
    if core and var not in ((core_var,) if core_var else ("acc", "reward")):
        return False
    if (not core and core_var and var == core_var and (m.group("stat") == "mean"
                                                       or m.group("kind") in ("best", "maj"))):
        return False  # the core variable's means and best/maj are val-core
    if m.group("stat"):
        n = int(m.group("n"))
        if n < 1 or (m.group("stat") == "std" and (n < 2 or core)):
            return False
        return val_n is None or n == val_n
    k = int(m.group("k"))
    if k < 2 or (core and m.group("kind") == "worst"):
        return False
    return val_n is None or (k == val_n if core else k <= val_n)


def verl_metric_examples(val_n: int = 1, data_sources: Sequence[str] = ("openai/gsm8k",),
                         core_var: str | None = "acc") -> list[str]:
    """Metric names to show when a space names one verl does not log (the first: the default objective)."""
    var = core_var or "acc"
    out = [val_core_metric(s, val_n, var) for s in data_sources]
    if val_n > 1:
        out += [f"val-aux/{s}/{var}/std@{val_n}" for s in data_sources]
    return out + ["critic/score/mean", "response_length/mean", "actor/entropy"]
