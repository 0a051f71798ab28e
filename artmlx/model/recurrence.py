"""Gated DeltaNet's recurrence for training, checkpointed every `CHUNK` time steps.

mlx-lm trains a Gated DeltaNet layer (Qwen3.5, Qwen3-Next) through `gated_delta_ops`, a loop over the
sequence whose every step makes new float32 states of value heads x value dim x key dim per row (16 x 128
x 128 x 4 bytes = 1 MiB at Qwen3.5-0.8B), and the backward pass keeps several of them per step: megabytes
per token per layer, more than all the rest of the layer (`benchmarks/recurrence_memory.py`; the 0.8B
shape's learner ran out of an H200's memory at its plan's 26,440-token micro-batches). Measured on the
CPU, one layer of that shape, 1,024 steps, forward and backward: 4.1 MiB a token through `gated_delta_ops`,
0.36 MiB chunked). Here the loop runs
in chunks of `CHUNK` steps, each through `mx.checkpoint`: the backward keeps the state at each chunk's
start and recomputes one chunk's steps at a time, about one more forward of the recurrence for memory
that no longer grows with the states per token. The steps are mlx-lm's own (`gated_delta_ops`), so the
outputs are the same bit for bit and the gradients up to the order of float sums.

Without a gradient the chunks bound memory too: one forward of `gated_delta_ops` over T steps peaked at
1 MiB a token (every step's state alive until the evaluation ends), chunked at 0.08 MiB (CPU, 1,024 steps
of the 0.8B layer). That is inference on CUDA and the CPU, where mlx-lm has no kernel.

`install(model)` points the Gated DeltaNet modules of a loaded model at `gated_delta_update` below, which
keeps mlx-lm's Metal kernel for inference on a Mac and takes the chunked ops everywhere mlx-lm would take
its plain ops (training: mlx-lm passes `use_kernel=not self.training`; CUDA and the CPU).
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gated_delta as mlx_lm_gated_delta

CHUNK = 64
_ORIGINAL = mlx_lm_gated_delta.gated_delta_update


def chunked_recurrence(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array,
                       mask: mx.array | None = None, chunk: int = CHUNK) -> tuple[mx.array, mx.array]:
    """`gated_delta_ops(q, k, v, g, beta, state, mask)` (shapes as there: q, k (B, T, Hk, Dk), v (B, T, Hv, Dv),
    g, beta per step, state (B, Hv, Dv, Dk)), the steps of each `chunk` recomputed in the backward pass."""
    steps = q.shape[1]
    if steps <= chunk:
        return mlx_lm_gated_delta.gated_delta_ops(q, k, v, g, beta, state, mask)
    bounds = list(range(chunk, steps, chunk))
    # split, not sliced: the gradient of a split is one concatenation, that of a slice a full-size array each
    parts = zip(*(mx.split(a, bounds, axis=1) for a in (q, k, v, g, beta)))
    masks = [None] * (len(bounds) + 1) if mask is None else mx.split(mask, bounds, axis=1)
    outputs = []
    for (q_part, k_part, v_part, g_part, beta_part), mask_part in zip(parts, masks):
        y, state = _chunk(mask_part)(q_part, k_part, v_part, g_part, beta_part, state)
        outputs.append(y)
    return mx.concatenate(outputs, axis=1), state


def _chunk(mask: mx.array | None):
    """One chunk of steps as a function whose backward recomputes them. The mask (which steps are real) is
    captured, not an argument: booleans have no gradient."""

    def steps(q, k, v, g, beta, state):
        return mlx_lm_gated_delta.gated_delta_ops(q, k, v, g, beta, state, mask)

    run = mx.custom_function(steps)

    @run.vjp
    def backward(primals, cotangents, outputs):
        # Recompute only once the later chunks' backward has made this chunk's cotangents (as mx.checkpoint
        # does), and make the state's gradient, which the earlier chunks wait for, depend on this chunk's
        # other gradients: MLX then reduces each step's state-sized products before it moves on, instead
        # of holding every step's until the end (1 MiB a token per layer at the 0.8B shape).
        primals = mx.depends(list(primals), list(cotangents))
        _, grads = mx.vjp(steps, primals, list(cotangents))
        *inputs, state = grads
        return (*inputs, mx.depends(state, inputs))

    return run


def gated_delta_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel: bool = True,
                       lower_bound: float | None = None, allow_neg_eigval: bool = False, **options):
    """mlx-lm's `gated_delta_update`, whose training path (`use_kernel=False`) is `chunked_recurrence`."""
    metal_kernel = use_kernel and mx.default_device() == mx.gpu and mx.metal.is_available()
    if metal_kernel or options:  # inference on Metal, or arguments of a newer mlx-lm: its own function
        return _ORIGINAL(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel, lower_bound=lower_bound,
                         allow_neg_eigval=allow_neg_eigval, **options)
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = mlx_lm_gated_delta.compute_g(A_log, a, dt_bias)
    else:
        g = mlx_lm_gated_delta.compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    if state is None:
        batch, _, _, key_dim = q.shape
        value_heads, value_dim = v.shape[-2:]
        state = mx.zeros((batch, value_heads, value_dim, key_dim), dtype=mx.float32)
    return chunked_recurrence(q, k, v, g, beta, state, mask)


def install(model: nn.Module) -> int:
    """Point every mlx-lm model module that `model`'s layers come from, and that calls mlx-lm's
    `gated_delta_update`, at ours. Returns how many modules now do (0: the model has no such layers)."""
    installed = set()
    for _, layer in model.named_modules():
        module = sys.modules.get(type(layer).__module__)
        if module is not None and getattr(module, "gated_delta_update", None) in (_ORIGINAL, gated_delta_update):
            module.gated_delta_update = gated_delta_update
            installed.add(module.__name__)
    return len(installed)
