"""What rollouts produce and training consumes: episodes, grouped by task seed.

A group is G episodes of one task (same environment seed). Each episode keeps the exact token ids
of its whole transcript (prompt, policy replies, environment turns), a mask of the ids the policy
sampled, the behaviour logprob of each sampled id (under the tempered distribution it was drawn
from; 0 elsewhere), its total reward, and the policy version that sampled it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

FLAT_EPS = 1e-6  # reward std at or below which a group is flat (the learner's zero_variance)


@dataclass
class Episode:
    tokens: list[int]
    policy_mask: list[bool]
    logprobs: list[float]
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    truncated: bool = False

    def __post_init__(self):
        if not (len(self.tokens) == len(self.policy_mask) == len(self.logprobs)):
            raise ValueError(
                f"episode arrays disagree: {len(self.tokens)} tokens, {len(self.policy_mask)} mask, "
                f"{len(self.logprobs)} logprobs"
            )

    @property
    def policy_tokens(self) -> int:
        return int(sum(self.policy_mask))


@dataclass
class Group:
    seed: int
    episodes: list[Episode]
    policy_version: int
    group_id: str = ""

    @property
    def rewards(self) -> np.ndarray:
        return np.array([e.reward for e in self.episodes], dtype=np.float32)

    @property
    def flat(self) -> bool:
        """Every episode got the same reward: zero advantage, no gradient (`learner/grpo.group_advantages`)."""
        return float(np.std(self.rewards)) <= FLAT_EPS

    @property
    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self.episodes)

    @property
    def policy_tokens(self) -> int:
        return sum(e.policy_tokens for e in self.episodes)
