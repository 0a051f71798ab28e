"""The messages actors and the learner exchange, with the schema each field must satisfy.

Every message travels in an envelope `{type, version, id, body}` (see `codec.py`); `version` is
`PROTOCOL_VERSION` and a peer with another version is refused. Arrays are numpy arrays on the wire
side (decoded zero-copy from their ZeroMQ frame); `codec.to_mlx` turns one into an MLX array.

Actor -> learner: Hello, TrajectoryGroup, Heartbeat.  Learner -> actor: Welcome, Refuse, Held, Ack,
AdapterUpdate, Shutdown.  Any client -> learner: StatusRequest, answered by StatusReply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

PROTOCOL_VERSION = 2  # 2: Held, the receipt of a group apart from its settlement (Ack)
NAME = ("str", 128)
GROUP_STATUSES = ("trained", "stale", "duplicate", "rejected")


@dataclass
class Hello:
    """An actor introduces itself. `fingerprint` is empty until it has loaded the run's model."""

    TYPE: ClassVar[str] = "hello"
    SCHEMA: ClassVar[dict] = {"actor": NAME, "host": NAME, "artmlx_version": ("str", 32),
                              "protocol_version": ("int", 0, 1 << 16), "fingerprint": ("str", 64)}
    actor: str
    host: str
    artmlx_version: str
    protocol_version: int = PROTOCOL_VERSION
    fingerprint: str = ""


@dataclass
class Welcome:
    """The learner accepts an actor: the run configuration it needs and its flow-control window."""

    TYPE: ClassVar[str] = "welcome"
    SCHEMA: ClassVar[dict] = {"session": ("str", 64), "run_config": ("dict",), "fingerprint": ("str", 64),
                              "policy_version": ("int", 0, 1 << 62), "max_in_flight": ("int", 1, 1 << 16),
                              "actor_index": ("int", 0, 1 << 30)}
    session: str
    run_config: dict
    fingerprint: str
    policy_version: int
    max_in_flight: int
    actor_index: int


@dataclass
class Refuse:
    """The learner refuses an actor (wrong version or fingerprint); the actor exits with `reason`."""

    TYPE: ClassVar[str] = "refuse"
    SCHEMA: ClassVar[dict] = {"reason": ("str", 1024)}
    reason: str


@dataclass
class TrajectoryGroup:
    """G episodes of one task, concatenated: episode i is tokens[offsets[i]:offsets[i+1]]."""

    TYPE: ClassVar[str] = "group"
    SCHEMA: ClassVar[dict] = {
        "group_id": ("str", 64), "actor": NAME, "env": NAME, "fingerprint": ("str", 64),
        "seed": ("int", 0, 1 << 62), "policy_version": ("int", 0, 1 << 62),
        "tokens": ("array", ("int32",), 1), "policy_mask": ("array", ("bool",), 1),
        "logprobs": ("array", ("float32",), 1), "lengths": ("array", ("int32",), 1),
        "rewards": ("array", ("float32",), 1), "scores": ("array", ("float32",), 1),
        "turns": ("array", ("int32",), 1), "truncated": ("array", ("bool",), 1),
        "outcomes": ("str_list", 32),
        "teacher_tokens": ("array", ("int32",), 1), "teacher_lengths": ("array", ("int32",), 1),
    }
    group_id: str
    actor: str
    env: str
    fingerprint: str
    seed: int
    policy_version: int
    tokens: np.ndarray
    policy_mask: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    rewards: np.ndarray
    scores: np.ndarray
    turns: np.ndarray
    truncated: np.ndarray
    outcomes: list
    teacher_tokens: np.ndarray | None = None  # directive hints: each hinted episode's teacher prompt, concatenated
    teacher_lengths: np.ndarray | None = None  # per episode: its teacher prompt's length, 0 without a hint

    def __post_init__(self):
        """No hints unless given (the wire always carries both arrays)."""
        if self.teacher_tokens is None:
            self.teacher_tokens = np.zeros(0, np.int32)
        if self.teacher_lengths is None:
            self.teacher_lengths = np.zeros(len(self.lengths), np.int32)

    def check(self) -> None:
        n, g = len(self.tokens), len(self.lengths)
        if g == 0:
            raise ValueError("group has no episodes")
        if len(self.policy_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"tokens ({n}), policy_mask ({len(self.policy_mask)}) and logprobs "
                             f"({len(self.logprobs)}) must have one length")
        for name in ("rewards", "scores", "turns", "truncated"):
            if len(getattr(self, name)) != g:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {g} episodes")
        if len(self.outcomes) != g:
            raise ValueError(f"outcomes has {len(self.outcomes)} entries for {g} episodes")
        if len(self.teacher_lengths) != g:
            raise ValueError(f"teacher_lengths has {len(self.teacher_lengths)} entries for {g} episodes")
        if (self.teacher_lengths < 0).any() or int(self.teacher_lengths.sum(dtype=np.int64)) != len(self.teacher_tokens):
            raise ValueError(f"teacher_lengths must be >= 0 and sum to the teacher token count {len(self.teacher_tokens)}")
        if (self.teacher_tokens < 0).any():
            raise ValueError("teacher token ids must be >= 0")
        if (self.lengths < 2).any() or int(self.lengths.sum(dtype=np.int64)) != n:
            raise ValueError(f"episode lengths must be >= 2 and sum to the token count {n}")
        if (self.tokens < 0).any():
            raise ValueError("token ids must be >= 0")
        if (self.logprobs > 1e-4).any():
            raise ValueError("logprobs must be <= 0")
        if (self.logprobs[~self.policy_mask] != 0).any():
            raise ValueError("logprobs must be 0 where the policy did not sample the token")


@dataclass
class Ack:
    """The learner has consumed a group (trained it or dropped it, with why); frees one window slot."""

    TYPE: ClassVar[str] = "ack"
    SCHEMA: ClassVar[dict] = {"group_id": ("str", 64), "status": ("choice", GROUP_STATUSES), "reason": ("str", 1024)}
    group_id: str
    status: str
    reason: str = ""


@dataclass
class Held:
    """The learner has a group and holds it until it is consumed (then its Ack): the actor keeps it in its
    window but does not send it again while this learner session lasts, however long the update takes."""

    TYPE: ClassVar[str] = "held"
    SCHEMA: ClassVar[dict] = {"group_id": ("str", 64)}
    group_id: str


@dataclass
class AdapterUpdate:
    """New adapter weights: the policy every actor should sample from."""

    TYPE: ClassVar[str] = "adapter"
    SCHEMA: ClassVar[dict] = {"policy_version": ("int", 0, 1 << 62), "tensors": ("tensors",)}
    policy_version: int
    tensors: dict


@dataclass
class Heartbeat:
    """Actor liveness and rates; the learner answers with its own heartbeat (session, version)."""

    TYPE: ClassVar[str] = "heartbeat"
    SCHEMA: ClassVar[dict] = {"sender": NAME, "session": ("str", 64), "policy_version": ("int", 0, 1 << 62),
                              "stats": ("dict",)}
    sender: str
    session: str = ""
    policy_version: int = 0
    stats: dict = field(default_factory=dict)


@dataclass
class Shutdown:
    """Stop: the run is over or the learner is going away."""

    TYPE: ClassVar[str] = "shutdown"
    SCHEMA: ClassVar[dict] = {"reason": ("str", 1024)}
    reason: str = ""


@dataclass
class StatusRequest:
    """Anyone with access (keys, if the learner uses them) may ask for the learner's state."""

    TYPE: ClassVar[str] = "status"
    SCHEMA: ClassVar[dict] = {"sender": NAME}
    sender: str = "status"


@dataclass
class StatusReply:
    """The learner's state: step, policy version, counters, and the connected actors."""

    TYPE: ClassVar[str] = "status_reply"
    SCHEMA: ClassVar[dict] = {"state": ("dict",)}
    state: dict


MESSAGE_TYPES: dict[str, type] = {
    cls.TYPE: cls for cls in (Hello, Welcome, Refuse, TrajectoryGroup, Held, Ack, AdapterUpdate, Heartbeat,
                              Shutdown, StatusRequest, StatusReply)
}
Message = Any
