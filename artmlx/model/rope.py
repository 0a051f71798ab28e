"""RoPE from plain MLX ops, for backends whose fused kernel fails.

MLX 0.32.4's CUDA `mx.fast.rope` cannot launch for decode-shaped inputs with 128 or more rows
(`(B >= 128, heads, 1, head_dim)` raises "cudaLaunchKernelExC ... invalid argument" on an H200),
which is every batched rollout step. `PortableRoPE` computes the same rotation (mlx's default,
non-traditional layout: the first and second halves of the rotated dimensions pair up; positions
`offset + i` scaled by `scale`, frequencies `base ** (-2j / dims)`), with scalar or per-row array
offsets as mlx-lm's caches pass them. It replaces plain `nn.RoPE` layers and mlx-lm's `Llama3RoPE`
(whose fused call passes its own frequencies; theta = position / freq), only on the CUDA backend,
or when ARTMLX_PORTABLE_ROPE=1;
the learner and the actors load models the same way, so both compute identical logprobs.
Probed again (`dev/probes/rope_probe.py`, `dev/probes/results/h200/rope-probe-h200.json`): the fused kernel
launched and agreed (bfloat16) at every probed shape, 1-512 rows, so the failure needs something the probe
lacks; the one A/B of a decode with it (in pieces, together with LoRA's fused product to 256 rows) was slower
(13.5 / 14.8 against 11.8 / 12.3 s for 128 agents), so the default is unchanged. The
rotation is one compiled function (`mx.compile`), so its dozen element-wise operations run as a
few fused kernels: at every decode step it runs twice in every layer.
"""

from __future__ import annotations

import os

import mlx.core as mx
from mlx import nn


def _rotate(x: mx.array, positions: mx.array, inv_freq: mx.array, dims: int, traditional: bool) -> mx.array:
    theta = positions * inv_freq
    cos, sin = mx.cos(theta).astype(x.dtype), mx.sin(theta).astype(x.dtype)
    rotated, rest = x[..., :dims], x[..., dims:]
    if traditional:
        even, odd = rotated[..., 0::2], rotated[..., 1::2]
        out = mx.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1).reshape(rotated.shape)
    else:
        half = dims // 2
        first, second = rotated[..., :half], rotated[..., half:]
        out = mx.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
    return mx.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


_rotate_compiled = mx.compile(_rotate)


CUDA_FUSED_ROPE_ROWS = 128
"""On CUDA, inputs of fewer rows than this take `mx.fast.rope` (it fails from 128 decode rows). The compiled
rotation costs the host ~100 us per call against one kernel launch: with it, a one-row decode step of the
0.5B shape (48 calls) took ~10.5 ms on the H200 and ~5 ms with the fused kernel (LoRA off, both)."""


# A/B switch (ARTMLX_ROPE_PIECES=1): decode inputs of `fused_below_rows` rows or more take the fused kernel in
# pieces below that size, joined, instead of the compiled rotation (dev/probes/rope_probe.py checks both).
PIECES = os.environ.get("ARTMLX_ROPE_PIECES") == "1"


class PortableRoPE(nn.Module):
    def __init__(self, dims: int, traditional: bool = False, base: float = 10000.0, scale: float = 1.0,
                 freqs: mx.array | None = None, fused_below_rows: int = 0):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = dims, traditional, base, scale
        self.fused_below_rows = fused_below_rows  # inputs with fewer rows use mx.fast.rope
        self._freqs = freqs
        # Once, not per call (every layer at every decode step); the leading _ keeps it out of parameters().
        if freqs is not None:  # mx.fast.rope's `freqs`: theta = scale * position / freq
            self._scaled_inv_freq = scale / freqs.astype(mx.float32)
        else:
            self._scaled_inv_freq = scale * base ** (-mx.arange(0, dims, 2, dtype=mx.float32) / dims)

    def _fused(self, x: mx.array, offset: int | mx.array) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=self.traditional,
                            base=None if self._freqs is not None else self.base, scale=self.scale,
                            offset=offset, freqs=self._freqs)

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if x.shape[0] < self.fused_below_rows:
            return self._fused(x, offset)
        if PIECES and self.fused_below_rows and x.shape[-2] == 1:  # decode rows, in pieces the kernel launches for
            piece, per_row = self.fused_below_rows - 1, isinstance(offset, mx.array) and offset.ndim == 1
            return mx.concatenate([self._fused(x[i:i + piece], offset[i:i + piece] if per_row else offset)
                                   for i in range(0, x.shape[0], piece)])
        positions = mx.arange(x.shape[-2], dtype=mx.float32)
        if isinstance(offset, mx.array) and offset.ndim == 1:
            # One offset per batch row: (B, 1, L, 1) positions against (B, heads, L, D) inputs.
            positions = (offset.astype(mx.float32)[:, None] + positions[None, :])[:, None, :, None]
        else:
            positions = (positions + offset)[:, None]
        return _rotate_compiled(x, positions, self._scaled_inv_freq, self.dims, self.traditional)


def portable_rope_wanted() -> bool:
    """On the CUDA backend (or when ARTMLX_PORTABLE_ROPE=1); ARTMLX_PORTABLE_ROPE=0 turns it off."""
    forced = os.environ.get("ARTMLX_PORTABLE_ROPE")
    if forced is not None:
        return forced == "1"
    return mx.default_device() == mx.gpu and hasattr(mx, "cuda") and mx.cuda.is_available()


def use_portable_rope(model: nn.Module) -> int:
    """Swap every plain nn.RoPE and Llama3RoPE in `model` for PortableRoPE; returns how many were swapped.
    Narrow inputs keep the fused kernel on CUDA; ARTMLX_PORTABLE_ROPE=1 forces the portable rotation for all."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    fused = 0 if os.environ.get("ARTMLX_PORTABLE_ROPE") == "1" else CUDA_FUSED_ROPE_ROWS

    swapped = 0
    for _, module in model.named_modules():
        for name, child in list(module.children().items()):
            if type(child) is nn.RoPE:
                setattr(module, name, PortableRoPE(child.dims, child.traditional, child.base, child.scale,
                                                   fused_below_rows=fused))
            elif type(child) is Llama3RoPE:
                setattr(module, name, PortableRoPE(child.dims, child.traditional, freqs=child._freqs,
                                                   fused_below_rows=fused))
            else:
                continue
            swapped += 1
    return swapped
