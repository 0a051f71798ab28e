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
    """One adapter version's cache rows (`rows`, one request per row), their cache and next-token logits.

    A row whose request has finished but whose conversation may go on is `parked`: it stays in the cache,
    fed nothing (a hole per decode step), so that the conversation's next turn is prefilled into it in place
    (`Scheduler` matches a prompt that extends its sequence) instead of its KV being copied out and back in."""

    version: int
    rows: list[Request] = field(default_factory=list)
    parked: dict[int, int] = field(default_factory=dict)  # row -> `forwards` when its request finished
    cache: RaggedCache | None = None
    logits: mx.array | None = None  # (rows, V)
    forwards: int = 0  # decode forwards this batch has run

    @property
    def running(self) -> list[Request]:
        """The requests still generating (every row but the parked ones)."""
        return [r for row, r in enumerate(self.rows) if row not in self.parked]
