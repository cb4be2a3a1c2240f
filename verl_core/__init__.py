"""verl_core: a compact PPO/GRPO trainer for Hugging Face causal LMs, with verl's config keys and metrics.

Importing the package imports nothing heavy: ``verl_core.config`` is torch-free so the
HPO driver can validate overrides with it; the trainer lives in ``verl_core.trainer``.
"""

__version__ = "0.1.0"
