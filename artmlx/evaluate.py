"""Evaluation on held-out seeds: score, outcome rates and a 95 % confidence interval.

Training draws task seeds below `EVAL_SEED_BASE`; evaluation uses `EVAL_SEED_BASE + i`, so no
evaluation task is ever trained on. Each seed is played once (groups of one).
"""

from __future__ import annotations

import math
from dataclasses import replace

import mlx.core as mx
import numpy as np

from .rollout.episodes import EpisodeRollouts
from .trajectory import Episode

EVAL_SEED_BASE = 1 << 30
EVAL_CHUNK = 256


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


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(episodes: list[Episode], outcomes: tuple[str, ...]) -> dict:
    scores = np.array([float(e.info.get("score", e.reward)) for e in episodes])
    n = len(scores)
    mean = float(scores.mean()) if n else 0.0
    if n and set(np.unique(scores)) <= {0.0, 1.0}:
        low, high = wilson_interval(scores.sum(), n)
    else:
        half = 1.96 * float(scores.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
        low, high = mean - half, mean + half
    row = {
        "eval_score": mean,
        "eval_score_ci_low": low,
        "eval_score_ci_high": high,
        "eval_episodes": n,
        "eval_reward_mean": float(np.mean([e.reward for e in episodes])) if n else 0.0,
        "eval_truncated_rate": float(np.mean([e.truncated for e in episodes])) if n else 0.0,
    }
    for outcome in outcomes:
        row[f"eval_{outcome}_rate"] = float(np.mean([e.info.get("outcome") == outcome for e in episodes])) if n else 0.0
    return row


def evaluate(engine: EpisodeRollouts, episodes: int, outcomes: tuple[str, ...], temperature: float,
             seed: int = 0) -> dict:
    """Play `episodes` held-out tasks once each (in chunks) and summarise them."""
    saved = engine.sampling
    engine.sampling = replace(saved, temperature=temperature)
    try:
        played: list[Episode] = []
        key = mx.random.key(seed)
        for start in range(0, episodes, EVAL_CHUNK):
            key, chunk_key = mx.random.split(key)
            seeds = [EVAL_SEED_BASE + i for i in range(start, min(start + EVAL_CHUNK, episodes))]
            for group in engine.play(seeds, 1, chunk_key):
                played += group.episodes
    finally:
        engine.sampling = saved
    return summarize(played, outcomes)
