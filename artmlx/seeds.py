"""Task seeds and sampling keys: pure functions of (run seed, step), so a run resumed from a
checkpoint draws exactly what it would have drawn, and evaluation's seeds are never trained on.

Training draws task seeds below `EVAL_SEED_BASE`; evaluation uses `EVAL_SEED_BASE + i`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

EVAL_SEED_BASE = 1 << 30


def train_seeds(seed: int, step: int, count: int) -> list[int]:
    """Task seeds of one training update: a pure function of (run seed, step)."""
    rng = np.random.default_rng([seed, step, 0x5EED])
    return rng.integers(0, EVAL_SEED_BASE, size=count).tolist()


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A seed for one update's randomness: a pure function of (run seed, step, stream)."""
    return int(np.random.default_rng([seed, step, stream]).integers(0, 2**62))


def step_key(seed: int, step: int) -> mx.array:
    """Sampling key of one update."""
    return mx.random.key(step_seed(seed, step, stream=0))
