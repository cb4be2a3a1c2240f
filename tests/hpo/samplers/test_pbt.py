"""Population-based training decisions on synthetic populations (pure: no study, no trainer), and the
``study.pbt`` section's validation."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from hpo.backends import load_space
from hpo.experiment._space import Param, PbtSpec, SpaceError
from hpo.samplers._pbt import (
    Segment,
    apply_rule,
    decide,
    explore,
    initial_population,
    lineage,
    perturb,
    ranked,
    rollback_rules,
    sample,
    schedule,
)
from tests.hpo.conftest import write

LR = Param("lr", "actor_rollout_ref.actor.optim.lr", "float", low=1e-6, high=1e-2, log=True)
KL = Param("kl", "algorithm.kl_ctrl.kl_coef", "float", low=0.01, high=1.0, log=True)
EPOCHS = Param("epochs", "actor_rollout_ref.actor.ppo_epochs", "int", low=1, high=8)
ADV = Param("adv", "algorithm.adv_estimator", "categorical", choices=("gae", "grpo", "rloo"))
PARAMS = (LR, KL)
SPEC = PbtSpec(population=4, interval_steps=10, quantile=0.25, resample_probability=0.0)


def seg(number: int, member: int, end: int, value: float | None, lr: float = 1e-4, kl: float = 0.1,
        **kw: Any) -> Segment:
    start = kw.pop("start", end - 10)
    return Segment(number=number, member=member, seq=kw.pop("seq", end // 10 - 1), start=start, end=end,
                   params={"lr": lr, "kl": kl}, value=value, reached_end=kw.pop("reached_end", value is not None),
                   **kw)


def population() -> list[Segment]:
    """Four members after their first segment: member 0 worst, member 3 best."""
    return [seg(0, 0, 10, 0.1, lr=1e-6), seg(1, 1, 10, 0.5, lr=1e-5), seg(2, 2, 10, 0.6, lr=3e-5),
            seg(3, 3, 10, 0.9, lr=1e-4, kl=0.05)]


def test_bottom_member_exploits_a_top_member_and_explores() -> None:
    pop = population()
    d = decide(pop[0], pop, PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "exploit"
    assert d.source == d.donor == 3 and (d.start, d.end) == (10, 20)
    for name, p in (("lr", LR), ("kl", KL)):  # each explored value is the donor's times 0.8 or 1.25, in range
        ratio = d.params[name] / pop[3].params[name]
        assert ratio == pytest.approx(0.8) or ratio == pytest.approx(1.25), (name, ratio)
        assert p.low <= d.params[name] <= p.high  # type: ignore[operator]


@pytest.mark.parametrize("member", [1, 2, 3])
def test_other_members_continue_their_own_checkpoint(member: int) -> None:
    pop = population()
    d = decide(pop[member], pop, PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "continue"
    assert d.source == pop[member].number and d.params == pop[member].params and (d.start, d.end) == (10, 20)


def test_minimize_flips_the_ranking() -> None:
    pop = population()
    d = decide(pop[3], pop, PARAMS, SPEC, 40, False, random.Random(0))
    assert d is not None and d.action == "exploit" and d.donor == 0


def test_asynchronous_latest_results_only() -> None:
    """No barrier: members at different steps are compared by their newest finished segment; a running segment
    and superseded older ones do not count."""
    pop = [seg(0, 0, 10, 0.9), seg(4, 0, 20, 0.2, lr=2e-4),  # member 0 fell to 0.2 at step 20
           seg(1, 1, 10, 0.5), seg(2, 2, 10, 0.6), seg(3, 3, 10, 0.3),
           Segment(5, 3, 1, 10, 20, {"lr": 1e-4, "kl": 0.1}, finished=False)]  # member 3 running: its step-10 counts
    order = ranked(pop, True)
    assert [s.number for s in order] == [2, 1, 3, 4]
    d = decide(pop[1], pop, PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "exploit" and d.donor == 2
    assert (d.start, d.end) == (10, 20)  # the donor's step count: the member restarts from the donor's step 10


def test_burn_in_and_done() -> None:
    pop = population()
    spec = PbtSpec(population=4, interval_steps=10, burn_in_steps=20)
    d = decide(pop[0], pop, PARAMS, spec, 40, True, random.Random(0))
    assert d is not None and d.action == "continue"
    last = seg(9, 0, 40, 0.1)
    assert decide(last, [*pop, last], PARAMS, SPEC, 40, True, random.Random(0)) is None
    short = seg(10, 1, 35, 0.5, start=30)  # the last interval may be shorter than interval_steps
    d = decide(seg(8, 1, 30, 0.95), [], PARAMS, SPEC, 35, True, random.Random(0))
    assert d is not None and (d.start, d.end) == (30, 35)
    assert decide(short, [short], PARAMS, SPEC, 35, True, random.Random(0)) is None


def test_collapse_rolls_back_to_its_start_checkpoint_with_the_knobs_moved_the_safe_way() -> None:
    pop = population()
    blown = seg(7, 2, 20, None, lr=8e-4, kl=0.1, collapse="kl_blowup", source=2, checkpoint="/c/m2-s1/global_step_10")
    d = decide(blown, [*pop, blown], PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "rollback"
    assert (d.start, d.end, d.source, d.checkpoint) == (10, 20, 2, "/c/m2-s1/global_step_10")
    assert d.params == {"lr": pytest.approx(4e-4), "kl": pytest.approx(0.2)} and d.rollbacks == 1
    ent = seg(8, 2, 20, None, lr=8e-4, collapse="entropy_collapse", source=2, checkpoint="/c/x")
    d = decide(ent, [*pop, ent], PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.params == {"lr": pytest.approx(4e-4), "kl": 0.1}


def test_rollback_rules_from_config_and_clipping() -> None:
    spec = PbtSpec(rollback={"nan": "lr*0.001 kl*3"})
    rules = rollback_rules(PARAMS, spec)
    assert rules == {"nan": [("lr", 0.001), ("kl", 3.0)]}
    moved = apply_rule({"lr": 1e-4, "kl": 0.5}, rules["nan"], PARAMS)
    assert moved == {"lr": 1e-6, "kl": 1.0}  # clipped to the ranges
    assert rollback_rules((LR, KL, EPOCHS), PbtSpec())["kl_blowup"] == [("lr", 0.5), ("kl", 2.0)]


def test_rollbacks_run_out_then_exploit_then_stop() -> None:
    pop = population()
    spec = PbtSpec(population=4, interval_steps=10, max_rollbacks=1)
    again = seg(7, 2, 20, None, collapse="nan", rollbacks=1, source=2, checkpoint="/c/y")
    d = decide(again, [*pop, again], PARAMS, spec, 40, True, random.Random(0))
    assert d is not None and d.action == "exploit" and d.donor == 3
    alone = seg(7, 0, 10, None, collapse="nan", rollbacks=1)
    assert decide(alone, [alone], PARAMS, spec, 40, True, random.Random(0)) is None  # nothing healthy, no rollbacks


def test_first_segment_collapse_exploits_a_healthy_member_else_restarts_afresh() -> None:
    pop = population()
    first = seg(9, 0, 10, None, lr=1e-2, collapse="nan")
    d = decide(first, [first, *pop[1:]], PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "exploit"
    d = decide(first, [first], PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "rollback" and d.checkpoint is None and d.source is None
    assert d.params["lr"] == pytest.approx(5e-3) and (d.start, d.end) == (0, 10)


def test_a_crash_without_checkpoint_exploits_or_retries() -> None:
    pop = population()
    crashed = seg(7, 1, 20, None, source=1, checkpoint="/c/z")
    d = decide(crashed, [*pop, crashed], PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "exploit"
    d = decide(crashed, [crashed], PARAMS, SPEC, 40, True, random.Random(0))
    assert d is not None and d.action == "retry" and d.checkpoint == "/c/z" and d.params == crashed.params


def test_no_segment_continues_a_donor_that_has_no_steps_left() -> None:
    """Found by the benchmark's smoke run: the only healthy member had reached the last step, and a member whose
    segment collapsed past its rollbacks 'exploited' it with a zero-length segment (start = end = total) that
    crashed, over and over. A donor must have steps left, in both exploit branches."""
    total = 40
    done = seg(3, 3, total, 0.9, start=30, seq=3)
    collapsed = seg(7, 0, 40, None, collapse="nan", rollbacks=2, source=5, checkpoint="/c/x", start=30, seq=5)
    d = decide(collapsed, [done, collapsed], PARAMS, SPEC, total, True, random.Random(0))
    assert d is None or d.end > d.start
    behind = seg(8, 1, 30, 0.1, start=20, seq=2)
    d = decide(behind, [done, behind, seg(9, 2, 30, 0.5, start=20, seq=2)], PARAMS, SPEC, total, True,
               random.Random(0))
    assert d is not None and d.action == "continue" and (d.start, d.end) == (30, 40)


def test_failed_segments_in_a_row_are_bounded() -> None:
    """A member whose every segment fails (say its trainer crashes on resume) exploits at most max_rollbacks + 1
    times in a row, then stops: the population cannot loop for ever."""
    pop = population()
    spec = PbtSpec(population=4, interval_steps=10, max_rollbacks=2)
    failed = seg(10, 0, 10, None)  # crashed: no value, no collapse label
    segments = [*pop[1:], failed]
    decisions = []
    for n in range(11, 30):
        d = decide(failed, segments, PARAMS, spec, 40, True, random.Random(n))
        if d is None:
            break
        decisions.append(d.action)
        failed = seg(n, 0, d.end, None, start=d.start, seq=failed.seq + 1, rollbacks=d.rollbacks, source=d.source)
        segments.append(failed)
    assert decisions == ["exploit"] * 3


def test_explore_moves() -> None:
    spec = PbtSpec(resample_probability=0.0)
    assert perturb(EPOCHS, 4, True, spec) == 5 and perturb(EPOCHS, 1, False, spec) == 1
    assert perturb(ADV, "grpo", True, spec) == "rloo" and perturb(ADV, "gae", False, spec) == "gae"
    assert perturb(LR, 1e-2, True, spec) == 1e-2  # clipped at the top
    linear = Param("clip", "actor_rollout_ref.actor.clip_ratio", "float", low=0.0, high=0.4, step=0.05)
    assert perturb(linear, 0.2, True, spec) == pytest.approx(0.25)  # on the step grid
    only = explore({"lr": 1e-4, "kl": 0.1}, PARAMS, PbtSpec(explore=("kl",), resample_probability=0.0),
                   random.Random(1))
    assert only["lr"] == 1e-4 and only["kl"] != 0.1
    rng = random.Random(3)
    for _ in range(200):  # resampling always: every value drawn inside the range, log-uniformly spread
        v = explore({"lr": 1e-4, "kl": 0.1}, PARAMS, PbtSpec(resample_probability=1.0), rng)
        assert 1e-6 <= v["lr"] <= 1e-2 and 0.01 <= v["kl"] <= 1.0
    draws = [sample(PARAMS, rng)["lr"] for _ in range(400)]
    below = sum(math.log10(x) < -4 for x in draws) / len(draws)  # half of [1e-6, 1e-2] in log space
    assert 0.4 < below < 0.6


@pytest.mark.parametrize("n", [2, 4, 7])
def test_latin_hypercube_puts_one_member_in_each_stratum(n: int) -> None:
    """init lhs: each log range cut into n equal strata (in log space) holds exactly one member; ints cover their
    range evenly; a categorical's choices are dealt in turn; the same seed gives the same population."""
    params = (LR, KL, EPOCHS, ADV)
    for seed in range(20):
        pop = initial_population(params, n, random.Random(seed))
        assert pop == initial_population(params, n, random.Random(seed))
        for p in (LR, KL):
            lo, hi = math.log(p.low), math.log(p.high)  # type: ignore[arg-type]
            strata = sorted(int((math.log(m[p.name]) - lo) / (hi - lo) * n) for m in pop)
            assert strata == list(range(n)), (p.name, seed, strata)
        epochs = [m["epochs"] for m in pop]
        assert all(1 <= e <= 8 and isinstance(e, int) for e in epochs)
        assert max(epochs) - min(epochs) >= (8 - 1) * (n - 2) / n  # spread over the range, not clumped
        counts = [sum(m["adv"] == c for m in pop) for c in ("gae", "grpo", "rloo")]
        assert max(counts) - min(counts) <= 1


def test_latin_hypercube_spreads_where_independent_draws_clump() -> None:
    """The failure the Latin hypercube removes: over 200 seeds, independent draws put all 4 members in one half of
    the learning-rate range (log space) one time in 8; the hypercube never does."""
    def clumped(init: str) -> int:
        bad = 0
        for seed in range(200):
            lrs = [m["lr"] for m in initial_population(PARAMS, 4, random.Random(seed), init)]
            below = sum(math.log10(x) < -4 for x in lrs)
            bad += below in (0, 4)
        return bad
    assert clumped("lhs") == 0
    assert clumped("random") > 10


def test_lineage_and_schedule() -> None:
    """Member 0 exploited member 3 at step 10, then collapsed and rolled back: its lineage skips the collapsed
    segment and the schedule lists the values in force by step range."""
    pop = population()
    s4 = seg(4, 0, 20, 0.95, lr=2e-4, kl=0.05, source=3, action="exploit")
    s5 = seg(5, 0, 30, None, lr=2e-4, kl=0.05, source=4, collapse="nan")
    s6 = seg(6, 0, 30, 0.97, lr=1e-4, kl=0.05, source=4, action="rollback")
    s7 = seg(7, 0, 40, 0.98, lr=1e-4, kl=0.05, source=6, action="continue")
    chain = lineage([*pop, s4, s5, s6, s7], 7)
    assert [s.number for s in chain] == [3, 4, 6, 7]
    assert schedule(chain) == [
        {"start": 0, "end": 10, "params": {"lr": 1e-4, "kl": 0.05}},
        {"start": 10, "end": 20, "params": {"lr": 2e-4, "kl": 0.05}},
        {"start": 20, "end": 40, "params": {"lr": 1e-4, "kl": 0.05}}]


BASE = """\
config: tiny_arith
params:
  lr: {key: actor_rollout_ref.actor.optim.lr, type: float, low: 1.0e-6, high: 1.0e-3, log: true}
objective: {metric: eval/reward_mean, direction: maximize}
study:
  strategy: pbt
  pbt: {PBT}
"""


@pytest.mark.parametrize(("pbt", "needle"), [
    ("{population: 1}", "study.pbt.population: at least 2 members, got 1"),
    ("{quantile: 0.7}", "study.pbt.quantile: must be in (0, 0.5], got 0.7"),
    ("{resample_probability: 1.5}", "study.pbt.resample_probability: must be in [0, 1], got 1.5"),
    ("{perturb_up: 0.9}", "perturb_down=0.8 must be < 1 < perturb_up=0.9"),
    ("{explore: [kl]}", "study.pbt.explore: 'kl' is not a parameter (known: lr)"),
    ("{rollback: {nan: 'lr/2'}}", "study.pbt.rollback.nan: expected 'name*factor ...'"),
    ("{rollback: {oom: 'lr*0.5'}}", "study.pbt.rollback.oom: unknown collapse label"),
    ("{rollback: {nan: 'kl*0.5'}}", "study.pbt.rollback.nan: 'kl' is not a parameter"),
    ("{interval_steps: 0}", "study.pbt.interval_steps: must be positive, got 0"),
])
def test_bad_pbt_section_is_one_line_naming_the_key(tmp_path: Path, pbt: str, needle: str) -> None:
    path = write(tmp_path / "p.yaml", BASE.replace("{PBT}", pbt))
    with pytest.raises(SpaceError) as err:
        load_space(str(path))
    assert needle in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_shipped_pbt_space_loads() -> None:
    space = load_space("search_spaces/pbt_kl_lr.yaml")
    assert space.study.strategy == "pbt" and space.study.pbt.population == 4
    assert rollback_rules(space.params, space.study.pbt)["kl_blowup"] == [("actor_lr", 0.5), ("kl_coef", 2.0)]
