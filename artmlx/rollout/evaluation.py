"""Evaluation on held-out seeds: score, outcome rates and a 95 % confidence interval.

Training draws task seeds below `EVAL_SEED_BASE`; evaluation uses `EVAL_SEED_BASE + i`, so no
evaluation task is ever trained on. Each seed is played once (groups of one).

An agent (`rollout`) is evaluated on its held-out scenarios instead (`evaluate_agent`): each played
once by the agent itself; a trajectory's score is its `metrics["score"]` where it has one (as an
environment's `info["score"]`), else its reward; the row adds the mean of every metric.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import mlx.core as mx
import numpy as np

from ..seeds import EVAL_SEED_BASE
from ..trajectory import Episode
from .episodes import EpisodeRollouts

EVAL_CHUNK = 256


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def score_row(scores: list[float]) -> dict:
    """Mean score and its 95 % interval (Wilson's for 0/1 scores, else the normal one), and the count."""
    scores = np.array(scores, dtype=np.float64)
    n = len(scores)
    mean = float(scores.mean()) if n else 0.0
    if n and set(np.unique(scores)) <= {0.0, 1.0}:
        low, high = wilson_interval(scores.sum(), n)
    else:
        half = 1.96 * float(scores.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
        low, high = mean - half, mean + half
    return {"eval_score": mean, "eval_score_ci_low": low, "eval_score_ci_high": high, "eval_episodes": n}


EPISODE_COUNTERS = ("tool_calls", "tool_errors")
"""Counts an environment may put in its last step's `info`; the evaluation reports the share of episodes
with at least one (`eval_tool_calls_rate`: episodes that called a tool)."""


def summarize(episodes: list[Episode], outcomes: tuple[str, ...]) -> dict:
    n = len(episodes)
    row = {
        **score_row([float(e.info.get("score", e.reward)) for e in episodes]),
        "eval_reward_mean": float(np.mean([e.reward for e in episodes])) if n else 0.0,
        "eval_truncated_rate": float(np.mean([e.truncated for e in episodes])) if n else 0.0,
    }
    for outcome in outcomes:
        row[f"eval_{outcome}_rate"] = float(np.mean([e.info.get("outcome") == outcome for e in episodes])) if n else 0.0
    for counter in EPISODE_COUNTERS:  # a tool task's: how many episodes made a call at all
        if any(counter in e.info for e in episodes):
            row[f"eval_{counter}_rate"] = float(np.mean([(e.info.get(counter) or 0) > 0 for e in episodes]))
    return row



def evaluate(engine: EpisodeRollouts, episodes: int, outcomes: tuple[str, ...], temperature: float,
             seed: int = 0) -> dict:
    """Play `episodes` held-out tasks once each (in chunks) and summarise them; `eval_seconds` is its wall time
    (so a learning curve can be drawn against training time alone)."""
    started = time.perf_counter()
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
    return {**summarize(played, outcomes), "eval_seconds": time.perf_counter() - started}


def evaluate_agent(rollouts, scenarios: list) -> dict | None:
    """Each held-out scenario played once by the agent (`AgentRollouts.play_once`), summarised; None if stopped."""
    started = time.perf_counter()
    trajectories = rollouts.play_once(scenarios)
    if trajectories is None:
        return None
    return {**summarize_trajectories(trajectories), "eval_seconds": time.perf_counter() - started}


def summarize_trajectories(trajectories: list) -> dict:
    """Score (`metrics["score"]`, else the reward) with its interval, mean reward, failed rollouts (None, or
    no numeric reward) and `eval_metric_<name>`: each numeric metric's mean over the trajectories that have it."""
    played = [t for t in trajectories if isinstance(getattr(t, "reward", None), (int, float))]
    metrics: dict[str, list[float]] = {}
    scores = []
    for trajectory in played:
        numeric = {str(name): float(value) for name, value in (getattr(trajectory, "metrics", None) or {}).items()
                   if isinstance(value, (int, float)) and math.isfinite(value)}
        for name, value in numeric.items():
            metrics.setdefault(name, []).append(value)
        scores.append(numeric.get("score", float(trajectory.reward)))
    return {**score_row(scores), "eval_reward_mean": float(np.mean([t.reward for t in played])) if played else 0.0,
            "eval_failed": len(trajectories) - len(played),
            **{f"eval_metric_{name}": float(np.mean(values)) for name, values in sorted(metrics.items())}}


def unevaluated_note(rollout: str, eval_every: int, eval_scenarios: list, env: str) -> str | None:
    """Why a run with evaluation switched on gets no evaluation rows, said once at its start; None if it is
    evaluated. An agent run (`rollout`) is evaluated with the agent on its held-out scenarios only: the
    run's `env` is not the agent's task."""
    if rollout and eval_every and not eval_scenarios:
        return ("an agent run is evaluated only on eval_scenarios (--eval-scenarios), and none are given: no "
                f"evaluation (env {env!r} is not the agent's task)")
    return None
