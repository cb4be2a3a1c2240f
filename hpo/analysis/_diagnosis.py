"""Diagnosis of a trial from the metrics it already logs: one label per trial, and early stops for collapses.

A :class:`Diagnoser` reads the trial's metrics one JSONL line at a time (verl's ``file`` logger format,
``{"step": N, "data": {...}}``) and labels the run. Which metric is which is the trainer's own vocabulary
(:class:`~hpo.analysis._vocabulary.MetricNames`, ``Backend.metrics``): the names below are those of verl and
verl_core, which share them; a trainer that does not log a metric never gets the label that needs it.

====================  ==========================================================================  =====
label (by priority)   rule: metric, condition [default]                                           stops
====================  ==========================================================================  =====
``nan``               a non-finite value of any key ending in ``loss`` (``actor/pg_loss``,        yes
                      ``critic/vf_loss``, ``actor/kl_loss``, ``actor/entropy_loss``), of
                      ``actor/entropy``, ``actor/ppo_kl``, ``actor/reward_kl_penalty``,
                      ``critic/score/mean`` or of the objective metric; at once, no patience.
                      Not ``actor/grad_norm``: both trainers skip a non-finite gradient step.
``kl_blowup``         ``|actor/ppo_kl|``, ``|actor/reward_kl_penalty|`` or ``|actor/kl_loss|``    yes
                      (each on its own) above ``kl_factor`` [10] x baseline for
                      ``kl_patience`` [2] steps in a row. Baseline: the median of its last
                      ``kl_window`` [10] values that were not jumps, at least ``kl_floor``
                      [0.05]: nothing under 10 x 0.05 = 0.5 nats is a blowup, and the first
                      steps (no history yet) are judged against the floor.
``entropy_collapse``  ``actor/entropy`` below ``entropy_fraction`` [0.1] x its start value (the   yes
                      mean of its first ``entropy_start_steps`` [3] values) for
                      ``entropy_patience`` [3] steps in a row.
``reward_hacking``    at ``hacking_evals`` [3] evaluations in a row the objective got worse       no
                      than at the evaluation before while ``critic/score/mean`` (the mean over
                      the steps since that evaluation) rose, and the objective fell by at
                      least ``hacking_min_drop`` [0.02, objective units] over them in all.
``length_clipping``   ``response_length/clip_ratio`` at or above ``clip_ratio_threshold``        no
                      [0.5] for ``clip_patience`` [3] steps in a row.
``healthy``           none of the above.                                                          -
====================  ==========================================================================  =====

"Stops" is the default of the label's ``stop_on_<label>`` switch. The switches, thresholds and windows are the
experiment file's ``diagnosis:`` section, :class:`~hpo.analysis._diagnosis_spec.DiagnosisSpec`.

Speed health (``health``, never a stop, apart from the label above; verl's performance-tuning guide's table), each
with the knob to look at, judged on the mean over the steps after the first (the first step compiles and warms up).
The two GPU labels need a trial that ran on GPUs (``Diagnoser(..., gpu=False)``: none):

====================  ==========================================================================================
health label          rule [default]; the knob
====================  ==========================================================================================
``gpu_underused``     GPU utilisation (``perf/gpu_util`` %, else verl's ``perf/mfu/actor`` x 100) below
                      ``util_low`` [60]: larger micro-batches or ``use_dynamic_bsz`` token budgets, less offload
                      or gradient checkpointing where memory allows, ``use_remove_padding``
``gpu_saturated``     GPU utilisation above ``util_high`` [95]: compute-bound; batch knobs will not help, more GPUs
                      or the rollout's ``tensor_model_parallel_size`` will
``generation_bound``  ``timing_s/gen`` over ``timing_s/step`` at or above ``gen_fraction`` [0.7]: the rollout engine's
                      ``gpu_memory_utilization`` (KV cache), ``max_num_seqs``, ``max_num_batched_tokens``,
                      ``enable_chunked_prefill``, ``tensor_model_parallel_size``
``sync_bound``        ``timing_s/update_weights`` over ``timing_s/step`` at or above ``sync_fraction`` [0.3]:
                      ``rollout.checkpoint_engine.update_weights_bucket_megabytes``, ``free_cache_engine``, the
                      actor's ``fsdp_config`` offload (weights gathered from the CPU)
====================  ==========================================================================================

Why these defaults, for a user deciding whether to change them:

* ``kl_factor`` 10 / ``kl_floor`` 0.05: healthy LLM runs keep ``actor/ppo_kl`` around 1e-4..1e-2 and the KL
  penalty under ~0.1, drifting slowly; a tenfold step over the recent median, above 0.5 nats, is a policy that
  left its trust region (a too-large learning rate gives tens of nats in one step). Lower the factor (e.g. 5) to
  catch smaller jumps; raise the floor if your KL is legitimately large. ``kl_patience`` 2 ignores a one-batch
  spike; the jump values are kept out of the baseline, so a lasting jump stays a jump.
* ``entropy_fraction`` 0.1: entropy normally falls during RL (the policy sharpens), often by half or more on
  an easy task; below a tenth of its start the policy samples almost deterministically and exploration is gone.
  Raise it (e.g. 0.3) on tasks with long answers where a milder collapse already hurts.
* ``hacking_evals`` 3 with ``hacking_min_drop`` 0.02: three evaluations in a row that fall while the training
  score rises. Evaluation noise alone gives three falls in a row with probability 1/24 per window (while the
  training score keeps rising), so on a long, noisy run raise ``hacking_min_drop`` towards two standard errors
  of your evaluation (about 0.1 for 100 prompts of a 0/1 reward) or ``hacking_evals``. A label only by default.
* ``clip_ratio_threshold`` 0.5: half the responses hit ``max_response_length``, so the reward of most of the
  batch is decided by truncation. A label only by default: raise the length limit or penalise length.

A label, once it applies, stays (``labels`` lists them all, ``label`` is the one with the highest priority:
nan > kl_blowup > entropy_collapse > reward_hacking > length_clipping > healthy). ``update`` returns the label
that should stop the trial now (the first one whose ``stop_on_<label>`` switch is on; collapses by default,
at most once per trial). ``evidence()`` gives the facts behind each label, small and JSON-able, for the trial's
user attributes.

Input is taken as it comes: missing metrics, non-numeric values (ignored; numeric strings such as ``"nan"``
count as numbers), lines with only evaluation metrics, and repeated steps. A step lower than one already seen
(a resumed trainer re-logging) is ignored; a step equal to the last one adds only the keys not seen for it
(train and validation metrics logged as separate lines of one step).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from hpo.analysis._diagnosis_spec import DiagnosisSpec
from hpo.analysis._vocabulary import MetricNames

HEALTHY = "healthy"
HEALTH_LABELS = ("gpu_underused", "gpu_saturated", "generation_bound", "sync_bound")
HEALTH_KNOBS = {
    "gpu_underused": "larger micro-batches or use_dynamic_bsz token budgets (ppo_max_token_len_per_gpu, "
                     "log_prob_max_token_len_per_gpu), less param/optimizer offload or gradient checkpointing where "
                     "memory allows, use_remove_padding",
    "gpu_saturated": "compute-bound: more GPUs or the rollout's tensor_model_parallel_size; batch knobs will not help",
    "generation_bound": "the rollout engine: gpu_memory_utilization (KV cache), max_num_seqs, max_num_batched_tokens, "
                        "enable_chunked_prefill, tensor_model_parallel_size",
    "sync_bound": "the weight sync: rollout.checkpoint_engine.update_weights_bucket_megabytes, free_cache_engine, the "
                  "actor's fsdp_config param_offload",
}
LABELS = ("nan", "kl_blowup", "entropy_collapse", "reward_hacking", "length_clipping")  # priority order


def _number(v: Any) -> float | None:
    """A metric value as a float (NaN and inf included); None for what is not a number."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _get(values: Mapping[str, float], name: str | None) -> float | None:
    """``values[name]``; None when the trainer has no such metric or did not log it on this line."""
    return None if name is None else values.get(name)


def _fact(x: float) -> float | str:
    """A JSON-able, short number: 6 significant digits; non-finite as "nan" / "inf" / "-inf"."""
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)


class _Run:
    """Consecutive steps meeting a condition; ``hit`` when ``patience`` of them in a row."""

    def __init__(self, patience: int) -> None:
        self.patience, self.count, self.since = patience, 0, -1

    def push(self, cond: bool, step: int) -> bool:
        if not cond:
            self.count = 0
            return False
        if self.count == 0:
            self.since = step
        self.count += 1
        return self.count >= self.patience


class Diagnoser:
    """Labels one trial from its metric lines; see the module docstring for the rules.

    ``objective_metric`` is the metric the study optimises (read at evaluations), ``maximize`` its direction,
    ``names`` the trainer's metric vocabulary (its backend's ``metrics``). ``gpu``: the trial ran on GPUs; a trial
    that got none (verl on the CPU platform, which still logs an MFU against the CPU's FLOPS) gets no GPU label.
    """

    def __init__(self, spec: DiagnosisSpec, objective_metric: str, maximize: bool, names: MetricNames, *,
                 gpu: bool = True) -> None:
        problems = spec.validate()
        if problems:
            raise ValueError("bad diagnosis spec: " + "; ".join(f"{k} {m}" for k, m in problems))
        self.spec, self.objective_metric, self.maximize, self.names = spec, objective_metric, maximize, names
        self.gpu = gpu
        self._evidence: dict[str, dict[str, Any]] = {}
        self._stopped: str | None = None
        self._step: int | None = None
        self._step_keys: set[str] = set()
        # kl_blowup: per metric, the baseline history (non-jump values) and the run of jumps
        self._kl_hist = {m: deque[float](maxlen=spec.kl_window) for m in names.kl}
        self._kl_run = {m: _Run(spec.kl_patience) for m in names.kl}
        # entropy_collapse
        self._entropy_first: list[float] = []
        self._entropy_run = _Run(spec.entropy_patience)
        # reward_hacking: training scores since the last evaluation; evaluations (step, objective, train mean)
        self._scores: list[float] = []
        self._evals: list[tuple[int, float, float | None]] = []
        self._hack_count = 0
        # length_clipping
        self._clip_run = _Run(spec.clip_patience)
        # speed health: per quantity, the values of the steps after the first
        self._health: dict[str, list[float]] = {"util": [], "gen": [], "sync": []}
        self._first_train_step: int | None = None

    # ------------------------------------------------------------------ results
    @property
    def labels(self) -> tuple[str, ...]:
        """Every label that applied so far, in priority order (empty: healthy)."""
        return tuple(lb for lb in LABELS if lb in self._evidence)

    @property
    def label(self) -> str:
        """The final label: the highest-priority one that applied, else ``healthy``."""
        return self.labels[0] if self._evidence else HEALTHY

    @property
    def stopped(self) -> str | None:
        """The label ``update`` returned to stop the trial, if it did."""
        return self._stopped

    def health(self) -> dict[str, dict[str, Any]]:
        """``{health label: facts}`` (see the module docstring), each with its mean, steps and the knob to look at."""
        s, out = self.spec, {}
        means = {k: statistics.fmean(v) for k, v in self._health.items() if v}
        counts = {k: len(v) for k, v in self._health.items()}
        rules = (("gpu_underused", "util", means.get("util", math.inf) < s.util_low, s.util_low),
                 ("gpu_saturated", "util", means.get("util", -math.inf) > s.util_high, s.util_high),
                 ("generation_bound", "gen", means.get("gen", 0.0) >= s.gen_fraction, s.gen_fraction),
                 ("sync_bound", "sync", means.get("sync", 0.0) >= s.sync_fraction, s.sync_fraction))
        for label, key, hit, threshold in rules:
            if hit:
                n = self.names
                what = {"util": "mean GPU utilisation (%)", "gen": f"mean share of {n.step_time} in {n.gen_time}",
                        "sync": f"mean share of {n.step_time} in {n.sync_time}"}[key]
                out[label] = {"what": what, "value": _fact(means[key]), "threshold": _fact(threshold),
                              "steps": counts[key], "knob": HEALTH_KNOBS[label]}
        return out

    def evidence(self) -> dict[str, dict[str, Any]]:
        """``{label: facts}`` for every label that applied, in priority order: metric, step, value, baseline..."""
        return {lb: dict(self._evidence[lb]) for lb in self.labels}

    # ------------------------------------------------------------------ input
    def update(self, step: int, data: Mapping[str, Any]) -> str | None:
        """Read one metrics line; return a label when the trial should stop now (at most once), else None."""
        if not self.spec.enabled:
            return None
        if self._step is not None and step < self._step:
            return None  # a resumed trainer re-logging steps: the first record wins
        if step != self._step:
            self._step, self._step_keys = step, set()
        new = {k: v for k, v in data.items() if k not in self._step_keys}
        self._step_keys.update(new)
        before = set(self._evidence)
        values = {k: x for k, x in ((k, _number(v)) for k, v in new.items()) if x is not None}
        self._check_nan(step, values)
        finite = {k: x for k, x in values.items() if math.isfinite(x)}
        self._check_kl(step, finite)
        names = self.names
        self._check_entropy(step, _get(finite, names.entropy))
        self._check_hacking(step, _get(finite, names.score), finite.get(self.objective_metric))
        self._check_clip(step, _get(finite, names.clip_ratio))
        self._note_health(step, finite)
        fired = [lb for lb in LABELS if lb in self._evidence and lb not in before and self.spec.stops(lb)]
        if self._stopped is None and fired:
            self._stopped = fired[0]
            self._evidence[fired[0]]["stopped"] = True
            return fired[0]
        return None

    def _fire(self, label: str, **facts: Any) -> None:
        if label not in self._evidence:
            self._evidence[label] = facts

    # ------------------------------------------------------------------ rules
    def _check_nan(self, step: int, values: dict[str, float]) -> None:
        watched = (*self.names.finite, self.objective_metric)
        bad = [k for k, x in values.items() if not math.isfinite(x) and (k.endswith("loss") or k in watched)]
        if bad:
            self._fire("nan", metric=bad[0], step=step, value=_fact(values[bad[0]]), metrics=bad[:5])

    def _check_kl(self, step: int, values: dict[str, float]) -> None:
        s = self.spec
        for m in self.names.kl:
            if m not in values:
                continue
            x, hist = abs(values[m]), self._kl_hist[m]
            baseline = max(statistics.median(hist) if hist else 0.0, s.kl_floor)
            jump = x > s.kl_factor * baseline
            if self._kl_run[m].push(jump, step):
                self._fire("kl_blowup", metric=m, step=step, value=_fact(x), baseline=_fact(baseline),
                           threshold=_fact(s.kl_factor * baseline), since_step=self._kl_run[m].since)
            if not jump:
                hist.append(x)  # jumps stay out of the baseline, so a lasting jump stays a jump

    def _check_entropy(self, step: int, x: float | None) -> None:
        s = self.spec
        if x is None:
            return
        if len(self._entropy_first) < s.entropy_start_steps:
            self._entropy_first.append(x)
            return
        start = sum(self._entropy_first) / len(self._entropy_first)
        if self._entropy_run.push(x < s.entropy_fraction * start, step):
            self._fire("entropy_collapse", metric=self.names.entropy, step=step, value=_fact(x), baseline=_fact(start),
                       threshold=_fact(s.entropy_fraction * start), since_step=self._entropy_run.since)

    def _check_hacking(self, step: int, score: float | None, objective: float | None) -> None:
        if score is not None:
            self._scores.append(score)  # a train step precedes the validation logged on the same line
        if objective is None:
            return
        train = sum(self._scores) / len(self._scores) if self._scores else None
        self._scores = []
        if self._evals:
            _, prev_obj, prev_train = self._evals[-1]
            worse = objective < prev_obj if self.maximize else objective > prev_obj
            rose = train is not None and prev_train is not None and train > prev_train
            self._hack_count = self._hack_count + 1 if worse and rose else 0
        self._evals.append((step, objective, train))
        n = self.spec.hacking_evals
        if self._hack_count >= n:
            window = self._evals[-n - 1:]
            drop = abs(window[-1][1] - window[0][1])
            if drop >= self.spec.hacking_min_drop:
                self._fire("reward_hacking", metric=self.objective_metric, step=step, value=_fact(objective),
                           baseline=_fact(window[0][1]), train_metric=self.names.score,
                           objective_values=[_fact(v) for _, v, _ in window],
                           train_scores=[_fact(t) if t is not None else None for _, _, t in window],
                           eval_steps=[st for st, _, _ in window])

    def _note_health(self, step: int, values: dict[str, float]) -> None:
        names = self.names
        total = _get(values, names.step_time)
        if total is None or total <= 0:
            return
        if self._first_train_step is None:
            self._first_train_step = step  # the first step compiles and warms up: not judged
            return
        util = _get(values, names.gpu_util) if self.gpu else None  # no GPU: no GPU label
        mfu = _get(values, names.mfu) if self.gpu else None
        if util is None and mfu is not None:
            util = 100.0 * mfu
        if util is not None:
            self._health["util"].append(util)
        for key, metric in (("gen", names.gen_time), ("sync", names.sync_time)):
            if metric is not None and metric in values:
                self._health[key].append(values[metric] / total)

    def _check_clip(self, step: int, x: float | None) -> None:
        if x is not None and self._clip_run.push(x >= self.spec.clip_ratio_threshold, step):
            self._fire("length_clipping", metric=self.names.clip_ratio, step=step, value=_fact(x),
                       threshold=_fact(self.spec.clip_ratio_threshold), since_step=self._clip_run.since)
