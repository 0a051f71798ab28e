"""The two socket ends: the learner's ROUTER (binds) and an actor's DEALER (connects).

One port carries everything. ROUTER gives the learner each actor's identity and lets it answer
that actor alone (welcome, acks, adapters); DEALER reconnects by itself when the learner comes
back. High-water marks bound every queue, `ZMQ_MAXMSGSIZE` caps what a peer may send, sends never
block (a full queue is reported, not waited on), and `close()` lingers briefly so shutdown never
hangs. Every received message is decoded strictly; a bad one is counted by reason, logged, and
dropped, and the endpoint keeps working.
"""

from __future__ import annotations

import collections
import logging
import os
import uuid
from pathlib import Path

import zmq

from .codec import DEFAULT_LIMITS, Limits, decode, encode
from .errors import ProtocolError, VersionMismatch
from .messages import Refuse
from .security import ZAP_DOMAIN, allowed_keys, is_loopback, secure_client, secure_server

log = logging.getLogger("artmlx.protocol")
LOUD_REJECTIONS = 20


class RejectionCounter:
    """Counts rejected messages by reason; logs the first few loudly, the rest at debug level."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reject(self, kind: str, detail: str, peer: str = "") -> None:
        self.counts[kind] += 1
        level = logging.WARNING if self.total <= LOUD_REJECTIONS else logging.DEBUG
        log.log(level, "rejected message%s (%s): %s [%d rejected so far]",
                f" from {peer}" if peer else "", kind, detail, self.total)


def _configure(socket: zmq.Socket, hwm: int, max_message_bytes: int, linger_ms: int) -> None:
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    socket.setsockopt(zmq.LINGER, linger_ms)


def default_io_threads() -> int:
    """ZeroMQ I/O threads for the learner: CURVE encrypts each actor's copy of an adapter on one of them."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


class LearnerSocket:
    def __init__(self, bind: str, keys: Path | None = None, insecure: bool = False, hwm: int = 256,
                 max_message_bytes: int = 256 << 20, limits: Limits = DEFAULT_LIMITS, linger_ms: int = 500,
                 io_threads: int = 0):
        if keys is None and not insecure and not is_loopback(bind):
            raise ValueError(
                f"refusing to bind {bind} without encryption: create keys with `artmlx keygen DIR` and pass "
                "--keys DIR, or pass --insecure to accept anyone on the network"
            )
        if keys is None and not is_loopback(bind):
            log.warning("INSECURE: %s accepts unauthenticated, unencrypted connections from the network", bind)
        self.context = zmq.Context(io_threads=io_threads or default_io_threads())
        self.socket = self.context.socket(zmq.ROUTER)
        _configure(self.socket, hwm, max_message_bytes, linger_ms)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.keys = Path(keys) if keys else None
        self.authenticator = secure_server(self.context, self.socket, self.keys) if keys else None
        self.allowed = allowed_keys(self.keys) if keys else set()
        self.key_of: collections.OrderedDict[bytes, str] = collections.OrderedDict()  # identity -> its CURVE key
        self.socket.bind(bind)
        self.address = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.limits = limits
        self.rejections = RejectionCounter()

    def receive(self, timeout_ms: int) -> tuple[bytes, object] | None:
        """Next valid message as (actor identity, message); None on timeout or rejection."""
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        frames = self.socket.recv_multipart(copy=False)
        identity = frames[0].bytes
        peer = identity.hex()[:16]
        if self.authenticator is not None and not self._key_matches(identity, _user_id(frames), peer):
            return None
        try:
            return identity, decode(frames[1:], self.limits)
        except VersionMismatch as error:
            self.rejections.reject("version", str(error), peer)
            self.send(identity, Refuse(reason=f"{error}; upgrade artmlx on both sides to the same version"))
        except ProtocolError as error:
            self.rejections.reject("malformed", str(error), peer)
        return None

    def _key_matches(self, identity: bytes, key: str | None, peer: str) -> bool:
        """The message's CURVE key is still allowed and is the one this identity first spoke with."""
        if key not in self.allowed:
            self.rejections.reject("revoked", f"key {str(key)[:12]}... is no longer allowed", peer)
            self.send(identity, Refuse(reason="this actor's key was revoked by the learner"))
            return False
        bound = self.key_of.setdefault(identity, key)
        self.key_of.move_to_end(identity)
        while len(self.key_of) > 65536:
            self.key_of.popitem(last=False)
        if bound != key:  # another key holder is trying to take over this actor's connection identity
            self.rejections.reject("impersonation", f"identity {peer} belongs to another key", peer)
            return False
        return True

    def reload_keys(self) -> int:
        """Re-read the allowed keys (revocation without restart); returns how many are allowed now."""
        if self.authenticator is None:
            return 0
        self.authenticator.configure_curve(domain=ZAP_DOMAIN, location=str(self.keys / "allowed"))
        self.allowed = allowed_keys(self.keys)
        return len(self.allowed)

    def send(self, identity: bytes, message, frames: list | None = None) -> bool:
        """Send without blocking; False if that actor is gone or its queue is full."""
        try:
            self.socket.send_multipart([identity, *(frames or encode(message))], flags=zmq.NOBLOCK, copy=False)
            return True
        except (zmq.Again, zmq.ZMQError):
            return False

    def close(self) -> None:
        self.socket.close()
        if self.authenticator:
            self.authenticator.stop()
        self.context.term()


def _user_id(frames) -> str | None:
    """The ZAP user id (the sender's CURVE public key) the message arrived with."""
    try:
        return frames[-1].get("User-Id")
    except (zmq.ZMQError, AttributeError):
        return None


class ActorSocket:
    def __init__(self, connect: str, keys: Path | None = None, actor_key: str = "actor", hwm: int = 256,
                 max_message_bytes: int = 256 << 20, limits: Limits = DEFAULT_LIMITS, linger_ms: int = 500):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        _configure(self.socket, hwm, max_message_bytes, linger_ms)
        self.socket.setsockopt(zmq.IDENTITY, uuid.uuid4().bytes)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self.socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # Queue only on live connections: what a dead learner never got is resent, not lost in a pipe.
        self.socket.setsockopt(zmq.IMMEDIATE, 1)
        if keys:
            secure_client(self.socket, keys, actor_key)
        self.socket.connect(connect)
        self.limits = limits
        self.rejections = RejectionCounter()

    def receive(self, timeout_ms: int):
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        frames = self.socket.recv_multipart(copy=False)
        try:
            return decode(frames, self.limits)
        except ProtocolError as error:
            self.rejections.reject("malformed", str(error), "learner")
            return None

    def send(self, message, frames: list | None = None) -> bool:
        try:
            self.socket.send_multipart(frames or encode(message), flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def close(self) -> None:
        self.socket.close()
        self.context.term()
