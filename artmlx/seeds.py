"""Task seeds and sampling keys: pure functions of (run seed, step), so a run resumed from a
checkpoint draws exactly what it would have drawn, and evaluation's seeds are never trained on.

Training draws task seeds below `EVAL_SEED_BASE`; evaluation uses `EVAL_SEED_BASE + i`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

EVAL_SEED_BASE = 1 << 30


def train_seeds(seed: int, step: int, count: int, sampling_round: int = 0) -> list[int]:
    """Task seeds of one training update: a pure function of (run seed, step); a further round of dynamic
    sampling (`rollout/dynamic_sampling.py`) draws its own."""
    rng = np.random.default_rng([seed, step, 0x5EED] + ([sampling_round] if sampling_round else []))
    return rng.integers(0, EVAL_SEED_BASE, size=count).tolist()


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A seed for one update's randomness: a pure function of (run seed, step, stream)."""
    return int(np.random.default_rng([seed, step, stream]).integers(0, 2**62))


def step_key(seed: int, step: int, sampling_round: int = 0) -> mx.array:
    """Sampling key of one update (of its dynamic-sampling round)."""
    return mx.random.key(step_seed(seed, step, stream=0 if not sampling_round else 100 + sampling_round))
