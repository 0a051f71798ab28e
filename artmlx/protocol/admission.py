"""What the learner accepts from an actor beyond the codec's schema: checks against the run.

The codec (codec.py) guarantees a well-formed message: types, ranges, dtypes, finite floats,
consistent lengths. An actor with a valid key can still send a well-formed group that breaks or
poisons training, so every group is also checked against the run it claims to belong to:

- its episode count is the run's `group_size`, or at least `min_group_size` when the run allows groups
  shortened by refused agent trajectories (the trainer computes advantages per group, any size);
- every token id is below the model's vocabulary size (an out-of-range id is an out-of-bounds
  gather in MLX: a crash, not an exception);
- no episode is longer than the engine could have produced (`max_tokens`: the KV slots of one
  row, `engine.memory.slots_for`), and no episode has more policy tokens than `max_turns` replies
  of `max_reply_tokens`, or more turns than `max_turns`;
- rewards and scores lie within +-`REWARD_LIMIT` (finite but extreme rewards give an infinite
  advantage scale);
- every behaviour logprob of a policy token is at least `LOGPROB_FLOOR`. A sampler draws a token of
  probability e^-100 once in 10^43 draws, so a lower value is not a sample: the group is rejected
  (not clamped), since a clamped value would still be a lie about the behaviour policy;
- it names the run's environment, and the actor that sent it.

Deviation from "clamp or reject": everything here rejects, with the reason, so an actor's author
sees exactly which value was wrong. Heartbeat stats are typed here too (`typed_stats`), and names
made printable (`printable`), so nothing an actor chooses reaches markup or number formatting raw.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

import numpy as np

from .codec import DEFAULT_LIMITS
from .messages import TrajectoryGroup

REWARD_LIMIT = 1e6
LOGPROB_FLOOR = -100.0

# What actors may report in heartbeats, and its type: anything else is dropped.
AGENT_STATS = ("rollouts_played", "rollout_failures", "trajectories_refused", "groups_dropped", "groups_short",
               "prompt_tokens", "prefill_tokens")
"""Counts an actor playing agent rollouts reports (totals over its life), summed in the run's final row."""
SAMPLING_STATS = ("groups_played", "groups_flat_skipped")
"""Groups an actor played, and of them the flat ones it did not send (dynamic sampling), summed likewise."""
NUMERIC_STATS = ("batches", "groups_per_batch", "gen_tokens_per_s", "peak_memory_gb", "groups_sent",
                 "groups_resent", "groups_unacked", *AGENT_STATS, *SAMPLING_STATS)
TEXT_STATS = {"device": 64}
FLAG_STATS = ("leaving",)
STAT_LIMIT = 1e15


@dataclass(frozen=True)
class GroupLimits:
    """The run's bounds on a group (built by the learner from its config and model)."""

    env: str
    group_size: int
    vocab_size: int
    max_tokens: int  # longest episode the engine can produce: one row's KV slots
    max_turns: int
    max_reply_tokens: int
    min_group_size: int = 0  # 0: exactly group_size episodes


def inbound_message_limit(limits: GroupLimits) -> int:
    """Bytes one whole message from an actor may have: a full group (nine bytes a token over its
    arrays: int32 ids, float32 logprobs, a bool mask, and as many int32 ids again for hints' teacher prompts) with room for the header, at least 4 MB.
    The gateway (gateway.py) enforces it over all frames together."""
    return max(4 << 20, 13 * limits.group_size * limits.max_tokens + DEFAULT_LIMITS.max_header_bytes + (64 << 10))


def group_problem(group: TrajectoryGroup, limits: GroupLimits, sender: str) -> str:
    """Why this group cannot be trained in this run ('' when it can)."""
    if group.actor != sender:
        return f"group names actor {printable(group.actor)!r} but was sent by {sender!r}"
    if group.env != limits.env:
        return f"group is from environment {printable(group.env)!r}, the run trains {limits.env!r}"
    episodes = len(group.lengths)
    smallest = limits.min_group_size or limits.group_size
    if not smallest <= episodes <= limits.group_size:
        return (f"group has {episodes} episodes, the run's group_size is {limits.group_size}"
                + (f" (at least {smallest})" if smallest < limits.group_size else ""))
    if len(group.tokens) and int(group.tokens.max()) >= limits.vocab_size:
        return f"token id {int(group.tokens.max())} is outside the vocabulary ({limits.vocab_size} ids)"
    if len(group.teacher_tokens) and int(group.teacher_tokens.max()) >= limits.vocab_size:
        return f"teacher token id {int(group.teacher_tokens.max())} is outside the vocabulary ({limits.vocab_size} ids)"
    if int(group.teacher_lengths.max()) > limits.max_tokens:
        return f"a hint's teacher prompt has {int(group.teacher_lengths.max())} tokens, more than the run allows " \
               f"({limits.max_tokens})"
    longest = int(group.lengths.max())
    if longest > limits.max_tokens:
        return f"an episode has {longest} tokens, more than the run allows ({limits.max_tokens})"
    if int(group.turns.max()) > limits.max_turns or int(group.turns.min()) < 0:
        return f"an episode has {int(group.turns.max())} turns, the run's max_turns is {limits.max_turns}"
    starts = np.concatenate([[0], np.cumsum(group.lengths[:-1], dtype=np.int64)])
    policy_per_episode = np.add.reduceat(group.policy_mask.astype(np.int64), starts)
    most = limits.max_turns * limits.max_reply_tokens
    if int(policy_per_episode.max()) > most:
        return f"an episode has {int(policy_per_episode.max())} sampled tokens, more than max_turns x " \
               f"max_reply_tokens ({most})"
    for name in ("rewards", "scores"):
        values = getattr(group, name)
        if len(values) and float(np.abs(values).max()) > REWARD_LIMIT:
            return f"{name} must lie within +-{REWARD_LIMIT:g}, got {float(np.abs(values).max()):g}"
    sampled = group.logprobs[group.policy_mask]
    if len(sampled) and float(sampled.min()) < LOGPROB_FLOOR:
        return f"a behaviour logprob is {float(sampled.min()):g}, below {LOGPROB_FLOOR:g}: not a sampled token"
    return ""


def printable(text: str, limit: int = 128) -> str:
    """Text with control and formatting characters replaced, markup brackets included, cut to `limit`."""
    out = []
    for char in str(text)[:limit]:
        category = unicodedata.category(char)
        out.append("?" if category[0] in "CZ" and char != " " or char in "[]\\" else char)
    return "".join(out)


def typed_stats(raw: dict) -> dict:
    """An actor's heartbeat stats, keeping only known keys with values of their type."""
    stats: dict = {}
    for key in NUMERIC_STATS:
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and 0 <= value <= STAT_LIMIT:
            stats[key] = value
    for key, limit in TEXT_STATS.items():
        if isinstance(raw.get(key), str):
            stats[key] = printable(raw[key], limit)
    for key in FLAG_STATS:
        if raw.get(key) is True:
            stats[key] = True
    return stats
