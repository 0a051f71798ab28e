"""Gated DeltaNet's recurrence (Qwen3.5, Qwen3-Next) in chunks: for training, and for inference off Metal.

mlx-lm runs the gated delta rule through `gated_delta_ops` wherever it has no Metal kernel to take: in
training (it passes `use_kernel=not self.training`: the kernel has no gradient) and on CUDA and the CPU.
That is a Python loop over the sequence whose every step makes float32 states of value heads x value dim
x key dim per row (16 x 128 x 128 x 4 bytes = 1 MiB at Qwen3.5-0.8B). Its backward pass keeps several of
them per step, 4.1 MiB a token for one such layer (more than all the rest of the layer; CPU, 512-1,024
steps, `benchmarks/recurrence_memory.py`), and even a forward without gradient keeps every step's state
until the evaluation ends (1.0 MiB a token). On the H200 the 0.8B shape's learner ran out of memory, and
each step of the loop is a dozen kernels: a 4,096-token episode is 50,000 launches per layer and pass.

Training, one gate per head (those models): `parallel_recurrence`, the chunked closed form of the delta
rule (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks", after the WY representation of
DeltaNet's chunkwise training, Yang et al. 2024). Within a chunk of C steps with decays a_t, gamma_t =
a_1 ... a_t, the state S_t = gamma_t S_0 + sum_{i<=t} (gamma_t / gamma_i) u_i k_i^T, where the writes u
solve the unit lower-triangular system (I + A) U = beta * V - (beta gamma * K) S_0^T, A_ti = beta_t
(gamma_t / gamma_i) k_t . k_i for i < t. (I + A)^-1 does not depend on S_0, so it is found for every chunk
at once (block inversion, log2 C levels of products) and the loop runs over chunks, not steps: T / C
iterations of a few products, the outputs o_t = S_t q_t from the same terms. Decays enter as exp of the
sum of the log decays in (i, t] (a segment sum, as Mamba-2's: never a difference of two large cumulative
sums, which loses the small ones when gates are strong), so nothing overflows or cancels. It is not
mlx-lm's order of float operations: against the rule in float64, 1.6e-7 relative error where mlx-lm's loop
has 1.8e-7, also with a tenth of the gates 0 or 1e-12 (tested, with its gradients against mlx-lm's loop).
Autodiff through it kept 0.26-0.31 MiB a token, in 2.8 s against 20.1 s for mlx-lm's loop (one layer of the
0.8B shape, 1,024 steps, the CPU).

Everything else (per-key gates, and inference on CUDA and the CPU): `chunked_recurrence`, mlx-lm's own
steps in chunks of `CHUNK`, each a custom function whose backward recomputes its steps. Outputs equal
`gated_delta_ops` bit for bit (the engine's prefill keeps its exact logprobs), 0.31-0.36 MiB a token in
training; a forward without gradient peaks at about one chunk's states per row and layer whatever the
length (78.6 / 82.6 MiB at 512 / 1,024 steps, where mlx-lm's loop held 1 MiB a token); a sequence of at
most `CHUNK` steps runs mlx-lm's loop whole.

`install(model)` points the Gated DeltaNet modules of a loaded model at `gated_delta_update` below, which
keeps mlx-lm's Metal kernel for inference on a Mac (for the head sizes it takes) and one of the two
everywhere else. The function is the module's, so from the first load on, everything in the process that
runs those mlx-lm models (mlx-lm's own forward in tests, `bench learner`'s mlx-lm baseline) runs it too.
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


def _lower_unit_inverse(m: mx.array) -> mx.array:
    """Inverse of unit lower-triangular matrices (..., C, C), C a power of two: 2 x 2 block inversion, log2(C)
    levels of batched products ([[T11, 0], [-T22 M21 T11, T22]])."""
    size = m.shape[-1]
    lead = m.shape[:-2]
    inv = mx.ones(lead + (size, 1, 1), m.dtype)  # the 1 x 1 diagonal blocks
    block = 1
    while block < size:
        pairs = size // (2 * block)
        # the (2 block) x (2 block) diagonal blocks of m: their lower-left quarter
        tiles = m.reshape(lead + (pairs, 2 * block, pairs, 2 * block))
        diag = mx.stack([tiles[..., p, :, p, :] for p in range(pairs)], axis=-3)  # (..., pairs, 2b, 2b)
        lower_left = diag[..., block:, :block]
        t11 = inv.reshape(lead + (pairs, 2, block, block))[..., 0, :, :]
        t22 = inv.reshape(lead + (pairs, 2, block, block))[..., 1, :, :]
        t21 = -(t22 @ lower_left @ t11)
        zeros = mx.zeros_like(t11)
        top = mx.concatenate([t11, zeros], axis=-1)
        bottom = mx.concatenate([t21, t22], axis=-1)
        inv = mx.concatenate([top, bottom], axis=-2)
        block *= 2
    return inv.reshape(lead + (size, size))


def parallel_recurrence(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array,
                        mask: mx.array | None = None, chunk: int = CHUNK) -> tuple[mx.array, mx.array]:
    """`gated_delta_ops` for scalar gates (g: (B, T, Hv)), `chunk` (a power of two) steps at a time in closed
    form (module docstring); float32 inside. A padded step (mask False) leaves the state as it is, as there;
    its output (which nothing reads) is the old state's."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    dtype = q.dtype
    if Hv // Hk > 1:
        q = mx.repeat(q, Hv // Hk, -2)
        k = mx.repeat(k, Hv // Hk, -2)
    log_g = mx.log(mx.maximum(g.astype(mx.float32), 1e-30))
    beta = beta.astype(mx.float32)
    if mask is not None:  # a padded step leaves the state as it is: no decay, no write
        log_g = mx.where(mask[..., None], log_g, 0.0)
        beta = mx.where(mask[..., None], beta, 0.0)
    pad = -T % chunk
    if pad:
        widths = [(0, 0), (0, pad), (0, 0), (0, 0)]
        q, k, v = (mx.pad(a, widths) for a in (q, k, v))
        log_g, beta = (mx.pad(a, widths[:3]) for a in (log_g, beta))
    n = (T + pad) // chunk
    # (B, H, N, C, D) and (B, H, N, C)
    q, k, v = (a.astype(mx.float32).reshape(B, n, chunk, Hv, -1).transpose(0, 3, 1, 2, 4) for a in (q, k, v))
    log_g, beta = (a.reshape(B, n, chunk, Hv).transpose(0, 3, 1, 2) for a in (log_g, beta))
    G = mx.cumsum(log_g, axis=-1)
    lower = mx.tril(mx.ones((chunk, chunk), mx.bool_))
    strict = mx.tril(mx.ones((chunk, chunk), mx.bool_), k=-1)
    # G_t - G_i as the sum of the log decays in (i, t] (as Mamba-2's segment sums): a difference of two large
    # cumulative sums loses the small ones when gates are strong
    gaps = mx.cumsum(mx.where(strict, log_g[..., :, None], 0.0), axis=-2)
    decay_incl = mx.where(lower, mx.exp(mx.where(lower, gaps, 0.0)), 0.0)
    kk = k @ k.swapaxes(-1, -2)
    a_matrix = mx.where(strict, beta[..., :, None] * decay_incl * kk, 0.0)
    inv = _lower_unit_inverse(a_matrix + mx.eye(chunk))
    gamma = mx.exp(G)[..., None]
    w = inv @ (k * (beta[..., None] * gamma))  # (B, H, N, C, Dk)
    u_v = inv @ (v * beta[..., None])  # (B, H, N, C, Dv)
    attend = (q @ k.swapaxes(-1, -2)) * decay_incl  # (B, H, N, C, C)
    tail = mx.exp(gaps[..., -1, :])[..., None]  # gamma_C / gamma_i
    total = mx.exp(G[..., -1])[..., None, None]  # (B, H, N, 1, 1)
    S = state.astype(mx.float32)  # (B, H, Dv, Dk)
    outputs = []
    for i in range(n):
        u = u_v[:, :, i] - w[:, :, i] @ S.swapaxes(-1, -2)  # (B, H, C, Dv)
        outputs.append(gamma[:, :, i] * (q[:, :, i] @ S.swapaxes(-1, -2)) + attend[:, :, i] @ u)
        S = total[:, :, i] * S + (u * tail[:, :, i]).swapaxes(-1, -2) @ k[:, :, i]
    y = mx.stack(outputs, axis=2).reshape(B, Hv, n * chunk, Dv).transpose(0, 2, 1, 3)[:, :T]
    return y.astype(dtype), S


def gated_delta_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel: bool = True,
                       lower_bound: float | None = None, allow_neg_eigval: bool = False, **options):
    """mlx-lm's `gated_delta_update`: training (`use_kernel=False`) through `parallel_recurrence` (per-key gates
    through `chunked_recurrence`), inference without mlx-lm's Metal kernel through `chunked_recurrence`."""
    metal_kernel = (use_kernel and mx.default_device() == mx.gpu and mx.metal.is_available()
                    and k.shape[-1] >= 32 and k.shape[-1] % 32 == 0)  # where mlx-lm's kernel takes the shape
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
    if not use_kernel and g.ndim == 3:  # training, one gate per head (Qwen3.5, Qwen3-Next)
        return parallel_recurrence(q, k, v, g, beta, state, mask)
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
