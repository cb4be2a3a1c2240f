"""How the next trial's values are chosen, beyond Optuna's own samplers: the GP told about pruned trials (``_gp``,
imports torch through Optuna: loaded only for ``study.sampler.type: gp``), the Latin-hypercube start
(``_startup``), and population-based training's decisions as pure functions over a population's segments
(``_pbt``; :mod:`hpo.study._population` turns trials into segments and queues the next ones), and asynchronous
successive halving over retry chains (``_halving``: the multi-fidelity pruner of ``study.pruner.type:
successive_halving``).

May import: ``hpo.experiment``, ``hpo.analysis``."""

from hpo.samplers._halving import ChainHalvingPruner
from hpo.samplers._pbt import Decision, Segment, decide, initial_population
from hpo.samplers._startup import LatinStartSampler

__all__ = ["ChainHalvingPruner", "Decision", "LatinStartSampler", "Segment", "decide", "initial_population"]
