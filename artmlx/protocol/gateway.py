"""The learner's front door: a small process of its own that owns the public socket.

Why a process: ZeroMQ hands a multipart message over only when all of it has arrived, and
`ZMQ_MAXMSGSIZE` bounds one frame, not a message. A peer that sends frame after frame (with a valid
key, or anyone where CURVE is off) makes the process that owns the socket assemble any number of
bytes, and no socket option bounds that. The gateway is that process; the learner never holds more
of one actor message than `message_limit`:

- every complete message is measured; one over `message_limit` is dropped and reported;
- messages wait for the learner in a queue bounded in bytes (`queue_bytes`, each message costing
  `MESSAGE_OVERHEAD` more) and in count (`MAX_QUEUED`); they leave it one per sender in turn, so a
  flood from one sender delays nobody else; when it is full the sender with the most queued loses
  its newest message, reported (actors resend what was not acknowledged);
- the gateway watches its own resident memory; past `memory_limit` over what it used after binding
  (plus room for eight adapters) an unfinished message is growing: it exits with `EXIT_MEMORY`, and
  the learner starts a new one on the same address. Every connection is dropped with it (the
  offender's included: ZeroMQ does not say which connection a partial message belongs to), honest
  actors reconnect by themselves and resend what was not acknowledged. An attacker with a valid key
  can repeat this (a pause of about half a second for everyone each time); the learner logs each
  reset, and the remedy is revoking keys (SIGHUP), found by elimination: ZeroMQ names no key either.
- CURVE authentication (ZAP) runs here; the sender's public key travels with each message so the
  learner can check it against the allowed keys and bind it to the sender's identity (sockets.py).
- The current adapter is sent here once and fanned out from here: one copy, shared by every queue.

Learner <-> gateway: a PAIR socket over ipc in a private (0700) folder, frames led by a kind:
    to the gateway    send ID FRAMES... | keep FRAMES... (the adapter) | send-kept ID | reload-keys | stop
    from the gateway  ready ADDRESS | error TEXT | message ID KEY FRAMES... | undelivered ID
                      | dropped ID KIND TEXT COUNT
The gateway leaves when told, when its learner is gone (its parent changed), or when it cannot
bind (it says why first).
"""

from __future__ import annotations

import collections
import json
import os
import resource
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from .security import ZAP_DOMAIN, secure_server

EXIT_MEMORY = 3
CONTROL_FOLDER_PREFIX = "artmlx-gateway-"  # the learner's folder for the control socket (sockets.py)
POLL_MS = 20
BATCH = 256  # messages handled per socket per turn, so neither side starves the other
CONTROL_HWM = 16  # messages buffered between the processes, each at most message_limit bytes
REPORT_EVERY_S = 1.0
MAX_REPORTS = 1024  # senders named in one round of drop reports; the rest are counted together
MAX_QUEUED = 4096  # messages waiting for the learner, whatever their size
MESSAGE_OVERHEAD = 4096  # what a queued message costs besides its bytes (Python and ZeroMQ objects)


@dataclass
class GatewaySettings:
    """What the learner tells its gateway (JSON on the command line)."""

    bind: str
    """Public address to bind (tcp://HOST:PORT; port 0 picks one, reported back with `ready`)."""
    control: str
    """The learner's private ipc address."""
    keys: str = ""
    """CURVE keys folder (`artmlx keygen`); empty: no encryption (loopback or --insecure)."""
    hwm: int = 256
    """High-water mark of the public socket, per connection."""
    message_limit: int = 256 << 20
    """Bytes one whole message may have, all frames together (ZMQ_MAXMSGSIZE gets the same for one frame)."""
    queue_bytes: int = 256 << 20
    """Bytes of complete messages that may wait for a busy learner."""
    memory_limit: int = 1 << 30
    """Resident bytes the gateway may grow by after binding (plus eight adapters) before it resets."""
    io_threads: int = 1
    """ZeroMQ I/O threads (CURVE encrypts each actor's copy of an adapter on one of them)."""
    linger_ms: int = 500
    """How long a closing gateway keeps delivering what is queued."""


def resident_bytes() -> int:
    """This process's resident memory (Linux: now; elsewhere: its peak, which only ever grows)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class Gateway:
    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self.context = zmq.Context(io_threads=settings.io_threads)
        self.control = self.context.socket(zmq.PAIR)
        for option, value in ((zmq.SNDHWM, CONTROL_HWM), (zmq.RCVHWM, 0), (zmq.LINGER, settings.linger_ms)):
            self.control.setsockopt(option, value)
        self.control.connect(settings.control)
        self.public: zmq.Socket | None = None
        self.authenticator = None
        # Messages waiting for the learner, per sender in the order they take turns: (frames, cost).
        self.queues: collections.OrderedDict[bytes, collections.deque] = collections.OrderedDict()
        self.queued: collections.Counter = collections.Counter()  # sender -> cost of what it has queued
        self.queued_bytes = 0
        self.queued_count = 0
        self.adapter: list = []
        self.adapter_bytes = 0
        self.unreported: dict[tuple[bytes, str], tuple[int, str]] = {}  # (sender, kind) -> (count, last text)
        self.reported_at = 0.0
        self.parent = os.getppid()

    def listen(self) -> None:
        settings = self.settings
        self.public = self.context.socket(zmq.ROUTER)
        for option, value in ((zmq.SNDHWM, settings.hwm), (zmq.RCVHWM, settings.hwm),
                              (zmq.MAXMSGSIZE, settings.message_limit), (zmq.LINGER, settings.linger_ms),
                              (zmq.ROUTER_MANDATORY, 1), (zmq.ROUTER_HANDOVER, 1)):
            self.public.setsockopt(option, value)
        if settings.keys:
            self.authenticator = secure_server(self.context, self.public, Path(settings.keys))
        self.public.bind(settings.bind)
        self.address = self.public.getsockopt_string(zmq.LAST_ENDPOINT)
        self.baseline = resident_bytes()

    def run(self) -> int:
        self.control.send_multipart([b"ready", self.address.encode()])
        poller = zmq.Poller()
        poller.register(self.public, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        while True:
            poller.modify(self.control, zmq.POLLIN | (zmq.POLLOUT if self.queues else 0))
            events = dict(poller.poll(POLL_MS))
            if self.control in events and not self._from_learner():
                return 0
            if self.public in events:
                self._from_actors()
            self._forward()
            self._send_reports()
            if self._over_memory():
                return EXIT_MEMORY
            if os.getppid() != self.parent:  # the learner is gone (killed outright)
                self._remove_control_folder()
                return 0

    def _from_actors(self) -> None:
        for _ in range(BATCH):
            try:
                frames = self.public.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, payload = frames[0].bytes, frames[1:]
            size = sum(len(frame) for frame in payload)
            if size > self.settings.message_limit:
                self._report(identity, "oversized", f"a message of {len(payload)} frames and {size} bytes, "
                                                    f"over the limit of {self.settings.message_limit}")
                continue
            key = _user_id(payload[-1]) if payload else ""
            self._enqueue(identity, [b"message", identity, key.encode(), *payload], size + MESSAGE_OVERHEAD)

    def _enqueue(self, identity: bytes, frames: list, cost: int) -> None:
        """Queue for the learner; when full, the sender with the most queued loses its newest message."""
        while self.queued_bytes + cost > self.settings.queue_bytes or self.queued_count >= MAX_QUEUED:
            largest = max(self.queues, key=lambda sender: self.queued[sender], default=None)
            if largest is None or self.queued[largest] <= self.queued[identity] + cost:
                self._report(identity, "learner_busy", "message dropped: the queue to the learner is full")
                return
            _, dropped_cost = self.queues[largest].pop()
            self._dequeued(largest, dropped_cost)
            self._report(largest, "learner_busy", "message dropped: the queue to the learner is full")
        self.queues.setdefault(identity, collections.deque()).append((frames, cost))
        self.queued[identity] += cost
        self.queued_bytes += cost
        self.queued_count += 1

    def _dequeued(self, identity: bytes, cost: int) -> None:
        self.queued[identity] -= cost
        self.queued_bytes -= cost
        self.queued_count -= 1
        if not self.queues[identity]:
            del self.queues[identity], self.queued[identity]

    def _forward(self) -> None:
        """One message per sender in turn, so a flooding sender does not delay the others."""
        while self.queues:
            identity = next(iter(self.queues))
            frames, cost = self.queues[identity][0]
            try:
                self.control.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.queues[identity].popleft()
            self._dequeued(identity, cost)
            if identity in self.queues:
                self.queues.move_to_end(identity)

    def _from_learner(self) -> bool:
        """Carry out what the learner asks; False when it asks the gateway to stop."""
        for _ in range(BATCH):
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            kind = frames[0].bytes
            if kind == b"send":
                self._send(frames[1].bytes, frames[2:])
            elif kind == b"send-kept":
                self._send(frames[1].bytes, self.adapter)
            elif kind == b"keep":
                self.adapter = frames[1:]
                self.adapter_bytes = sum(len(frame) for frame in self.adapter)
            elif kind == b"reload-keys" and self.authenticator is not None:
                allowed = str(Path(self.settings.keys) / "allowed")
                self.authenticator.configure_curve(domain=ZAP_DOMAIN, location=allowed)
            elif kind == b"stop":
                return False
        return True

    def _send(self, identity: bytes, frames: list) -> None:
        try:
            self.public.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
        except (zmq.Again, zmq.ZMQError):
            self._tell([b"undelivered", identity])

    def _report(self, identity: bytes, kind: str, text: str) -> None:
        """Count a dropped message; the counts go to the learner once a second (`_send_reports`), so a
        flood of bad messages does not become a flood of notices."""
        key = (identity, kind) if len(self.unreported) < MAX_REPORTS else (b"", kind)
        count, _ = self.unreported.get(key, (0, ""))
        self.unreported[key] = (count + 1, text)

    def _send_reports(self) -> None:
        if not self.unreported or time.monotonic() < self.reported_at + REPORT_EVERY_S:
            return
        self.reported_at = time.monotonic()
        for (identity, kind), (count, text) in self.unreported.items():
            self._tell([b"dropped", identity, kind.encode(), text.encode(), str(count).encode()])
        self.unreported.clear()

    def _tell(self, frames: list) -> None:
        try:
            self.control.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # the learner is behind; the actor will resend, or the notice was only news
            pass

    def _over_memory(self) -> bool:
        grown = resident_bytes() - self.baseline
        if grown <= self.settings.memory_limit + 8 * self.adapter_bytes:
            return False
        print(f"artmlx gateway: resident memory grew by {grown >> 20} MB, over its limit "
              f"({self.settings.memory_limit >> 20} MB + 8 adapters): a peer is sending a message that never "
              "ends; resetting every connection", file=sys.stderr, flush=True)
        return True

    def _remove_control_folder(self) -> None:
        """The learner removes the folder of the control socket when it stops; a learner killed outright
        cannot, so its gateway does (only a folder the learner made: `LearnerSocket`'s prefix)."""
        folder = Path(self.settings.control.removeprefix("ipc://")).parent
        if folder.name.startswith(CONTROL_FOLDER_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        if self.public is not None:
            self.public.close()
        self.control.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        self.context.term()


def _user_id(frame) -> str:
    """The ZAP user id (the sender's CURVE public key) a message arrived with; '' without CURVE."""
    try:
        return frame.get("User-Id") or ""
    except (zmq.ZMQError, AttributeError):
        return ""


def main(argv: list[str]) -> int:
    gateway = Gateway(GatewaySettings(**json.loads(argv[0])))
    try:
        try:
            gateway.listen()
        except (zmq.ZMQError, OSError, ValueError) as error:  # cannot bind, or bad keys: say why, then leave
            gateway.control.send_multipart([b"error", f"cannot listen on {gateway.settings.bind}: {error}".encode()])
            return 2
        return gateway.run()
    finally:
        gateway.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
