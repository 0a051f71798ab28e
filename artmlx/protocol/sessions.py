"""Who is connected to the learner: known actors and the last counts of those that left (plain data, no I/O).

- At most `max_actors` are known at once; when full, the oldest actor that never loaded the model makes
  room for a newcomer (a flood of hellos cannot lock honest actors out).
- An actor that leaves, or is lost, keeps its last stats for the ledger; beyond `MAX_DEPARTED` departed
  actors the oldest ones' ledger counts are folded into one total.
- Silence is measured on the hub's listening clock (seconds spent inside `poll`), which the caller passes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .ledger import balance

MAX_DEPARTED = 1024
LEDGER_KEYS = ("groups_sent", "groups_resent", "groups_unacked")


@dataclass
class ActorInfo:
    identity: bytes
    name: str
    host: str
    index: int
    joined: float
    last_seen: float
    policy_version: int = 0
    adapter_sent: int = -1
    stats: dict = field(default_factory=dict)
    in_flight: int = 0
    heard: float = 0.0  # the hub's listening clock when this actor was last heard
    loaded: bool = False  # said hello with the run's fingerprint: it has the model and may get adapters
    told: list = field(default_factory=list)  # (time, window) told recently, for enforcing the window
    arrivals: collections.deque = field(default_factory=collections.deque)  # when its groups came (flow.group_rate)
    trained: int = 0


class Sessions:
    def __init__(self, max_actors: int = 256):
        self.max_actors = max_actors
        self.actors: dict[bytes, ActorInfo] = {}
        self.departed: dict[bytes, dict] = {}  # last stats of actors that left or were lost, for the ledger
        self.departed_totals: collections.Counter = collections.Counter()  # of those beyond MAX_DEPARTED
        self._next_index = 0

    def get(self, identity: bytes) -> ActorInfo | None:
        return self.actors.get(identity)

    def join(self, identity: bytes, name: str, host: str, now: float) -> tuple[ActorInfo | None, int]:
        """The actor saying hello (known, or added): None when `max_actors` are known and none can make room.
        Also returns how many never-loaded actors were forgotten to make room (0 or 1)."""
        info = self.actors.get(identity)
        if info is not None:
            return info, 0
        evicted = 0
        if len(self.actors) >= self.max_actors:
            # one evicted while loading is simply welcomed again at its next hello
            pending = next((key for key, known in self.actors.items() if not known.loaded), None)
            if pending is None:
                return None, 0
            del self.actors[pending]
            evicted = 1
        info = ActorInfo(identity, name, host, self._next_index, now, now)
        self._next_index += 1
        self.actors[identity] = info
        self.departed.pop(identity, None)  # an expired actor rejoining: its counts are current again
        return info, evicted

    def depart(self, identity: bytes, stats: dict) -> None:
        """The actor left (or was lost): forget it, keep its last stats for the ledger."""
        self.actors.pop(identity, None)
        self.departed.pop(identity, None)
        self.departed[identity] = stats
        while len(self.departed) > MAX_DEPARTED:
            oldest = next(iter(self.departed))
            self.departed_totals.update({k: v for k, v in self.departed.pop(oldest).items() if k in LEDGER_KEYS})

    def silent(self, cutoff: float) -> list[bytes]:
        """Actors last heard before `cutoff` on the listening clock."""
        return [identity for identity, info in self.actors.items() if info.heard < cutoff]

    def loaded(self) -> list[ActorInfo]:
        return [info for info in self.actors.values() if info.loaded]

    def producers(self) -> int:
        """Actors that loaded the model (the ones that can produce groups), at least 1."""
        return max(1, len(self.loaded()))

    def settle_departed(self, identity: bytes) -> None:
        """A lost actor's group was settled: its last report still holds that group as unacknowledged."""
        stats = self.departed.get(identity)
        if stats is not None:
            stats["groups_unacked"] = max(0, int(stats.get("groups_unacked", 0)) - 1)

    def reported(self, key: str) -> list:
        """`key` from the last stats of every actor, departed or live, that reported it (stats are typed on
        receipt, `admission.typed_stats`: numeric keys hold finite non-negative numbers)."""
        return [stats[key] for stats in (*self.departed.values(), *(info.stats for info in self.actors.values()))
                if key in stats]

    def ledger(self, counts: dict) -> dict:
        """Where every group the actors sent ended up (`ledger.balance` says how it is reckoned)."""
        sent, in_flight, resent = (int(self.departed_totals.get(key, 0) + sum(self.reported(key)))
                                   for key in ("groups_sent", "groups_unacked", "groups_resent"))
        return balance(sent, resent, in_flight, counts)
