"""Trial diagnosis: each pathology's metric stream gets its label and its stop at the right step, a healthy noisy
stream gets neither, thresholds and switches change the outcome, and messy input is taken as it comes."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from hpo.analysis._diagnosis import HEALTHY, Diagnoser, DiagnosisSpec
from hpo.backends.verl_core._names import METRICS  # verl's names, which these streams log
from tests.conftest import read_metrics, run_trainer

OBJ = "eval/reward_mean"
Line = tuple[int, dict[str, Any]]


def healthy(step: int, rng: random.Random, eval_every: int = 10) -> dict[str, Any]:
    """One step of a PPO run that learns: noisy losses, slowly falling entropy, small drifting KL, rising score."""
    d: dict[str, Any] = {
        "actor/pg_loss": rng.gauss(-0.02, 0.01),
        "critic/vf_loss": abs(rng.gauss(0.1, 0.02)),
        "actor/entropy": 0.8 * math.exp(-step / 200) + rng.gauss(0, 0.02),
        "actor/ppo_kl": 0.01 * (3.0 if rng.random() < 0.05 else 1.0) * abs(rng.gauss(1, 0.3)),  # rare 3x spikes
        "actor/reward_kl_penalty": 0.02 + 0.0005 * step + abs(rng.gauss(0, 0.005)),
        "actor/grad_norm": abs(rng.gauss(2.0, 0.5)),
        "critic/score/mean": min(1.0, 0.2 + 0.004 * step + rng.gauss(0, 0.05)),
        "response_length/clip_ratio": max(0.0, rng.gauss(0.03, 0.03)),
        "timing_s/step": 0.5,
    }
    if step % eval_every == 0:
        d[OBJ] = min(1.0, 0.2 + 0.003 * step + rng.gauss(0, 0.03))
    return d


def stream(n: int, seed: int = 0, edit: Callable[[int, dict[str, Any]], None] | None = None,
           eval_every: int = 10) -> list[Line]:
    """Steps 0..n: step 0 is a validation-only line (val_before_train); ``edit(step, data)`` injects a pattern."""
    rng = random.Random(seed)
    lines: list[Line] = [(0, {OBJ: 0.2})]
    for step in range(1, n + 1):
        d = healthy(step, rng, eval_every)
        if edit is not None:
            edit(step, d)
        lines.append((step, d))
    return lines


def run(lines: Iterable[Line], spec: DiagnosisSpec | None = None, objective: str = OBJ,
        maximize: bool = True) -> tuple[Diagnoser, list[tuple[int, str]]]:
    diag = Diagnoser(spec or DiagnosisSpec(), objective, maximize, METRICS)
    stops = []
    for step, data in lines:
        label = diag.update(step, data)
        if label is not None:
            stops.append((step, label))
    return diag, stops


# ----------------------------------------------------------------------------- healthy
@pytest.mark.parametrize("seed", range(5))
def test_healthy_noisy_stream_is_healthy(seed: int) -> None:
    diag, stops = run(stream(200, seed))
    assert (diag.label, diag.labels, stops, diag.evidence()) == (HEALTHY, (), [], {})
    assert diag.stopped is None


# ----------------------------------------------------------------------------- each label
@pytest.mark.parametrize("key", ["actor/pg_loss", "critic/vf_loss", "actor/kl_loss", "actor/entropy_loss",
                                 "actor/entropy", "actor/ppo_kl", "critic/score/mean"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "NaN"])
def test_nan_stops_at_once(key: str, bad: Any) -> None:
    def edit(step: int, d: dict[str, Any]) -> None:
        if step == 7:
            d[key] = bad

    diag, stops = run(stream(20, edit=edit))
    assert stops == [(7, "nan")] and diag.label == "nan"
    ev = diag.evidence()["nan"]
    assert (ev["metric"], ev["step"], ev["stopped"]) == (key, 7, True)
    json.dumps(diag.evidence(), allow_nan=False)  # storable as a user attr: "nan"/"inf" as strings


def test_nan_objective_on_an_evaluation_only_line() -> None:
    diag, stops = run([(0, {OBJ: float("nan")})])
    assert stops == [(0, "nan")] and diag.evidence()["nan"]["metric"] == OBJ


def test_nonfinite_grad_norm_and_unwatched_metrics_are_not_nan() -> None:
    def edit(step: int, d: dict[str, Any]) -> None:
        if step == 5:
            d["actor/grad_norm"] = float("nan")  # the trainers skip such an optimizer step
            d["perf/throughput"] = float("inf")

    diag, stops = run(stream(20, edit=edit))
    assert (diag.label, stops) == (HEALTHY, [])


@pytest.mark.parametrize("key", ["actor/ppo_kl", "actor/reward_kl_penalty", "actor/kl_loss"])
def test_kl_blowup_stops_after_patience(key: str) -> None:
    def edit(step: int, d: dict[str, Any]) -> None:
        if key == "actor/kl_loss":
            d[key] = 0.01 if step < 30 else 2.0
        elif step >= 30:
            d[key] = -3.0 if key == "actor/ppo_kl" else 3.0  # |ppo_kl|: a negative estimate blows up too

    diag, stops = run(stream(60, edit=edit))
    assert stops == [(31, "kl_blowup")]  # kl_patience=2: steps 30 and 31
    ev = diag.evidence()["kl_blowup"]
    assert (ev["metric"], ev["step"], ev["since_step"], ev["value"]) == (key, 31, 30, 3.0 if key != "actor/kl_loss"
                                                                          else 2.0)
    assert ev["threshold"] == pytest.approx(10 * ev["baseline"]) and ev["baseline"] >= 0.05


def test_kl_blowup_on_the_first_steps_is_judged_against_the_floor() -> None:
    lines = [(s, {"actor/ppo_kl": 16.9 - s * 0.5}) for s in range(1, 5)]  # a huge LR: tens of nats at once
    _, stops = run(lines)
    assert stops == [(2, "kl_blowup")]


def test_one_kl_spike_is_not_a_blowup() -> None:
    def edit(step: int, d: dict[str, Any]) -> None:
        if step == 30:
            d["actor/ppo_kl"] = 3.0

    diag, stops = run(stream(60, edit=edit))
    assert (diag.label, stops) == (HEALTHY, [])
    _, stops = run(stream(60, edit=edit), DiagnosisSpec(kl_patience=1))
    assert stops == [(30, "kl_blowup")]


def test_kl_floor_keeps_a_near_zero_baseline_from_triggering() -> None:
    lines = [(s, {"actor/ppo_kl": 1e-4 if s < 20 else 5e-3}) for s in range(1, 40)]  # 50x, but tiny
    diag, stops = run(lines)
    assert (diag.label, stops) == (HEALTHY, [])
    _, stops = run(lines, DiagnosisSpec(kl_floor=1e-4))
    assert stops == [(21, "kl_blowup")]


def test_kl_factor_changes_the_outcome() -> None:
    lines = [(s, {"actor/reward_kl_penalty": 0.1 if s < 20 else 0.6}) for s in range(1, 40)]  # 6x
    assert run(lines)[0].label == HEALTHY
    assert run(lines, DiagnosisSpec(kl_factor=5))[1] == [(21, "kl_blowup")]


def entropy_falls_to(final: float, at: int = 40) -> Callable[[int, dict[str, Any]], None]:
    """Entropy 0.8 for the first steps, then linearly to ``final`` at step ``at``, held."""
    def edit(step: int, d: dict[str, Any]) -> None:
        d["actor/entropy"] = 0.8 if step <= 10 else max(final, 0.8 - (0.8 - final) * (step - 10) / (at - 10))
    return edit


def test_entropy_collapse_stops_after_patience() -> None:
    diag, stops = run(stream(80, edit=entropy_falls_to(0.01)))
    # start 0.8 -> threshold 0.08, first crossed at step 38 (0.8 - 0.79 * (s - 10) / 30: 0.089 at 37, 0.063 at 38)
    assert stops == [(40, "entropy_collapse")] and diag.label == "entropy_collapse"
    ev = diag.evidence()["entropy_collapse"]
    assert (ev["since_step"], ev["baseline"], ev["threshold"]) == (38, 0.8, 0.08)


def test_entropy_fraction_changes_the_outcome() -> None:
    lines = stream(80, edit=entropy_falls_to(0.2))  # a quarter of the start: sharper, not collapsed
    assert run(lines)[0].label == HEALTHY
    assert run(lines, DiagnosisSpec(entropy_fraction=0.3))[0].label == "entropy_collapse"


def hacking(step: int, d: dict[str, Any]) -> None:
    """From step 50 the training score keeps rising while the validation reward falls (eval every 10)."""
    if step > 40:
        d["critic/score/mean"] = 0.4 + 0.01 * (step - 40)
    if step >= 50 and OBJ in d:
        d[OBJ] = 0.35 - 0.05 * (step - 40) / 10


def test_reward_hacking_is_a_label_only_by_default() -> None:
    diag, stops = run(stream(100, edit=hacking))
    assert (diag.label, stops) == ("reward_hacking", [])
    ev = diag.evidence()["reward_hacking"]
    assert ev["step"] == 70 and ev["eval_steps"] == [40, 50, 60, 70]  # 3 falling evaluations after step 40's
    assert ev["objective_values"][1:] == [0.3, 0.25, 0.2]
    assert ev["train_scores"] == sorted(ev["train_scores"])
    _, stops = run(stream(100, edit=hacking), DiagnosisSpec(stop_on_reward_hacking=True))
    assert stops == [(70, "reward_hacking")]
    assert run(stream(100, edit=hacking), DiagnosisSpec(hacking_evals=4))[0].evidence()["reward_hacking"][
        "step"] == 80
    assert run(stream(100, edit=hacking), DiagnosisSpec(hacking_min_drop=0.5))[0].label == HEALTHY


def test_reward_hacking_follows_the_direction() -> None:
    """Minimize a perplexity: the objective rising is the objective getting worse."""
    def edit(step: int, d: dict[str, Any]) -> None:
        d.pop(OBJ, None)
        d["critic/score/mean"] = 0.2 + 0.01 * step
        if step % 10 == 0:
            d["eval/perplexity"] = 5.0 + step / 10  # worse at every evaluation

    lines = stream(60, edit=edit)[1:]
    assert run(lines, objective="eval/perplexity", maximize=False)[0].label == "reward_hacking"
    assert run(lines, objective="eval/perplexity", maximize=True)[0].label == HEALTHY


def test_training_score_falling_with_validation_is_not_hacking() -> None:
    def edit(step: int, d: dict[str, Any]) -> None:
        d["critic/score/mean"] = 0.8 - 0.005 * step  # the run just gets worse
        if OBJ in d:
            d[OBJ] = 0.8 - 0.005 * step

    assert run(stream(100, edit=edit))[0].label == HEALTHY


def clipping(step: int, d: dict[str, Any]) -> None:
    if 20 <= step < 30:
        d["response_length/clip_ratio"] = 0.7


def test_length_clipping_is_a_label_only_by_default() -> None:
    diag, stops = run(stream(40, edit=clipping))
    assert (diag.label, stops) == ("length_clipping", [])
    assert diag.evidence()["length_clipping"] == {"metric": "response_length/clip_ratio", "step": 22, "value": 0.7,
                                                  "threshold": 0.5, "since_step": 20}
    assert run(stream(40, edit=clipping), DiagnosisSpec(stop_on_length_clipping=True))[1] == [
        (22, "length_clipping")]
    assert run(stream(40, edit=clipping), DiagnosisSpec(clip_ratio_threshold=0.8))[0].label == HEALTHY
    assert run(stream(40, edit=clipping), DiagnosisSpec(clip_patience=11))[0].label == HEALTHY


# ----------------------------------------------------------------------------- priority and switches
def test_priority_and_a_single_stop() -> None:
    """Entropy collapses first (a stop), the KL blows up later: one stop, and the final label is kl_blowup."""
    def edit(step: int, d: dict[str, Any]) -> None:
        entropy_falls_to(0.01)(step, d)
        clipping(step, d)
        if step >= 50:
            d["actor/ppo_kl"] = 2.0

    diag, stops = run(stream(80, edit=edit))
    assert stops == [(40, "entropy_collapse")]
    assert diag.labels == ("kl_blowup", "entropy_collapse", "length_clipping") and diag.label == "kl_blowup"
    assert diag.evidence()["entropy_collapse"]["stopped"] is True and "stopped" not in diag.evidence()["kl_blowup"]
    assert list(diag.evidence()) == list(diag.labels)


def test_two_stops_on_one_step_return_the_higher_priority() -> None:
    lines: list[Line] = [(s, {"actor/ppo_kl": 0.01, "actor/entropy": 0.8}) for s in range(1, 10)]
    lines.append((10, {"actor/ppo_kl": 5.0, "critic/vf_loss": float("nan")}))
    lines.append((11, {"actor/ppo_kl": 5.0}))
    diag, stops = run(lines, DiagnosisSpec(kl_patience=1))
    assert stops == [(10, "nan")] and diag.labels == ("nan", "kl_blowup")


def test_stop_switches() -> None:
    def edit(step: int, d: dict[str, Any]) -> None:
        if step >= 20:
            d["actor/ppo_kl"] = 2.0
        entropy_falls_to(0.01)(step, d)

    assert run(stream(80, edit=edit))[1] == [(21, "kl_blowup")]
    diag, stops = run(stream(80, edit=edit), DiagnosisSpec(stop_on_kl_blowup=False))
    assert stops == [(40, "entropy_collapse")] and diag.label == "kl_blowup"
    diag, stops = run(stream(80, edit=edit), DiagnosisSpec(stop_on_kl_blowup=False, stop_on_entropy_collapse=False))
    assert stops == [] and diag.labels == ("kl_blowup", "entropy_collapse")


def test_disabled_does_nothing() -> None:
    diag, stops = run(stream(20, edit=lambda s, d: d.update({"actor/pg_loss": float("nan")})),
                      DiagnosisSpec(enabled=False))
    assert (diag.label, stops) == (HEALTHY, [])


# ----------------------------------------------------------------------------- messy input
def test_missing_and_non_numeric_metrics_are_ignored() -> None:
    junk: list[Line] = [(0, {OBJ: 0.2})]
    for s in range(1, 30):
        junk.append((s, {"critic/score/mean": 0.3, "actor/entropy": "n/a", "actor/ppo_kl": None,
                         "response_length/clip_ratio": True, "actor/pg_loss": [1.0], "note": {"x": 1}}))
    diag, stops = run(junk)
    assert (diag.label, stops) == (HEALTHY, [])
    assert run([(1, {}), (2, {"something/else": 1})])[0].label == HEALTHY
    _, stops = run([(1, {"actor/pg_loss": " nan "})])  # a numeric string is a number
    assert stops == [(1, "nan")]


def test_resumed_trainer_relogging_steps_is_ignored() -> None:
    lines = stream(30)
    relog = [(s, {**d, "actor/pg_loss": float("nan"), "actor/ppo_kl": 9.0}) for s, d in lines[20:26]]
    diag, stops = run(lines[:26] + relog + lines[26:])
    assert (diag.label, stops) == (HEALTHY, [])


def test_train_and_validation_lines_of_one_step_both_count() -> None:
    split: list[Line] = []
    for step, d in stream(100, edit=hacking):
        split.append((step, {k: v for k, v in d.items() if k != OBJ}))
        if OBJ in d:
            seen = {"actor/pg_loss": float("nan")} if step > 0 else {}  # a key already seen at this step: ignored
            split.append((step, {OBJ: d[OBJ], **seen}))
    diag, _ = run(split)
    assert diag.label == "reward_hacking" and diag.evidence()["reward_hacking"]["step"] == 70


# ----------------------------------------------------------------------------- the real trainer
@pytest.mark.parametrize(("overrides", "label", "labels"), [
    pytest.param([], HEALTHY, (), marks=pytest.mark.slow),  # ~19 s: make test-slow (CI runs it)
    # lr 0.5 (tiny_arith uses 1e-5): ppo_kl ~16 nats from step 1, then a deterministic policy (entropy 0). Whether
    # that policy also answers with max_response_length tokens within 12 steps (length_clipping) depends on the
    # locally built model's last bits (seen both ways on two machines), so that label is not required
    (["actor_rollout_ref.actor.optim.lr=0.5"], "kl_blowup", ("kl_blowup", "entropy_collapse")),
])
def test_real_trainer_stream(tmp_path: Path, overrides: list[str], label: str, labels: tuple[str, ...]) -> None:
    metrics = tmp_path / "metrics.jsonl"
    res = run_trainer(["train", "--config", "tiny_arith", "--metrics-file", str(metrics),
                       "trainer.total_training_steps=12", "trainer.test_freq=6", "trainer.cpu_threads=1", *overrides],
                      tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    diag, stops = run((r["step"], r["data"]) for r in read_metrics(metrics))
    assert diag.label == label, diag.evidence()
    assert diag.labels[:len(labels)] == labels and set(diag.labels) <= {*labels, "length_clipping"}, \
        diag.evidence()
    if label == HEALTHY:
        assert stops == []
    else:
        assert len(stops) == 1 and stops[0][1] == "kl_blowup" and stops[0][0] <= 3


# ----------------------------------------------------------------------------- speed health (verl's tuning table)
def _timed(steps: int, gen: float, sync: float, step_s: float = 2.0,
           **extra: float) -> list[tuple[int, dict[str, Any]]]:
    """Lines with verl's timing names: gen and update_weights as fractions of timing_s/step."""
    return [(s, {"timing_s/step": step_s, "timing_s/gen": gen * step_s, "timing_s/update_weights": sync * step_s,
                 **extra}) for s in range(1, steps + 1)]


def _health(lines: Iterable[tuple[int, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    d = Diagnoser(DiagnosisSpec(), "val-core/x/acc/mean@1", True, METRICS)
    for step, data in lines:
        assert d.update(step, data) is None  # health never stops a trial
    return d.health()


def test_a_run_whose_time_goes_to_generation_or_weight_sync_is_labelled_with_the_knob() -> None:
    gen = _health(_timed(5, gen=0.85, sync=0.05))
    assert list(gen) == ["generation_bound"]
    assert gen["generation_bound"]["value"] == pytest.approx(0.85) and gen["generation_bound"]["steps"] == 4
    assert "max_num_seqs" in gen["generation_bound"]["knob"]
    sync = _health(_timed(5, gen=0.4, sync=0.45))
    assert list(sync) == ["sync_bound"] and "update_weights_bucket_megabytes" in sync["sync_bound"]["knob"]
    assert _health(_timed(5, gen=0.5, sync=0.1)) == {}  # a balanced step: no label


def test_the_first_step_is_warm_up_and_not_judged() -> None:
    lines = _timed(1, gen=0.1, sync=0.9) + [(s, d) for s, d in _timed(4, gen=0.3, sync=0.1) if s > 1]
    assert _health(lines) == {}


def test_gpu_utilisation_outside_60_to_95_percent_is_labelled() -> None:
    low = _health(_timed(4, gen=0.3, sync=0.1, **{"perf/gpu_util": 35.0}))
    assert list(low) == ["gpu_underused"] and "micro-batches" in low["gpu_underused"]["knob"]
    mfu = _health(_timed(4, gen=0.3, sync=0.1, **{"perf/mfu/actor": 0.98}))  # verl's MFU as a fraction
    assert list(mfu) == ["gpu_saturated"]
    assert _health(_timed(4, gen=0.3, sync=0.1, **{"perf/gpu_util": 80.0})) == {}
