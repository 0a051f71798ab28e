"""The actor's side of the protocol: hello, a bounded window of unacknowledged groups, resends.

The actor keeps every group it sent until the learner acknowledges it (trained, stale, rejected
or duplicate). At most `max_in_flight` (from the learner's Welcome, then the `window` in its
heartbeats) are unacknowledged at once; `submit()` waits for a free slot, so a slow learner slows
actors down. Heartbeats go out every
`heartbeat_s`; the learner answers with its session id. A different session id means the learner
restarted: the actor says hello again and resends every unacknowledged group (the learner drops
the ones it had already consumed). The learner answers a group it takes with `Held` at once and
with an `Ack` when it has consumed it; a group with neither for `RESEND_AFTER_S` is sent again (a
message or its answer may have died with a connection: a cut link, a reset), a held one never
while the session lasts (an update may take minutes). The learner answers a copy of a consumed
group with `duplicate` and a copy of one it holds with `Held`. On shutdown (the learner first
acknowledges every group it will not train) the actor waits `LEAVE_RESEND_S` after it heard the
shutdown (it may have been busy with a batch meanwhile) for the acks on their way, then resends what is still unacknowledged every `LEAVE_RESEND_S`, up to
`LEAVE_WAIT_S`, before it says it is leaving, so acks lost on the way (a reset link) do not remain
in its count and nothing settled is sent twice; an actor that stops on its own waits
(as long) for its groups' acks or the learner's shutdown, then says it is leaving. Adapter updates are conflated:
only the newest is kept.
"""

from __future__ import annotations

import collections
import socket as socketlib
import time

from .. import __version__
from .codec import encode
from .messages import Ack, AdapterUpdate, Heartbeat, Held, Hello, Refuse, Shutdown, TrajectoryGroup, Welcome
from .sockets import ActorSocket


MAX_WINDOW = 1 << 16  # a window the learner could sensibly ask for; anything else is ignored
RESEND_AFTER_S = 30.0
LEAVE_WAIT_S = 10.0
LEAVE_RESEND_S = 1.0


class ActorRefused(RuntimeError):
    """The learner refused this actor; the message says why."""


class LearnerGone(RuntimeError):
    """No answer from the learner within the timeout."""


class ActorClient:
    def __init__(self, socket: ActorSocket, name: str, heartbeat_s: float = 1.0):
        self.socket = socket
        self.name = name
        self.host = socketlib.gethostname()
        self.heartbeat_s = heartbeat_s
        self.fingerprint = ""
        self.welcome: Welcome | None = None
        self.session: str | None = None
        self.outbox: collections.OrderedDict[str, list] = collections.OrderedDict()
        self.unsent: set[str] = set()
        self.adapter: AdapterUpdate | None = None
        self.shutdown_reason: str | None = None
        self.policy_version = 0
        self.share: int | None = None  # groups of one update the learner asks of each actor
        self.stats: dict = {}
        self.acks = collections.Counter()
        self.sent = 0
        self.resent = 0
        # sent and resent to earlier learner sessions, and settled there: this session's ledger leaves them out
        self.sent_before = self.resent_before = 0
        self.sent_at: dict[str, float] = {}  # group id -> when it was last sent
        self.leave_by: float | None = None  # shutting down: say "leaving" when all is acked, or by then
        self.leave_resend_at = 0.0  # shutting down: when what is still unacknowledged is sent again
        self.left = False
        self._last_heartbeat = 0.0

    @property
    def window(self) -> int:
        return self.welcome.max_in_flight if self.welcome else 1

    def hello(self, fingerprint: str = "", timeout_s: float = 30.0) -> Welcome | None:
        """Introduce this actor and wait for the learner's Welcome (raises ActorRefused / LearnerGone).

        Returns None if the learner answers with shutdown instead (its run is ending)."""
        self.fingerprint = fingerprint or self.fingerprint
        self.welcome = None
        deadline = time.monotonic() + timeout_s
        next_try = 0.0
        while self.welcome is None and self.shutdown_reason is None:
            now = time.monotonic()
            if now > deadline:
                raise LearnerGone(f"no Welcome from the learner within {timeout_s:g} s; is it running and reachable?")
            if now >= next_try:
                self.socket.send(Hello(actor=self.name, host=self.host, artmlx_version=__version__,
                                       fingerprint=self.fingerprint))
                next_try = now + 0.25
            self.pump(100, answer_session=False)
        return self.welcome

    def wait_for_room(self, count: int = 1, timeout_s: float = 600.0) -> None:
        """Wait until `count` more groups fit in the window (at least one always fits an empty window)."""
        deadline = time.monotonic() + timeout_s
        while len(self.outbox) > max(0, self.window - count) and self.shutdown_reason is None:
            if time.monotonic() > deadline:
                raise LearnerGone(f"no acknowledgement from the learner within {timeout_s:g} s")
            self.pump(50)

    def submit(self, group: TrajectoryGroup, timeout_s: float = 600.0) -> None:
        """Send a group once a window slot is free; it is kept until acknowledged."""
        self.wait_for_room(1, timeout_s)
        if self.shutdown_reason is not None:
            return  # the learner is closing: a group sent now would go unanswered and break the ledger
        frames = encode(group)
        self.outbox[group.group_id] = frames
        self.sent_at[group.group_id] = time.monotonic()
        self.sent += 1
        if not self.socket.send(None, frames=frames):
            self.unsent.add(group.group_id)

    def pump(self, timeout_ms: int, answer_session: bool = True) -> None:
        """Handle incoming messages for up to `timeout_ms`; send a heartbeat and retries when due."""
        now = time.monotonic()
        if now - self._last_heartbeat >= self.heartbeat_s:
            self._last_heartbeat = now
            self._heartbeat()
        for group_id in list(self.unsent):
            if self.socket.send(None, frames=self.outbox[group_id]):
                self.unsent.discard(group_id)
        self._receive(0, answer_session)  # acks that came while we were busy first: they are not overdue
        overdue = [g for g in self.outbox if now - self.sent_at.get(g, now) > RESEND_AFTER_S]
        if overdue and self.shutdown_reason is None:
            self._resend(overdue)
        self._receive(timeout_ms, answer_session)
        if self.leave_by is not None and not self.left:
            if not self.outbox or time.monotonic() >= self.leave_by:
                self.left = True
                self._heartbeat(leaving=True)
            elif time.monotonic() >= self.leave_resend_at:  # acks on their way had LEAVE_RESEND_S to arrive
                self._resend_all()
                self.leave_resend_at = time.monotonic() + LEAVE_RESEND_S

    def _receive(self, timeout_ms: int, answer_session: bool) -> None:
        """Handle the first message to arrive within `timeout_ms`, then every one already waiting."""
        message = self.socket.receive(timeout_ms)
        while message is not None:
            self._handle(message, answer_session)
            message = self.socket.receive(0)

    def leave(self) -> None:
        """Once the learner said shutdown: wait (at most `LEAVE_WAIT_S`) until it was told we leave.

        Stopping on our own (a signal): first wait, at most `LEAVE_WAIT_S`, until what we sent is
        acknowledged or the learner says shutdown (on Ctrl-C it is stopping too), so the ledger
        settles; then say we leave, with the final counts."""
        deadline = time.monotonic() + LEAVE_WAIT_S
        while self.leave_by is None and self.outbox and self.session is not None and time.monotonic() < deadline:
            self.pump(50)
        while self.leave_by is not None and not self.left:
            self.pump(50)
        if not self.left and self.session is not None:
            self.left = True
            self._heartbeat(leaving=True)

    def _handle(self, message, answer_session: bool) -> None:
        if isinstance(message, Welcome):
            self.welcome = message
            if self.session is not None and message.session != self.session:
                # a new learner process: what the last one acknowledged is settled there, the rest goes again
                self.sent_before = self.sent - len(self.outbox)
                self._resend_all()
                self.resent_before = self.resent  # to this process these copies are first arrivals
            self.session = message.session
        elif isinstance(message, Refuse):
            raise ActorRefused(message.reason)
        elif isinstance(message, Held):  # the learner has it: keep it in the window, never resend it on a timer
            if message.group_id in self.outbox:
                self.sent_at.pop(message.group_id, None)
        elif isinstance(message, Ack):
            if self.outbox.pop(message.group_id, None) is not None:
                self.acks[message.status] += 1
                self.unsent.discard(message.group_id)
                self.sent_at.pop(message.group_id, None)
        elif isinstance(message, AdapterUpdate):
            if self.adapter is None or message.policy_version >= self.adapter.policy_version:
                self.adapter = message
        elif isinstance(message, Heartbeat):
            window, share = message.stats.get("window"), message.stats.get("share")
            if self.welcome is not None and isinstance(window, int) and 1 <= window <= MAX_WINDOW:
                self.welcome.max_in_flight = window  # the learner re-sizes windows as actors come and go
            if isinstance(share, int) and 1 <= share <= MAX_WINDOW:
                self.share = share
            if (answer_session and self.shutdown_reason is None and self.session is not None
                    and message.session != self.session):
                # The learner restarted (new session; Welcome resends) or forgot us (empty session, same
                # learner): introduce ourselves again and resend what it never acknowledged.
                previous = self.session
                self.hello()
                if self.session == previous:
                    self._resend_all()
        elif isinstance(message, Shutdown):
            if self.leave_by is None:  # the first: wait for acks on the way, reconcile the rest, then leave (pump)
                self.shutdown_reason = message.reason or "learner shut down"
                self.leave_by = time.monotonic() + LEAVE_WAIT_S
                self.leave_resend_at = time.monotonic() + LEAVE_RESEND_S
            elif self.left:  # the learner did not hear us leave: say it again
                self._heartbeat(leaving=True)

    def _heartbeat(self, **extra) -> None:
        self.socket.send(Heartbeat(sender=self.name, session=self.session or "", policy_version=self.policy_version,
                                   stats={**self.stats, **self.ledger(), **extra}))

    def ledger(self) -> dict:
        """This actor's side of the run's group ledger (see LearnerHub.ledger), since this learner session."""
        return {"groups_sent": self.sent - self.sent_before, "groups_resent": self.resent - self.resent_before,
                "groups_unacked": len(self.outbox)}

    def _resend_all(self) -> None:
        self._resend(list(self.outbox))

    def _resend(self, group_ids: list[str]) -> None:
        now = time.monotonic()
        for group_id in group_ids:
            self.resent += 1
            self.sent_at[group_id] = now
            if not self.socket.send(None, frames=self.outbox[group_id]):
                self.unsent.add(group_id)

    def take_adapter(self) -> AdapterUpdate | None:
        """The newest adapter received since the last call, if any."""
        adapter, self.adapter = self.adapter, None
        if adapter is not None:
            self.policy_version = adapter.policy_version
        return adapter
