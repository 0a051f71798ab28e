"""The learner's side of the protocol: who is connected, which groups are in, what to resend.

- Hello: version and fingerprint are checked (a mismatch is refused with the reason); the actor
  gets the run configuration, its flow-control window (`max_in_flight`: a number, or a function of
  the number of live actors and the groups per batch the actor reports, re-sent in every heartbeat
  reply as `window`, next to `share`, the groups of one update each live actor is asked for) and at
  once the current adapter, so a late or reconnecting actor never samples from a stale policy.
- TrajectoryGroup: a group id already consumed is acknowledged as `duplicate` and dropped; one
  already waiting is not queued twice; a group with a wrong fingerprint or a policy version from
  the future is rejected. A valid group is answered `Held` at once (the actor then never resends it
  while this session lasts, however long an update takes) and handed to the caller, who later calls
  `consume()` with trained/stale/rejected; only then is the actor acknowledged and its window slot
  freed, so a slow learner back-pressures actors instead of buffering without bound. Every group
  answered is counted once: `received` counts first arrivals (those settled at shutdown included),
  `duplicate` the copies.
- Heartbeat: updates the actor's liveness, policy version and stats; the reply carries this
  learner's session id (a new one after a restart tells actors to say hello and resend) and, if
  the actor is behind, the adapter follows. An actor silent for `actor_timeout_s` of the hub's
  listening time is dropped; anything later from it is answered with an empty session (REJOIN), on
  which it says hello again and resends its unacknowledged groups.
- shutdown(): actors are told to stop and must confirm (a heartbeat with `leaving`, carrying their
  final counts for `ledger()`) before the learner closes its socket; until then any message from
  them is answered with shutdown again. An actor that stops on its own (a signal) says `leaving`
  too and is let go at once, so a shutdown does not wait for it.
- publish(): one encoding of the adapter, sent to every live actor without blocking; an actor whose
  queue was full gets it on its next heartbeat.

Hardening (an actor with a valid key may be buggy or hostile):
- every group is checked against the run (`admission.group_problem`: group size, vocabulary,
  lengths, rewards, logprobs, env, sender); a bad one is rejected with the reason, acknowledged,
  counted, and never handed to the trainer;
- windows (`flow.Windows`): enforced, and grown while the learner waits for groups that do not
  come, so a silent actor's share returns to the others within seconds; shares count only actors
  that loaded the model;
- `poll` handles at most `POLL_MAX_MESSAGES` messages and returns at its deadline even under a
  flood; status requests are rate-limited (`flow.RequestRate`); the rest are dropped and counted;
- an actor gets the adapter only after a hello with the run's fingerprint (it loaded the model);
  at most `max_actors` are known at once (the oldest that never loaded the model makes room for a
  newcomer, so hello floods cannot lock actors out); departed actors' counts beyond `MAX_DEPARTED` are folded
  into one total (`sessions.Sessions`); consumed group ids are forgotten after `CONSUMED_KEPT_VERSIONS` versions (a
  resend of one is then dropped as stale instead of answered as a duplicate);
- names and stats are typed and made printable before anything stores or shows them.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Callable

from .admission import GroupLimits, group_problem, printable, typed_stats
from .codec import encode
from .flow import RequestRate, Windows, counted_as, group_rate, record_arrival
from .ledger import GroupBook
from .messages import (PROTOCOL_VERSION, Ack, AdapterUpdate, Heartbeat, Held, Hello, Refuse, Shutdown, StatusReply,
                       StatusRequest, TrajectoryGroup, Welcome)
from .sessions import ActorInfo, Sessions
from .sockets import Undelivered
from .transport import HubTransport

REJOIN = ""  # the session a learner answers an actor it does not know with
POLL_MAX_MESSAGES = 512
CONSUMED_KEPT_VERSIONS = 64  # about 64 updates' group ids: a resend after a long cut is still a duplicate


class LearnerHub:
    """The socket loop over the plain-data parts: `Sessions` (who is connected), `GroupBook` (which groups
    are held or settled, the counts), `flow.Windows` (admission windows) and `admission` (group checks)."""

    def __init__(self, socket: HubTransport, run_config: dict, fingerprint: str,
                 max_in_flight: int | Callable[[int, int], int] = 4,
                 actor_timeout_s: float = 60.0, consumed: dict[str, int] | set[str] | None = None,
                 share: Callable[[int], int] | None = None, limits: GroupLimits | None = None,
                 groups_per_update: int = 0, stall_s: float = 3.0, max_actors: int = 256):
        self.socket = socket
        self.run_config = run_config
        self.fingerprint = fingerprint
        self.windows = Windows(max_in_flight, groups_per_update, stall_s)
        self.status_rate = RequestRate()
        self.share = share
        self.actor_timeout_s = actor_timeout_s
        self.session = uuid.uuid4().hex
        self.sessions = Sessions(max_actors)
        self.book = GroupBook(consumed)  # group id -> the policy version it was sampled at, once settled
        self.limits = limits  # None: schema checks only (protocol unit tests); the learner always sets them
        self.policy_version = 0
        self.closing: str | None = None
        self.extra_status: dict = {}
        # Seconds spent inside poll(): silence is only held against an actor while the hub listened,
        # so a learner busy for longer than the timeout (a long eval) does not lose its actors.
        self._listened = 0.0
        self._poll_started: float | None = None

    @property
    def actors(self) -> dict[bytes, ActorInfo]:
        return self.sessions.actors

    @property
    def consumed(self) -> dict[str, int]:
        return self.book.consumed

    @property
    def waiting(self) -> dict[str, bytes]:
        return self.book.waiting

    @property
    def counts(self) -> collections.Counter:
        return self.book.counts

    def poll(self, timeout_ms: int) -> list[tuple[ActorInfo, TrajectoryGroup]]:
        """Handle traffic for up to `timeout_ms`; return the new groups that arrived."""
        self._poll_started = time.monotonic()
        deadline = self._poll_started + timeout_ms / 1000
        groups = []
        try:
            for _ in range(POLL_MAX_MESSAGES):  # a flood of messages cannot keep the learner in here
                remaining = max(0, int((deadline - time.monotonic()) * 1000))
                received = self.socket.receive(remaining if not groups else 0)
                if received is None:
                    break
                identity, message = received
                group = self._handle(identity, message)
                if group is not None:
                    groups.append(group)
                if time.monotonic() > deadline:
                    break
        finally:
            self._listened += time.monotonic() - self._poll_started
            self._poll_started = None
        self._expire()
        return groups

    def _heard(self, info: ActorInfo) -> None:
        info.last_seen, info.heard = time.monotonic(), self._listening_clock()

    def _listening_clock(self) -> float:
        inside = time.monotonic() - self._poll_started if self._poll_started is not None else 0.0
        return self._listened + inside

    def _handle(self, identity: bytes, message):
        if isinstance(message, Hello):
            if self.closing is not None:  # no (re)joining a run that is ending
                self.socket.send(identity, Shutdown(reason=self.closing))
            else:
                self._hello(identity, message)
            return None
        if isinstance(message, StatusRequest):
            if self.status_rate.allow(identity):
                self.socket.send(identity, StatusReply(state=self.status()))
            else:
                self.counts["status_dropped"] += 1
            return None
        info = self.sessions.get(identity)
        if isinstance(message, Undelivered):  # maybe an adapter: send it again at the next heartbeat
            if info is not None:
                info.adapter_sent = min(info.adapter_sent, info.policy_version)
            return None
        if info is None:
            # Unknown actor (this learner restarted, or it expired the actor): an empty session asks it
            # to say hello again and resend what it holds unacknowledged.
            self.counts["unknown_actor"] += 1
            self.socket.send(identity, Heartbeat(sender="learner", session=REJOIN,
                                                 policy_version=self.policy_version))
            return None
        self._heard(info)
        if isinstance(message, Heartbeat) and message.stats.get("leaving") is True:
            self.sessions.depart(identity, typed_stats(message.stats))  # at shutdown, or on its own (a signal): let it go
            return None
        if self.closing is not None:
            # Shutting down: every group is acknowledged (a copy of a consumed one as duplicate: its ack was
            # lost), so actors leave holding nothing.
            # (nothing is held by now: `shutdown` settled every waiting group before it set `closing`)
            if isinstance(message, TrajectoryGroup) and message.group_id in self.consumed:
                self.book.arrival(message.group_id, identity)  # a duplicate (settled earlier, if by another process)
                self.socket.send(identity, Ack(message.group_id, "duplicate", "already consumed"))
            elif isinstance(message, TrajectoryGroup):  # arrived too late to be trained: settle it
                self.counts["received"] += 1
                self.book.settle(message.group_id, "stale", message.policy_version)
                self.socket.send(identity, Ack(message.group_id, "stale", "the run ended before it was trained"))
            else:
                self.socket.send(identity, Shutdown(reason=self.closing))
            return None
        if isinstance(message, Heartbeat):
            info.policy_version = message.policy_version
            # a heartbeat sent before our Welcome reached the actor counts its ledger from an earlier session
            if message.session == self.session:
                info.stats = typed_stats(message.stats)
            admission = {"window": self.windows.tell(info, self.window(info))}
            if self.share is not None:
                admission["share"] = max(1, int(self.share(self.counted_as(info))))
            self.socket.send(identity, Heartbeat(sender="learner", session=self.session,
                                                 policy_version=self.policy_version, stats=admission))
            if info.loaded and info.adapter_sent < self.policy_version:
                self._send_adapter(info)
            return None
        if isinstance(message, TrajectoryGroup):
            return self._group(info, message)
        self.socket.rejections.reject("unexpected", f"{type(message).__name__} is not sent by actors", info.name)
        return None

    def _hello(self, identity: bytes, hello: Hello) -> None:
        reason = ""
        if hello.protocol_version != PROTOCOL_VERSION:
            reason = f"actor speaks protocol {hello.protocol_version}, learner {PROTOCOL_VERSION}"
        elif hello.fingerprint and hello.fingerprint != self.fingerprint:
            reason = (f"fingerprint mismatch: the actor loaded base model + LoRA layout {hello.fingerprint}, the "
                      f"learner trains {self.fingerprint}; give both the same model and LoRA settings")
        if reason:
            self.socket.rejections.reject("refused", reason, hello.actor)
            self.socket.send(identity, Refuse(reason=reason))
            return
        info, evicted = self.sessions.join(identity, printable(hello.actor), printable(hello.host), time.monotonic())
        self.counts["pending_evicted"] += evicted
        if info is None:
            reason = f"the learner already has {self.sessions.max_actors} actors (max_actors)"
            self.socket.rejections.reject("refused", reason, printable(hello.actor))
            self.socket.send(identity, Refuse(reason=reason))
            return
        self._heard(info)
        info.loaded = info.loaded or hello.fingerprint == self.fingerprint
        self.socket.send(identity, Welcome(session=self.session, run_config=self.run_config,
                                           fingerprint=self.fingerprint, policy_version=self.policy_version,
                                           max_in_flight=self.windows.tell(info, self.window(info)),
                                           actor_index=info.index))
        if info.loaded:
            self._send_adapter(info)  # only if this actor does not have the current one yet

    def _group(self, info: ActorInfo, group: TrajectoryGroup):
        seen = self.book.arrival(group.group_id, info.identity)
        if seen == "consumed":
            self.socket.send(info.identity, Ack(group.group_id, "duplicate", "already consumed"))
            return None
        if seen == "waiting":
            self.socket.send(info.identity, Held(group.group_id))
            return None
        reason = ""
        if not info.loaded:
            reason = "say hello with the run's fingerprint (after loading the model) before sending groups"
        elif group.fingerprint != self.fingerprint:
            reason = f"fingerprint {printable(group.fingerprint)} is not the run's {self.fingerprint}"
        elif group.policy_version > self.policy_version:
            reason = f"policy version {group.policy_version} is ahead of the learner's {self.policy_version}"
        elif info.in_flight >= self.windows.allowance(info, window := self.window(info)):
            reason = f"over its window: {info.in_flight} groups already waiting (window {window})"
        elif self.limits is not None:
            reason = group_problem(group, self.limits, info.name)
        if reason:
            self.book.settle(group.group_id, "rejected", group.policy_version)
            self.socket.rejections.reject("out_of_range", reason, info.name)
            self.socket.send(info.identity, Ack(group.group_id, "rejected", reason))
            return None
        self.book.hold(group.group_id, info.identity)
        self.socket.send(info.identity, Held(group.group_id))
        info.in_flight += 1
        record_arrival(info.arrivals, time.monotonic())
        self.windows.last_progress = self._listening_clock()
        return info, group

    def consume(self, group_id: str, status: str, reason: str = "", policy_version: int = 0) -> None:
        """The caller is done with a group (trained, stale, rejected): acknowledge it to its actor."""
        identity = self.book.settle(group_id, status, policy_version)
        self.windows.last_progress = self._listening_clock()  # progress: the stall clock starts again
        if identity is None:
            return
        info = self.sessions.get(identity)
        if info is not None:
            info.in_flight = max(0, info.in_flight - 1)
            info.trained += status == "trained"
        else:  # lost: its last report still holds this group as unacknowledged
            self.sessions.settle_departed(identity)
        self.socket.send(identity, Ack(group_id, status, reason))

    def window(self, info: ActorInfo | None = None) -> int:
        """An actor's flow-control window now (`flow.Windows`); the plain rule's without an actor."""
        producers = self.counted_as(info) if info is not None else self.sessions.producers()
        return self.windows.size(producers, len(self.waiting), self._listening_clock(), info)

    def counted_as(self, info: ActorInfo) -> float:
        """The producers this actor's share divides an update by: weighted by measured rates (`flow.counted_as`)."""
        now = time.monotonic()
        return counted_as([group_rate(a.arrivals, now) for a in self.sessions.loaded()],
                          group_rate(info.arrivals, now))

    def forget_consumed(self, before_version: int) -> int:
        return self.book.forget_consumed(before_version)

    def status(self) -> dict:
        """What `artmlx status` prints: counters, and per actor its version, liveness and stats."""
        now = time.monotonic()
        actors = [{"name": a.name, "host": a.host, "policy_version": a.policy_version, "in_flight": a.in_flight,
                   "seen_s_ago": round(now - a.last_seen, 1), "connected_s": round(now - a.joined, 1),
                   "loaded": a.loaded, "window": self.windows.allowance(a, 0), "trained": a.trained,
                   "groups_per_s": group_rate(a.arrivals, now), "stats": a.stats}
                  for a in self.actors.values()]
        return {"session": self.session, "policy_version": self.policy_version, "fingerprint": self.fingerprint,
                "window": self.window(), "waiting": len(self.waiting), "rejected_messages": self.socket.rejections.total,
                "counts": dict(self.counts), "actors": actors, **self.extra_status}

    def ledger(self) -> dict:
        """Where every group the actors sent ended up (`ledger.balance` says how it is reckoned)."""
        return self.sessions.ledger(self.counts)

    def actor_totals(self, keys) -> dict:
        """Each of `keys` summed over every actor's last stats, live or departed (only those that report it)."""
        return {key: sum(values) for key in keys if (values := self.sessions.reported(key))}

    def actor_memory(self) -> list[float]:
        """Peak memory (GB) each actor reported, live or departed."""
        return [round(float(peak), 3) for peak in self.sessions.reported("peak_memory_gb")]

    def publish(self, policy_version: int, tensors: dict) -> int:
        """Send a new adapter to every live actor; returns how many got it now."""
        self.policy_version = policy_version
        self.socket.keep_adapter(encode(AdapterUpdate(policy_version, tensors)))
        return sum(self._send_adapter(info) for info in list(self.actors.values()))

    def _send_adapter(self, info: ActorInfo) -> bool:
        if self.socket.kept is None or info.adapter_sent >= self.policy_version:
            return False
        if self.socket.send_adapter(info.identity):
            info.adapter_sent = self.policy_version
            return True
        return False

    def _expire(self) -> None:
        for identity in self.sessions.silent(self._listening_clock() - self.actor_timeout_s):
            self.counts["actors_lost"] += 1
            self.sessions.depart(identity, self.actors[identity].stats)

    def shutdown(self, reason: str, drain_s: float = 30.0) -> int:
        """Tell every actor to stop, and wait (up to `drain_s`) until each that loaded the model has said
        it is leaving; returns how many did not (their ledger counts are then a heartbeat old).

        ZeroMQ drops what a peer has not read yet when the connection closes, so the learner keeps
        its socket open until actors confirm. An actor in the middle of a long batch reads the
        shutdown only when the batch ends, hence the generous drain; its final counts (the ledger's
        sent groups) arrive with its confirmation. Groups still waiting will not be trained: they are
        acknowledged as stale first, so actors leave holding only what is still on the wire.
        """
        for group_id in list(self.waiting):
            self.consume(group_id, "stale", "the run ended before it was trained")
        self.closing = reason
        for info in self.actors.values():
            self.socket.send(info.identity, Shutdown(reason=reason))
        deadline = time.monotonic() + drain_s
        while any(info.loaded for info in self.actors.values()) and time.monotonic() < deadline:
            self.poll(50)
        return sum(1 for info in self.actors.values() if info.loaded)

