"""A causal LM as trunk and head, so logits are computed only where they are used.

mlx-lm's `Model.__call__` is `head(model.model(inputs, cache))` for the decoder-only families we
train (Qwen2/2.5/3, Llama, Mistral, Qwen3.5, LFM2, Gemma 3, GPT-OSS, OLMo 3): the trunk returns the
final-normed hidden states and the head is `lm_head` or, with tied embeddings, `embed_tokens.as_linear`.
A sampler needs logits at one position per row and the learner at the positions the policy sampled,
so projecting every position onto a 150,000-token vocabulary (B x N x V floats) is pure waste. For a model family not listed here
the trunk is the whole model and the head the identity: logits are then computed everywhere and
gathered after, which is slower but always correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from .families import text_model

# Model types whose Model.__call__ is exactly head(model.model(inputs, cache)), nothing after the head.
SPLIT_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral", "ministral3", "qwen3_next", "qwen3_5", "qwen3_5_text",
                     "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_moe", "lfm2", "gemma3_text", "gpt_oss", "olmo3")


@dataclass
class ModelParts:
    trunk: Callable  # (inputs (B, N), cache) -> (B, N, D) hidden states, or logits when `split` is False
    head: Callable  # (..., D) -> (..., V)
    split: bool
    hidden_size: int
    vocab_size: int
    recurrent: dict[int, int] = field(default_factory=dict)  # layer index -> arrays in its recurrent state
    cache_layers: int = 0  # layers that keep a cache (Gemma 4's KV-shared layers reuse an earlier layer's)


def _identity(x: mx.array) -> mx.array:
    return x


def cache_layers(model: nn.Module) -> int:
    """How many layers keep a cache of their own: mlx-lm's `make_cache()` list, which leaves out the
    KV-shared layers of Gemma 4 (they attend over an earlier layer's keys and values)."""
    return len(model.make_cache()) if hasattr(model, "make_cache") else len(model.layers)


def recurrent_layers(model: nn.Module) -> dict[int, int]:
    """Layer index -> number of state arrays, for the layers mlx-lm gives a recurrent state (`ArraysCache`:
    Gated DeltaNet's convolution and delta-rule states, a short convolution's window)."""
    if not hasattr(model, "make_cache"):
        return {}
    return {i: len(c.cache) for i, c in enumerate(model.make_cache()) if type(c).__name__ == "ArraysCache"}


def model_parts(model: nn.Module) -> ModelParts:
    recurrent, caching = recurrent_layers(model), cache_layers(model)
    model = text_model(model)  # a multimodal wrapper's language model: its __call__ for text inputs
    args = getattr(model, "args", None)
    model_type = getattr(args, "model_type", None)
    vocab = getattr(args, "vocab_size", 0)
    hidden = getattr(args, "hidden_size", 0)
    inner = getattr(model, "model", None)
    if model_type in SPLIT_MODEL_TYPES and inner is not None:
        if hasattr(model, "lm_head") and not getattr(args, "tie_word_embeddings", False):
            head = model.lm_head
        else:  # tied embeddings (LFM2 always ties: its args have no such field)
            head = inner.embed_tokens.as_linear
        return ModelParts(lambda inputs, cache=None: inner(inputs, cache), head, True, hidden, vocab, recurrent, caching)
    return ModelParts(lambda inputs, cache=None: model(inputs, cache=cache), _identity, False, vocab, vocab, recurrent, caching)
