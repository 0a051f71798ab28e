"""Flow control at the learner: how much each peer may put in front of it.

Windows (groups an actor may have sent and not had acknowledged):
- the size is `max_in_flight`: a number, or a function of the actors that loaded the model and
  the groups per batch this actor reports (capacity-based admission, `TrainConfig.resolved_max_in_flight`);
- while the learner is stalled (the next update lacks groups and none arrived or was consumed for
  `stall_s` of listening time), an actor's window grows to its waiting groups plus what the update
  lacks, and at least one of its batches (an actor waits for room for a whole batch before
  generating it): the actors that are producing can fill an update alone, so a silent actor's share
  returns to them within seconds instead of at its timeout;
- enforcement: an actor may have at most the largest window it was told in the last
  `WINDOW_GRACE_S` waiting (a window it was told may shrink before it hears the new one).

Mixed fleets: once every actor that loaded the model has delivered `RATE_MIN_GROUPS` groups in the
last `RATE_WINDOW_S`, each actor's share of an update (and so its window) is in proportion to the groups
per second the hub measured from it (not what it says of itself): an M1 next to an M4 Max holds fewer
groups in flight, so its groups are not older than the others'. Until then shares are equal.

Status requests: at most `STATUS_PER_S` answered a second in all and one per `STATUS_INTERVAL_S`
per client; the rest are dropped (the caller counts them).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

WINDOW_GRACE_S = 60.0  # longer than a batch takes: an actor submits a batch under the window it started with
TOLD_KEPT = 64  # one a heartbeat: covers WINDOW_GRACE_S
STATUS_PER_S = 20
STATUS_INTERVAL_S = 0.2
STATUS_CLIENTS_KEPT = 1024
RATE_WINDOW_S = 120.0
RATE_MIN_GROUPS = 4


def record_arrival(arrivals: collections.deque, now: float) -> None:
    """Remember that an actor's group arrived at `now` (monotonic seconds)."""
    arrivals.append(now)
    while arrivals and now - arrivals[0] > RATE_WINDOW_S:
        arrivals.popleft()


def group_rate(arrivals: collections.deque, now: float) -> float | None:
    """Groups per second an actor delivered lately; None until it has delivered enough to tell."""
    recent = [t for t in arrivals if now - t <= RATE_WINDOW_S]
    if len(recent) < RATE_MIN_GROUPS:
        return None
    return len(recent) / max(now - recent[0], 1.0)


def counted_as(rates: list[float | None], mine: float | None) -> float:
    """How many actors' worth an update is divided by for one actor's share: the sum of every producer's
    rate over its own when all are measured (a faster actor gets a larger share), else their number."""
    if mine is None or not rates or any(rate is None for rate in rates):
        return max(1, len(rates))
    return max(1.0, sum(rates) / mine)


class Windows:
    def __init__(self, max_in_flight: int | Callable[[int, int], int], groups_per_update: int = 0,
                 stall_s: float = 3.0):
        self.max_in_flight = max_in_flight
        self.groups_per_update = groups_per_update
        self.stall_s = stall_s
        self.last_progress = 0.0  # listening clock of the last group that arrived or was consumed

    def stalled(self, waiting: int, clock: float) -> bool:
        return (0 < self.groups_per_update and waiting < self.groups_per_update
                and clock - self.last_progress > self.stall_s)

    def size(self, producers: int, waiting: int, clock: float, actor=None) -> int:
        """The window of `actor` (an `ActorInfo`), or the plain rule's when None."""
        batch = actor.stats.get("groups_per_batch", 0) if actor is not None else 0
        batch = int(batch) if isinstance(batch, (int, float)) and 0 < batch < 1 << 16 else 0
        if callable(self.max_in_flight):
            window = max(1, int(self.max_in_flight(producers, batch)))
        else:
            window = self.max_in_flight
        if actor is not None and self.stalled(waiting, clock):
            window = max(window, actor.in_flight + max(self.groups_per_update - waiting, batch, 1))
        return window

    @staticmethod
    def tell(actor, window: int) -> int:
        """Record that `actor` is told `window` now; returns it."""
        now = time.monotonic()
        actor.told = [(t, w) for t, w in actor.told if now - t < WINDOW_GRACE_S][-TOLD_KEPT:] + [(now, window)]
        return window

    @staticmethod
    def allowance(actor, window: int) -> int:
        """Groups `actor` may have waiting: the largest of `window` and those it was told recently."""
        now = time.monotonic()
        return max([window] + [w for t, w in actor.told if now - t < WINDOW_GRACE_S])


class RequestRate:
    """Admits at most `per_s` requests a second in all, and one per `interval_s` per client."""

    def __init__(self, per_s: int = STATUS_PER_S, interval_s: float = STATUS_INTERVAL_S):
        self.per_s, self.interval_s = per_s, interval_s
        self.recent: collections.deque = collections.deque()
        self.last_by_client: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def allow(self, client: bytes) -> bool:
        now = time.monotonic()
        while self.recent and now - self.recent[0] > 1.0:
            self.recent.popleft()
        if len(self.recent) >= self.per_s or now - self.last_by_client.get(client, -1e9) < self.interval_s:
            return False
        self.recent.append(now)
        self.last_by_client[client] = now
        self.last_by_client.move_to_end(client)
        while len(self.last_by_client) > STATUS_CLIENTS_KEPT:
            self.last_by_client.popitem(last=False)
        return True
