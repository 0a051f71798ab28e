"""What the learner hub needs from its socket (`HubTransport`), and the same in memory.

`sockets.LearnerSocket` is the real one: a gateway process owns the public ZeroMQ socket, CURVE and
message limits. `InMemoryTransport` keeps messages as objects in two queues, so the hub's logic
(sessions, admission, windows, acknowledgements, the ledger) runs in one process on plain data, a
message at a time, with nothing on the wire: what its unit tests drive and read back.
"""

from __future__ import annotations

import collections
from typing import Protocol

from .codec import decode
from .sockets import RejectionCounter


class HubTransport(Protocol):
    rejections: RejectionCounter
    kept: list | None  # the current adapter's frames, once `keep_adapter` was called

    def receive(self, timeout_ms: int) -> tuple[bytes, object] | None: ...

    def send(self, identity: bytes, message, frames: list | None = None) -> bool: ...

    def keep_adapter(self, frames: list) -> None: ...

    def send_adapter(self, identity: bytes) -> bool: ...

    def reload_keys(self) -> int: ...

    def close(self) -> None: ...


class InMemoryTransport:
    def __init__(self):
        self.rejections = RejectionCounter()
        self.kept: list | None = None
        self.inbound: collections.deque[tuple[bytes, object]] = collections.deque()
        self.outbound: list[tuple[bytes, object]] = []  # (identity, message), the adapter as its AdapterUpdate
        self.adapter = None

    def deliver(self, identity: bytes, message) -> None:
        """An actor's message, for the hub's next `poll`."""
        self.inbound.append((identity, message))

    def take(self, identity: bytes) -> list:
        """What the hub sent this actor since the last `take`, oldest first."""
        mine = [message for to, message in self.outbound if to == identity]
        self.outbound = [(to, message) for to, message in self.outbound if to != identity]
        return mine

    def receive(self, timeout_ms: int) -> tuple[bytes, object] | None:
        return self.inbound.popleft() if self.inbound else None

    def send(self, identity: bytes, message, frames: list | None = None) -> bool:
        self.outbound.append((identity, message))
        return True

    def keep_adapter(self, frames: list) -> None:
        self.kept = frames
        self.adapter = decode(frames)  # what an actor would read: the codec's strict decoding

    def send_adapter(self, identity: bytes) -> bool:
        self.outbound.append((identity, self.adapter))
        return True

    def reload_keys(self) -> int:
        return 0

    def close(self) -> None:
        self.inbound.clear()
