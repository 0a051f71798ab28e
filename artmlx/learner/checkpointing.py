"""Per-layer gradient checkpointing: keep each decoder layer's input, recompute its inside for the backward.

Without it a training step keeps every layer's activations (and, with MLX's unfused attention, every
layer's attention scores) until the backward pass: `MemoryPlan.train_bytes_per_token`, 12–17 MB a
token at the 7B shape. With it a layer's activations live only while that layer's backward runs, so a
step holds one layer's worth plus each layer's input (mlx-lm's `tuner.trainer.grad_checkpoint`, mlxrl
and prime-rl do the same; it costs about one more forward).

How: the decoder layers' class gets a `__call__` that, for a layer marked by `enable(model, True)`,
runs the original through `mx.checkpoint` with the layer's trainable parameters and its floating
array arguments (at any depth: Gemma 4's KV-shared layers receive an earlier layer's keys and values as
a tuple) as the explicit arguments (as mlx-lm does). Unmarked layers (inference, other models of the same class) take
the original call. The learner's shared-prefix cache (`forward.PrefixKV`) is state shared by the layers,
which the recomputation runs after the forward has moved on: its `checkpoint_state` captures what a
call saw (which pass, RoPE offsets, the prefix keys and values an episode row attends to, these as
explicit arguments so their gradient reaches the prefix pass) and `restored` puts it back around the
recomputation.

LoRA dropout draws new masks when a layer is recomputed, which would make the backward disagree with
the forward: checkpointing is refused with `lora_dropout > 0`.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

_ORIGINAL_CALLS: dict[type, object] = {}


def _checkpointed(original):
    def call(self, *args, **kwargs):
        if not getattr(self, "_artmlx_checkpoint", False):
            return original(self, *args, **kwargs)
        # Layers' signatures differ by family ((x, mask, cache), (x, scale, mask, cache=...), Gemma 4's
        # shared_kv=(keys, values)): floating arrays at any depth of the arguments become the checkpoint's
        # explicit inputs (what gradients flow through), everything else is captured.
        cache = kwargs.get("cache") or next((a for a in args if hasattr(a, "checkpoint_state")), None)
        leaves = tree_flatten({"args": list(args), "kwargs": dict(kwargs)})
        floating = [i for i, (_, value) in enumerate(leaves) if _floating(value)]
        saved = cache.checkpoint_state() if hasattr(cache, "checkpoint_state") else None
        forward = [True]  # the first run is the forward itself, in the state as it is; later ones recompute

        def inner(params, arrays, cache_arrays):
            self.update(params)
            call = list(leaves)
            for i, a in zip(floating, arrays):
                call[i] = (call[i][0], a)
            rebuilt = tree_unflatten(call) if call else {}
            call_args, call_kwargs = rebuilt.get("args", []), rebuilt.get("kwargs", {})
            recompute = saved is not None and not forward[0]
            forward[0] = False
            with cache.restored(saved[0], cache_arrays) if recompute else contextlib.nullcontext():
                return original(self, *call_args, **call_kwargs)

        return mx.checkpoint(inner)(self.trainable_parameters(), [leaves[i][1] for i in floating],
                                    saved[1] if saved is not None else [])

    return call


def _floating(value) -> bool:
    return isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating)


def enable(model: nn.Module, on: bool) -> None:
    """Mark (or unmark) every decoder layer of `model` for checkpointing."""
    for layer in model.layers:
        cls = type(layer)
        if cls not in _ORIGINAL_CALLS:
            _ORIGINAL_CALLS[cls] = cls.__call__
            cls.__call__ = _checkpointed(_ORIGINAL_CALLS[cls])
        layer._artmlx_checkpoint = on


@contextlib.contextmanager
def checkpointed(model: nn.Module, on: bool = True):
    """Layers of `model` checkpointed inside the block (a training step), as before after it."""
    enable(model, on)
    try:
        yield
    finally:
        enable(model, False)
