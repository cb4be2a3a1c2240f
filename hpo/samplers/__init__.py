"""How the next trial's values are chosen, beyond Optuna's own samplers: the GP told about pruned trials (``_gp``,
imports torch through Optuna: loaded only for ``study.sampler.type: gp``), the Latin-hypercube start
(``_startup``), and population-based training's decisions as pure functions over a population's segments
(``_pbt``; :mod:`hpo.study._population` turns trials into segments and queues the next ones), asynchronous
successive halving over retry chains (``_halving``: the multi-fidelity pruner of ``study.pruner.type:
successive_halving``), and model-size fidelity (``study.fidelity.proxy``): a sampler and a pruner per fidelity
(``_fidelity``) and the promotion of the proxy's best settings to the target with the check of its ranking
(``_promotion``; before it, the proxy's own seeds for the best settings it cannot tell apart).

May import: ``hpo.experiment``, ``hpo.record``, ``hpo.analysis``."""

from hpo.samplers._check import check_line, record_check, unmeasured_setting, unmeasured_words
from hpo.samplers._fidelity import FidelityPruner, FidelitySampler, FidelityView, search_fidelity, with_fidelity
from hpo.samplers._gp import PrunedAwareGPSampler
from hpo.samplers._halving import ChainHalvingPruner
from hpo.samplers._pbt import Decision, Segment, decide, initial_population, latest, lineage, ranked, schedule
from hpo.samplers._promotion import (
    promote_steps,
    promotion,
    promotion_pending,
    promotion_twin,
    proxy_ties,
    proxy_value,
    start_promotion,
    start_ties,
    tie_twin,
    ties_line,
    ties_pending,
)
from hpo.samplers._startup import LatinStartSampler

__all__ = ["ChainHalvingPruner", "Decision", "FidelityPruner", "FidelitySampler", "FidelityView", "LatinStartSampler",
           "PrunedAwareGPSampler", "Segment", "check_line", "decide", "initial_population", "latest", "lineage",
           "promote_steps", "promotion", "promotion_pending", "promotion_twin", "proxy_ties", "proxy_value", "ranked",
           "record_check", "schedule", "search_fidelity", "start_promotion", "start_ties", "tie_twin", "ties_line",
           "ties_pending", "unmeasured_setting", "unmeasured_words", "with_fidelity"]
