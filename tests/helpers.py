"""Shared test helpers: the embedded model with LoRA, and adapters moved off zero."""

import mlx.core as mx
from mlx.utils import tree_flatten

from artmlx.model.policy import LoraSpec, load_policy


def tiny_policy(rank: int = 8, perturb: float = 0.0, seed: int = 0):
    """The embedded model with fresh LoRA; `perturb` > 0 makes the adapters non-zero."""
    mx.random.seed(seed)
    model, tokenizer, _ = load_policy("tiny", LoraSpec(rank=rank, scale=20.0))
    if perturb:
        noisy = [(k, mx.random.normal(v.shape) * perturb) for k, v in tree_flatten(model.trainable_parameters())]
        model.load_weights(noisy, strict=False)
        mx.eval(model.parameters())
    return model, tokenizer



def learner_logprobs(model, groups, temperature: float, **settings):
    """The learner's recomputed logprobs and the sampler's at every policy token of `groups` (numpy)."""
    from artmlx.config import load_config
    from artmlx.learner.trainer import GRPOTrainer

    return GRPOTrainer(model, load_config(None, {"temperature": temperature, **settings})).recompute(groups)
