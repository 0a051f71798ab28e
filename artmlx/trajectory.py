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
    teacher_prompt: list[int] | None = None
    """A directive hint's teacher context (`learner/distill.py`): token ids that replace the episode's
    prompt (the tokens before its first sampled one) when the teacher scores the sampled tokens."""

    def __post_init__(self):
        if not (len(self.tokens) == len(self.policy_mask) == len(self.logprobs)):
            raise ValueError(
                f"episode arrays disagree: {len(self.tokens)} tokens, {len(self.policy_mask)} mask, "
                f"{len(self.logprobs)} logprobs"
            )

    @property
    def policy_tokens(self) -> int:
        return int(sum(self.policy_mask))

    @property
    def prompt_length(self) -> int:
        """Tokens before the first one the policy sampled."""
        return self.policy_mask.index(True) if True in self.policy_mask else len(self.tokens)

    def teacher_episode(self) -> "Episode":
        """The episode as the hint's teacher sees it: its teacher prompt, then exactly the tokens after its
        own prompt (so every sampled token is scored at its place in the teacher's context)."""
        if self.teacher_prompt is None:
            raise ValueError("this episode has no teacher prompt")
        n, prompt = self.prompt_length, list(self.teacher_prompt)
        return Episode(prompt + self.tokens[n:], [False] * len(prompt) + self.policy_mask[n:],
                       [0.0] * len(prompt) + self.logprobs[n:], self.reward, self.info, self.turns, self.truncated)


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
    def hinted(self) -> bool:
        """Some episode carries a directive hint: it trains through its hinted tokens even when flat."""
        return any(e.teacher_prompt is not None for e in self.episodes)

    @property
    def has_signal(self) -> bool:
        """Worth an update: rewards that differ, or a hint (what dynamic sampling keeps)."""
        return self.carries_signal()

    def hints_count(self, reward_below: float = 0.0) -> bool:
        """Its hints train: some episode carries one and, where `reward_below` > 0 (`hint_group_reward_below`),
        the group's mean reward is below it."""
        return self.hinted and (not reward_below or float(self.rewards.mean()) < reward_below)

    def carries_signal(self, hint_reward_below: float = 0.0) -> bool:
        """`has_signal` under `hint_group_reward_below`: a flat group trains only if its hints count."""
        return not self.flat or self.hints_count(hint_reward_below)

    @property
    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self.episodes)

    @property
    def policy_tokens(self) -> int:
        return sum(e.policy_tokens for e in self.episodes)
