"""What the scheduler serves: one request (prompt, limits, what it sampled) and one adapter version's batch."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from .cache import RaggedCache
from .sampling import Options


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    stop_tokens: frozenset = frozenset()
    on_token: Callable[["Request"], None] | None = None
    stream: bool = False  # a client reads tokens as they come: its first one is read after one step, not a chunk
    options: Options = field(default_factory=Options)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per token, when `options.top_logprobs` > 0: the most likely (id, logprob) of its distribution."""
    finish_reason: str | None = None
    adapter_version: int = -1
    version: int | None = None  # the adapter version asked for; None: the newest when admitted
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class Batch:
    """The running requests of one adapter version, their cache and next-token logits."""

    version: int
    running: list[Request] = field(default_factory=list)
    cache: RaggedCache | None = None
    logits: mx.array | None = None  # (rows, V)
