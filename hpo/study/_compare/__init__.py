"""Telling confirmed settings apart: the paired interval of the per-seed differences where two settings ran the same
seeds (Welch's interval on the difference of means where they did not), the settings tied with the best, the
documented preference among tied settings, and the improvement over ``study.baseline``.

Pure Python (the driver stays light: no scipy); Student's t quantile comes from the regularized incomplete beta
function (a continued fraction), checked against tabulated values in the tests.

**Telling two settings apart** (:func:`difference`): on the seeds both ran (at least 2), the 95% paired-t interval of
the per-seed differences (a seed moves every setting alike: its data order and sampling); otherwise Welch's interval
of ``mean(A) - mean(B)`` over all their runs. Fewer than 2 runs on a side (or 2 finite pairs): nothing can be told
apart. B is *separated* from the best confirmed setting A when the interval excludes 0 (or when a racing
confirmation dropped B as behind).

**Tie rule: never recommend the worse of two.** B is *tied* with A when it is not separated from A **and** its
confirmed mean is within ``study.confirm.resolution`` of A's (default ``early_stopping.plateau_min_delta``, else 1% of
the best confirmed mean: differences smaller than that do not matter). A setting not separated but more than the
resolution below A (the seeds were too few to tell, e.g. a race that ended at the budget or the seed cap) is not
tied: the better mean wins, and ``best`` says so ("not separated after N seeds: the recommendation is the better
mean"). **Preference among tied settings** (:func:`prefer`), safer then cheaper:

1. fewer bad confirmation runs (failed, stopped by the run diagnosis as collapsed, or labelled by it with a collapse
   or ``reward_hacking``, :data:`BAD_LABELS`): a setting that breaks under some seed is riskier than one that never
   did;
2. then fewer steps to its plateau: the mean, over its confirmation runs, of the first evaluation step at which the
   objective came within ``tolerance`` (``early_stopping.plateau_min_delta``, else 1% of the value) of that run's
   best; a setting that gets there sooner can be trained shorter;
3. then the better confirmed mean.

Only validation values select (the tie, the preference); the held-out test values are reported beside them and
never choose, or the test split would become a second validation set.

**Racing confirmation** (``study.confirm.race``; F-race's idea with a paired t-test in place of Friedman's): the
candidates and the baseline run seed by seed; after each round a candidate behind the leader on the seeds they share
(:func:`paired` interval above 0) is dropped, and the race ends when the leader is alone, when the others are within
the resolution of it, at the seed cap or at the budget (:func:`race_step`). The baseline runs only until the
improvement over it is clear. The race is replayed from the finished runs by whoever asks (:func:`race_state`), so
several drivers and a killed one agree on it; only its settings are stored.

Modules: ``_intervals`` (Student's t, Welch's and the paired interval, the improvement over the baseline), ``_ties``
(bad runs, steps to plateau, the verdict and the preference), ``_race`` (racing confirmation and twin runs).
"""

from hpo.study._compare._intervals import LEVEL, Difference, improvement, paired, t_cdf, t_quantile, welch
from hpo.study._compare._race import (
    Race,
    RaceStep,
    advance_race,
    race_resolution,
    race_state,
    race_step,
    start_race,
    twin_of,
)
from hpo.study._compare._ties import (
    BAD_LABELS,
    RULE,
    Verdict,
    bad_runs,
    difference,
    mean_steps_to_plateau,
    prefer,
    steps_to_plateau,
    verdict,
)

__all__ = ["BAD_LABELS", "LEVEL", "RULE", "Difference", "Race", "RaceStep", "Verdict", "advance_race", "bad_runs",
           "difference", "improvement", "mean_steps_to_plateau", "paired", "prefer", "race_resolution", "race_state",
           "race_step", "start_race", "steps_to_plateau", "t_cdf", "t_quantile", "twin_of", "verdict", "welch"]
