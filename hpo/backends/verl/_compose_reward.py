"""The user's reward function called before launch, in verl's interpreter, as verl 0.9.1's reward managers call it:
what ``_compose.py`` (``validate``, the rehearsal's first step) and ``_shrink.py`` (the rehearsal's rows) run.

:func:`call_reward` loads the function with verl's own ``get_custom_reward_fn`` (``reward.custom_reward_function``;
else verl's ``default_compute_score``) and calls it on each target (a row's ``data_source``, ground truth and
``extra_info``) with a few synthetic responses (:func:`responses`: empty, the ground truth, GSM8K's and a boxed answer
format); each call must return a finite number or a dict with a finite ``"score"``. Two limits: each call gets
``call_s`` (a SIGALRM ends a call that loops or waits: a hung function is a problem named as the reward), and the calls
together get ``budget_s`` (when it is spent the rest is not called: a slow function is a note with its measured cost
per training step, never a problem). What the function prints is kept up to :data:`OUTPUT_CAP` bytes, the rest
counted. Before the calls start a marker line goes to stderr (:data:`STEP_MARKER`), so that a driver whose time
limit ends the whole script knows the reward was being called.

Imports nothing of the project (runs in verl's interpreter beside its neighbours ``_compose_checks`` and
``_compose_data``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import numbers
import signal
import sys
import time
from typing import Any

if __package__:
    from ._compose_checks import load_error
    from ._compose_data import _get, _one_line
else:  # run in verl's interpreter: the neighbours are on sys.path
    from _compose_checks import load_error  # type: ignore[no-redef]
    from _compose_data import _get, _one_line  # type: ignore[no-redef]

CALL_S = 30.0  # one call's limit (validate; rehearse: --reward-timeout caps it)
BUDGET_S = 20.0  # all calls together (validate); the rehearsal's: --reward-timeout
SLOW_CALL_S = 0.05  # a function slower than this a call gets a note with its cost per training step
OUTPUT_CAP = 64 * 1024  # bytes of what the user's function prints that are kept (the rest is counted, dropped)
STEP_MARKER = "verl-hpo: calling the reward function"  # on stderr before the calls; "... done" after
CALL_LIMIT_KNOBS = "VERL_HPO_REWARD_CALL_TIMEOUT_S, at most rehearse's --reward-timeout"  # what raises the limit


def responses(truth: Any) -> list[str]:
    text = str(truth)
    return ["", text, f"The answer is {text}.\n#### {text}", f"\\boxed{{{text}}}"]


def score_of(result: Any) -> tuple[float | None, str | None]:
    """(the score verl would use, None) or (None, what is wrong with ``result``)."""
    value = result
    if isinstance(result, dict):
        if "score" not in result:
            return None, f"a dict without 'score' (keys {', '.join(map(str, result))[:80]})"
        value = result["score"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"{type(value).__name__} {str(value)[:60]!r}"
    if not math.isfinite(float(value)):
        return None, f"{float(value)}"
    return float(value), None


class _CallTimeout(BaseException):
    """Raised by SIGALRM in a call of the user's function: it did not return in time."""


class _CappedSink:
    """A text stream that keeps the first :data:`OUTPUT_CAP` bytes written to it and counts the rest."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.size = 0
        self.dropped = 0

    def write(self, text: str) -> int:
        n = len(text.encode("utf-8", "replace"))
        if self.size < OUTPUT_CAP:
            self.kept.append(text[:OUTPUT_CAP - self.size])
        else:
            self.dropped += n
        self.size += n
        return len(text)

    def flush(self) -> None:
        pass


def reward_where(cfg: Any) -> str:
    path = _get(cfg, "reward.custom_reward_function.path")
    name = _get(cfg, "reward.custom_reward_function.name")
    return f"{path}:{name}" if path else "verl's default_compute_score"


def per_step(cfg: Any, seconds: float) -> str:
    """What ``seconds`` a call costs a training step: one call per sample (verl's reward managers), spread over
    ``reward.num_workers``."""
    bs = int(_get(cfg, "data.train_batch_size") or 1)
    n = int(_get(cfg, "actor_rollout_ref.rollout.n") or 1)
    workers = max(1, int(_get(cfg, "reward.num_workers") or 1))
    total = seconds * bs * n
    return (f"{bs * n} calls a training step (data.train_batch_size={bs} x actor_rollout_ref.rollout.n={n}): ~"
            f"{total:.0f} s of reward a step, ~{total / workers:.1f} s over reward.num_workers={workers}")


def call_reward(cfg: Any, targets: list[dict[str, Any]], call_s: float = CALL_S,
                budget_s: float = BUDGET_S) -> dict[str, Any]:
    """Call the reward function on each target (``{"label": "training rows 120-130 of train.parquet",
    "data_source", "truth", "extra_info"}``) with :func:`responses`, within ``call_s`` a call and ``budget_s`` in all
    (see the module docstring). ``{"where", "calls", "targets": called, "of": len(targets), "seconds": mean per call,
    "min", "max", "problem": ONE LINE (a raise, a bad value, a call over its limit), "note": ONE LINE (slow, or the
    budget spent), "printed_bytes", "printed_dropped_bytes"}`` (keys only when they apply)."""
    where = reward_where(cfg)
    sink = _CappedSink()
    try:  # verl's own modules load before the clock starts: only the user's code is timed
        from verl.trainer.ppo.reward import get_custom_reward_fn
        from verl.utils.reward_score import default_compute_score

        fn = get_custom_reward_fn(cfg) or default_compute_score
    except Exception as err:  # noqa: BLE001 - a file that does not load, a missing function
        return {"where": where, "calls": 0, "problem": f"reward.custom_reward_function: {where} does not load: "
                                                       f"{load_error(err)}"}

    def expired(signum: int, frame: Any) -> None:
        raise _CallTimeout

    out: dict[str, Any] = {"where": where, "calls": 0, "targets": 0, "of": len(targets)}
    scores: list[float] = []
    returned = [0.0]  # seconds of the calls that returned a score
    spent = 0.0
    print(STEP_MARKER, file=sys.stderr, flush=True)
    old = signal.signal(signal.SIGALRM, expired)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            for target in targets:
                if spent >= budget_s:
                    break
                problem, took = _call_target(fn, target, where, call_s, scores, returned)
                spent += took
                out["calls"] = len(scores) + (problem is not None)
                out["targets"] += 1
                if problem:
                    out["problem"] = problem
                    break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        print(STEP_MARKER + " done", file=sys.stderr, flush=True)
    if scores:  # the mean of the calls that returned (a hung call's limit is not a measure of the others)
        out.update(min=min(scores), max=max(scores), seconds=returned[0] / len(scores))
    mean = out.get("seconds") or 0.0
    notes = []
    if mean > SLOW_CALL_S:  # a problem or not: what it costs a study is said
        notes.append(f"{where} takes {mean:.2f} s a call (measured on {len(scores)} calls): {per_step(cfg, mean)}")
    if "problem" not in out:
        if out["targets"] < len(targets):
            notes.append(f"called on {out['targets']} of the {len(targets)} ground truths planned within the check's "
                         f"{budget_s:g} s; the rest were not called")
    if notes:
        out["note"] = "; ".join(notes)
    if sink.size:
        out["printed_bytes"] = sink.size
        out["printed_dropped_bytes"] = sink.dropped
    return out


def _call_target(fn: Any, target: dict[str, Any], where: str, call_s: float, scores: list[float],
                 returned: list[float]) -> tuple[str | None, float]:
    """Each response on one target: (a problem line or None, seconds spent)."""
    truth = target.get("truth")
    spent = 0.0
    for response in responses(truth):
        extra = {**(target.get("extra_info") or {}), "num_turns": 2, "rollout_reward_scores": {}}
        shown = (f"{target['label']} (data_source={target.get('data_source')!r}, ground truth {str(truth)[:60]!r}, "
                 f"response {response[:40]!r})")
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, call_s)
        try:
            result = fn(data_source=target.get("data_source"), solution_str=response, ground_truth=truth,
                        extra_info=extra)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
        except _CallTimeout:
            return (f"reward function {where} did not return within {call_s:g} s (the limit of one call: "
                    f"{CALL_LIMIT_KNOBS}) on {shown}: does it loop or wait on something?"), spent + call_s
        except Exception as err:  # noqa: BLE001 - the user's function failing is what this looks for
            return (f"reward function {where} raised on {shown}: {type(err).__name__}: {_one_line(str(err))[:300]}",
                    spent + time.monotonic() - started)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        took = time.monotonic() - started
        spent += took
        score, wrong = score_of(result)
        if score is None or wrong is not None:
            return (f"reward function {where} returned {wrong} on {shown}: verl needs a finite number (or a dict with "
                    "a finite 'score')"), spent
        scores.append(score)
        returned[0] += took
    return None, spent
