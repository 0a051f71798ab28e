"""The two socket ends: the learner's (through its gateway process) and an actor's DEALER.

One port carries everything. The learner's gateway (gateway.py) owns a ROUTER socket: it gives the
learner each actor's identity and lets it answer that actor alone (welcome, acks, adapters), and it
keeps every message from the wire out of the learner until it is whole and within its byte limit.
DEALER reconnects by itself when the learner (or its gateway) comes back. High-water marks bound
every queue, sends never block (a full queue is reported, not waited on), and `close()` lingers
briefly so shutdown never hangs. Every received message is decoded strictly; a bad one is counted by
reason, logged, and dropped, and the endpoint keeps working.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import zmq

from .codec import DEFAULT_LIMITS, Limits, decode, encode
from .errors import ProtocolError, VersionMismatch
from .messages import Refuse
from .gateway import CONTROL_FOLDER_PREFIX, CONTROL_HWM, EXIT_MEMORY, GatewaySettings
from .security import allowed_keys, is_loopback, secure_client, server_keys

log = logging.getLogger("artmlx.protocol")
LOUD_REJECTIONS = 20
GATEWAY_START_S = 30.0


class RejectionCounter:
    """Counts rejected messages by reason; logs the first few loudly, the rest at debug level."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reject(self, kind: str, detail: str, peer: str = "", times: int = 1) -> None:
        self.counts[kind] += times
        level = logging.WARNING if self.total <= LOUD_REJECTIONS else logging.DEBUG
        log.log(level, "rejected %s%s (%s): %s [%d rejected so far]", f"{times} messages" if times > 1 else "message",
                f" from {peer}" if peer else "", kind, detail, self.total)


def _configure(socket: zmq.Socket, hwm: int, max_message_bytes: int, linger_ms: int) -> None:
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    socket.setsockopt(zmq.LINGER, linger_ms)


def default_io_threads() -> int:
    """ZeroMQ I/O threads for the learner: CURVE encrypts each actor's copy of an adapter on one of them."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


@dataclass(frozen=True)
class Undelivered:
    """Not a wire message: the gateway could not queue what the learner sent this actor (gone, or its
    queue full); the hub then sends the adapter again at the actor's next heartbeat."""


class LearnerSocket:
    """The learner's end: a gateway process (gateway.py) owns the public socket; this talks to it.

    `max_message_bytes` bounds one whole message from an actor, all frames together. A gateway that
    dies (it resets itself when a peer's unfinished message grows past its memory limit) is started
    again on the same address at the next receive or send; `resets` counts that.
    """

    def __init__(self, bind: str, keys: Path | None = None, insecure: bool = False, hwm: int = 256,
                 max_message_bytes: int = 256 << 20, limits: Limits = DEFAULT_LIMITS, linger_ms: int = 500,
                 io_threads: int = 0, queue_bytes: int = 0, memory_limit: int = 0):
        if keys is None and not insecure and not is_loopback(bind):
            raise ValueError(
                f"refusing to bind {bind} without encryption: create keys with `artmlx keygen DIR` and pass "
                "--keys DIR, or pass --insecure to accept anyone on the network"
            )
        if keys is None and not is_loopback(bind):
            log.warning("INSECURE: %s accepts unauthenticated, unencrypted connections from the network", bind)
        self.keys = Path(keys) if keys else None
        if self.keys is not None:
            server_keys(self.keys)  # a key problem is told here, in the learner, not by the gateway
        self.allowed = allowed_keys(self.keys) if keys else set()
        self.key_of: collections.OrderedDict[bytes, str] = collections.OrderedDict()  # identity -> its CURVE key
        self.limits = limits
        self.rejections = RejectionCounter()
        self.resets = 0
        self._folder = tempfile.mkdtemp(prefix=CONTROL_FOLDER_PREFIX)  # 0700: only this user reaches the gateway
        self.context = zmq.Context()
        self.control = self.context.socket(zmq.PAIR)
        for option, value in ((zmq.SNDHWM, 0), (zmq.RCVHWM, CONTROL_HWM), (zmq.LINGER, linger_ms)):
            self.control.setsockopt(option, value)
        self.control.bind(f"ipc://{self._folder}/control")
        self.settings = GatewaySettings(
            bind=bind, control=f"ipc://{self._folder}/control", keys=str(self.keys or ""), hwm=hwm,
            message_limit=max_message_bytes, queue_bytes=queue_bytes or max(64 << 20, 4 * max_message_bytes),
            memory_limit=memory_limit or max(512 << 20, 8 * max_message_bytes),
            io_threads=io_threads or default_io_threads(), linger_ms=linger_ms)
        self.kept: list | None = None
        self.process: subprocess.Popen | None = None
        try:
            self.address = self._start()
        except BaseException:
            self._release()
            raise
        self.settings.bind = self.address  # a restarted gateway takes the same port

    def _start(self) -> str:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "artmlx.protocol.gateway", json.dumps(dataclasses.asdict(self.settings))],
            start_new_session=True)  # a Ctrl-C reaches the learner, which stops the gateway when it is done
        deadline = time.monotonic() + GATEWAY_START_S
        while time.monotonic() < deadline:
            if self.control.poll(100, zmq.POLLIN):
                frames = self.control.recv_multipart()
                if frames[0] == b"ready":
                    if self.kept is not None:
                        self._tell([b"keep", *self.kept])
                    return frames[1].decode()
                if frames[0] == b"error":
                    raise OSError(frames[1].decode())
                continue  # left by the gateway that went down: its actors resend
            if self.process.poll() is not None:
                break
        raise OSError(f"the gateway for {self.settings.bind} did not start (exit status {self.process.poll()})")

    def _check_gateway(self) -> None:
        code = self.process.poll()
        if code is None:
            return
        self.resets += 1
        why = ("a peer sent a message that never ends (memory limit)" if code == EXIT_MEMORY
               else f"it exited with status {code}")
        log.warning("the gateway on %s went down (%s); starting it again: actors reconnect by themselves",
                    self.address, why)
        self.rejections.reject("gateway_reset", why)
        self._start()

    def receive(self, timeout_ms: int) -> tuple[bytes, object] | None:
        """Next valid message as (actor identity, message), or (identity, Undelivered());
        None on timeout or rejection."""
        self._check_gateway()
        if not self.control.poll(timeout_ms, zmq.POLLIN):
            return None
        frames = self.control.recv_multipart(copy=False)
        kind, identity = frames[0].bytes, frames[1].bytes if len(frames) > 1 else b""
        peer = identity.hex()[:16]
        if kind == b"undelivered":
            return identity, Undelivered()
        if kind == b"dropped":
            times = frames[4].bytes.decode()
            self.rejections.reject(frames[2].bytes.decode(), frames[3].bytes.decode(), peer,
                                   int(times) if times.isdigit() else 1)
            return None
        if kind != b"message":
            return None
        if self.keys is not None and not self._key_matches(identity, frames[2].bytes.decode() or None, peer):
            return None
        try:
            return identity, decode(frames[3:], self.limits)
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
        if self.keys is None:
            return 0
        self.allowed = allowed_keys(self.keys)
        self._tell([b"reload-keys"])
        return len(self.allowed)

    def send(self, identity: bytes, message, frames: list | None = None) -> bool:
        """Hand a message for one actor to the gateway; an actor that is gone or whose queue is full
        comes back from `receive` as `Undelivered`."""
        self._check_gateway()
        return self._tell([b"send", identity, *(frames or encode(message))])

    def keep_adapter(self, frames: list) -> None:
        """Give the gateway the current adapter once; `send_adapter` then sends it to one actor."""
        self.kept = frames
        self._check_gateway()
        self._tell([b"keep", *frames])

    def send_adapter(self, identity: bytes) -> bool:
        self._check_gateway()
        return self._tell([b"send-kept", identity])

    def _tell(self, frames: list) -> bool:
        """To the gateway, never blocking (False in the moment between a gateway going down and its successor)."""
        try:
            self.control.send_multipart(frames, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None and self._tell([b"stop"]):
            try:
                self.process.wait(timeout=self.settings.linger_ms / 1000 + 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._release()

    def _release(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.control.close(linger=0)
        self.context.term()
        shutil.rmtree(self._folder, ignore_errors=True)


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
