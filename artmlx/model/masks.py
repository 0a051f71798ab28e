"""The sliding-window rule that the engine's ragged cache and the learner's shared-prefix forward both apply."""

from __future__ import annotations

import mlx.core as mx


def window_visible(query_positions: mx.array, key_positions: mx.array, window: int) -> mx.array:
    """True where a query at position q may attend a key at position p: p <= q and q - p < window, as
    mlx-lm's `create_causal_mask(window_size=...)`. Shapes (..., Q) and (..., K) broadcast to (..., Q, K)."""
    q, p = query_positions[..., :, None], key_positions[..., None, :]
    return (p <= q) & (q - p < window)
