"""Between rollout records (`trajectory.Group`) and the wire message (`TrajectoryGroup`)."""

from __future__ import annotations

import numpy as np

from ..trajectory import Episode, Group
from .messages import TrajectoryGroup


def group_to_message(group: Group, actor: str, env: str, fingerprint: str) -> TrajectoryGroup:
    episodes = group.episodes
    return TrajectoryGroup(
        group_id=group.group_id, actor=actor, env=env, fingerprint=fingerprint, seed=group.seed,
        policy_version=group.policy_version,
        tokens=np.concatenate([np.asarray(e.tokens, np.int32) for e in episodes]),
        policy_mask=np.concatenate([np.asarray(e.policy_mask, bool) for e in episodes]),
        logprobs=np.concatenate([np.asarray(e.logprobs, np.float32) for e in episodes]),
        lengths=np.array([len(e.tokens) for e in episodes], np.int32),
        rewards=np.array([e.reward for e in episodes], np.float32),
        scores=np.array([float(e.info.get("score", e.reward)) for e in episodes], np.float32),
        turns=np.array([e.turns for e in episodes], np.int32),
        truncated=np.array([e.truncated for e in episodes], bool),
        outcomes=[str(e.info.get("outcome", ""))[:32] for e in episodes],
        teacher_tokens=np.array([t for e in episodes for t in (e.teacher_prompt or [])], np.int32),
        teacher_lengths=np.array([len(e.teacher_prompt or []) for e in episodes], np.int32),
    )


def message_to_group(message: TrajectoryGroup) -> Group:
    bounds = np.concatenate([[0], np.cumsum(message.lengths)])
    teacher_bounds = np.concatenate([[0], np.cumsum(message.teacher_lengths)])
    episodes = []
    for i in range(len(message.lengths)):
        part = slice(int(bounds[i]), int(bounds[i + 1]))
        info = {"score": float(message.scores[i])}
        if message.outcomes[i]:
            info["outcome"] = message.outcomes[i]
        episodes.append(Episode(
            tokens=message.tokens[part].tolist(), policy_mask=message.policy_mask[part].tolist(),
            logprobs=message.logprobs[part].tolist(), reward=float(message.rewards[i]), info=info,
            turns=int(message.turns[i]), truncated=bool(message.truncated[i]),
            teacher_prompt=(message.teacher_tokens[int(teacher_bounds[i]):int(teacher_bounds[i + 1])].tolist()
                            if message.teacher_lengths[i] else None),
        ))
    return Group(seed=message.seed, episodes=episodes, policy_version=message.policy_version,
                 group_id=message.group_id)
