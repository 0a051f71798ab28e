"""Which of mlx-lm's model families artmlx runs, and the text model inside a multimodal checkpoint.

Multimodal checkpoints (Mistral 3 / Ministral 3 as published, Gemma 3/4, Qwen3.5) nest the language model:
their config holds it under `text_config` and mlx-lm's wrapper class keeps it as `model.language_model`
(a complete mlx-lm text model with its own `args`, `model` trunk and head), loading only its weights.
artmlx trains and serves that text tower; the wrapper's `__call__` for text inputs is the tower's.

The engine caches keys and values in its ragged cache (`engine/cache.py`), which is what mlx-lm's
`KVCache` holds; sliding-window layers (mlx-lm's `RotatingKVCache`) get a window mask over it in the
families listed in `WINDOWED_FAMILIES`, and recurrent layers (mlx-lm's `ArraysCache`: Gated DeltaNet,
short convolutions) a per-row state in the families of `RECURRENT_FAMILIES`, whose layers honour the
padding mask and lengths mlx-lm's batched generation gives them (each family tested against mlx-lm's
own forward). Any other cache (Mamba's, RWKV's, chunked or quantized attention), or a cache of a
family not listed, is refused when the model is loaded, by every command, naming those layers.
"""

from __future__ import annotations

import collections

import mlx.nn as nn

SUPPORTED_CACHES = {"KVCache"}
WINDOWED_FAMILIES = {"gemma3_text", "gemma4_text", "olmo3", "gpt_oss"}
RECURRENT_FAMILIES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "lfm2"}
"""Model types whose recurrent layers (ArraysCache in mlx-lm: Gated DeltaNet, LFM2's short convolutions) the
engine keeps a per-row state for, and the learner's shared-prefix forward starts from a prefix's state."""
"""Model types whose sliding-window layers (RotatingKVCache in mlx-lm) the engine and learner run with a
window mask over the ragged cache, whose window layers drop the slots no row can see again (tested against
mlx-lm's own forward on episodes longer than the window)."""
CACHE_KINDS = {
    "RotatingKVCache": "sliding-window attention",
    "ArraysCache": "recurrent state (Gated DeltaNet, convolution or Mamba layers)",
    "MambaCache": "recurrent state (Mamba layers)",
    "ChunkedKVCache": "chunked attention",
    "QuantizedKVCache": "a quantized KV cache",
    "CacheList": "several caches per layer",
}


def text_model(model: nn.Module) -> nn.Module:
    """The language model: `model.language_model` in mlx-lm's multimodal wrappers, else `model` itself."""
    inner = getattr(model, "language_model", None)
    return inner if isinstance(inner, nn.Module) and hasattr(inner, "args") else model


def text_args(model: nn.Module):
    """The language model's config (mlx-lm ModelArgs): hidden size, heads, vocabulary, ..."""
    return text_model(model).args


def vocab_size(model: nn.Module) -> int:
    return text_args(model).vocab_size


def unsupported_layers(model: nn.Module) -> dict[str, list[int]]:
    """Cache type -> the layers that make it, for every cache type the engine does not hold."""
    if not hasattr(model, "make_cache"):
        return {}
    layers = collections.defaultdict(list)
    model_type = _model_type(model)
    supported = (SUPPORTED_CACHES | ({"RotatingKVCache"} if model_type in WINDOWED_FAMILIES else set())
                 | ({"ArraysCache"} if model_type in RECURRENT_FAMILIES else set()))
    for index, cache in enumerate(model.make_cache()):
        kind = type(cache).__name__
        if kind not in supported:
            layers[kind].append(index)
    return dict(layers)


def window_layers(model: nn.Module) -> dict[int, int]:
    """Layer index -> window size, for the layers mlx-lm gives a RotatingKVCache (sliding-window attention)."""
    if not hasattr(model, "make_cache"):
        return {}
    return {i: c.max_size for i, c in enumerate(model.make_cache()) if type(c).__name__ == "RotatingKVCache"}


def has_sliding_window(model: nn.Module) -> bool:
    """Whether some layer attends over a sliding window (mlx-lm makes a RotatingKVCache for it)."""
    return hasattr(model, "make_cache") and any(type(c).__name__ == "RotatingKVCache" for c in model.make_cache())


def _model_type(model: nn.Module) -> str:
    return getattr(text_args(model), "model_type", "?")


def check_supported(model: nn.Module, name: str = "this model") -> None:
    """Raise ValueError naming the layers artmlx cannot run yet (what mlx-lm caches for them)."""
    found = unsupported_layers(model)
    if not found:
        return
    model_type = _model_type(model)
    parts = [f"{len(rows)} layer(s) with {CACHE_KINDS.get(kind, kind)} ({kind}: layers {_ranges(rows)})"
             for kind, rows in found.items()]
    raise ValueError(f"{name} (model type {model_type!r}) has {'; '.join(parts)}. artmlx runs models whose every "
                     "layer is full attention with a KV cache (Qwen2/2.5/3, Qwen3-MoE, Llama, Mistral/Ministral, "
                     "SmolLM3, and such text towers of multimodal checkpoints), sliding-window layers in "
                     f"{', '.join(sorted(WINDOWED_FAMILIES))}, and recurrent layers in "
                     f"{', '.join(sorted(RECURRENT_FAMILIES))}; other recurrent and sliding-window families "
                     "are not supported yet.")


def _ranges(rows: list[int]) -> str:
    out, start = [], rows[0]
    for previous, current in zip(rows, rows[1:] + [None]):
        if current != previous + 1:
            out.append(str(start) if start == previous else f"{start}-{previous}")
            start = current
    return ", ".join(out)
