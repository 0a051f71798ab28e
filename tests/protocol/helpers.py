"""Loopback fixtures for protocol tests: a hub serviced by a background thread, and groups."""

import threading
import time
import uuid

import numpy as np

from artmlx.protocol.hub import LearnerHub
from artmlx.protocol.messages import TrajectoryGroup
from artmlx.protocol.sockets import LearnerSocket


def wait_for(condition, *clients, timeout=10.0):
    """Pump the clients (or sleep) until condition() holds; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        for client in clients:
            client.pump(20)
        if not clients:
            time.sleep(0.02)
    return True


def make_group(fingerprint="fp", version=0, episodes=2, length=6, group_id=None):
    lengths = np.full(episodes, length, np.int32)
    n = int(lengths.sum())
    mask = np.tile(np.array([False] * (length - 2) + [True, True]), episodes)
    logprobs = np.where(mask, -0.5, 0.0).astype(np.float32)
    return TrajectoryGroup(
        group_id=group_id or uuid.uuid4().hex, actor="a", env="tictactoe", fingerprint=fingerprint, seed=1,
        policy_version=version, tokens=np.arange(n, dtype=np.int32) % 50, policy_mask=mask, logprobs=logprobs,
        lengths=lengths, rewards=np.linspace(0, 1, episodes).astype(np.float32),
        scores=np.ones(episodes, np.float32), turns=np.ones(episodes, np.int32),
        truncated=np.zeros(episodes, bool), outcomes=["win"] * episodes,
    )


RUNNING: list["HubThread"] = []  # stopped after each test (tests/conftest.py), even a failed one


class HubThread:
    """Runs hub.poll in a thread; groups that arrive are consumed as `trained` unless `hold`."""

    def __init__(self, bind="tcp://127.0.0.1:0", keys=None, hold=False, consumed=None, max_in_flight=4,
                 actor_timeout_s=10.0, **hub_options):
        self.socket = LearnerSocket(bind, keys=keys)
        self.hub = LearnerHub(self.socket, {"env": "tictactoe"}, "fp", max_in_flight=max_in_flight,
                              consumed=consumed, actor_timeout_s=actor_timeout_s, **hub_options)
        self.hold = hold
        self.received = []
        self.lock = threading.Lock()
        self.calls = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        RUNNING.append(self)

    @property
    def address(self):
        return self.socket.address

    def call(self, fn):
        """Run fn(hub) on the hub's thread (ZeroMQ sockets are not thread safe)."""
        done = threading.Event()
        result = {}
        self.calls.append((fn, done, result))
        done.wait(10)
        return result.get("value")

    def _run(self):
        while not self._stop.is_set():
            for info, group in self.hub.poll(20):
                with self.lock:
                    self.received.append(group)
                if not self.hold:
                    self.hub.consume(group.group_id, "trained")
            while self.calls:
                fn, done, result = self.calls.pop(0)
                result["value"] = fn(self.hub)
                done.set()

    def stop(self):
        if self in RUNNING:
            RUNNING.remove(self)
        self._stop.set()
        self.thread.join(5)
        self.socket.close()
