"""Generation: ragged KV cache, batched prefill/decode with sampler logprobs, memory budgets.

Below everything that generates (rollouts, evaluation, serving); knows nothing of actors, HTTP or GRPO.
"""

from .cache import RaggedCache, make_ragged_cache
from .generate import Engine, sample_tokens
from .memory import MemoryPlan, ModelShape, apply_limits, plan_for, resolve_budget

__all__ = ["Engine", "MemoryPlan", "ModelShape", "RaggedCache", "apply_limits", "make_ragged_cache", "plan_for",
           "resolve_budget", "sample_tokens"]
