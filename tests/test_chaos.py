"""Chaos: a real learner, two honest actor processes, and a client with a valid key misbehaving throughout."""

import threading
import time

import numpy as np
import pytest

from artmlx.metrics import read_metrics
from artmlx.protocol.codec import encode
from artmlx.protocol.messages import Ack, Heartbeat, Hello, StatusRequest, Welcome
from artmlx.protocol.sockets import ActorSocket
from tests.test_hostile_actor import poison
from tests.test_pipeline import learner_and_actors, train_rows


class Chaos(threading.Thread):
    """Cycles through misbehaviours until stopped; counts the groups the learner acknowledged to it."""

    def __init__(self, address):
        super().__init__(daemon=True)
        self.address, self.stop, self.acked, self.rounds, self.sent = address, threading.Event(), 0, 0, 0

    def join_run(self, socket, name):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.stop.is_set():
            socket.send(Hello(actor=name, host="[bold]x", artmlx_version="0"))
            reply = socket.receive(300)
            if isinstance(reply, Welcome):
                socket.send(Hello(actor=name, host="h", artmlx_version="0", fingerprint=reply.fingerprint))
                return reply
        return None

    def drain(self, socket, timeout_ms=50):
        message = socket.receive(timeout_ms)
        while message is not None:
            self.acked += isinstance(message, Ack)
            message = socket.receive(0)

    def run(self):
        main = ActorSocket(self.address)
        welcome = self.join_run(main, "chaos")
        if welcome is None:
            return
        size = welcome.run_config["group_size"]
        while not self.stop.is_set():
            self.rounds += 1
            for group in poison(welcome.fingerprint, size, vocab=151_936).values():  # poison, and beyond any window
                group.actor = "chaos"
                self.sent += main.send(None, frames=encode(group))
            main.send(Heartbeat(sender="chaos", session=welcome.session, stats={"groups_sent": "lots", "device": "[/]"}))
            for _ in range(200):  # a status flood
                main.send(StatusRequest())
            for index in range(5):  # hellos that never finish, and one that takes a share and goes silent
                stranger = ActorSocket(self.address, linger_ms=0)
                stranger.send(Hello(actor=f"ghost-{self.rounds}-{index}", host="h", artmlx_version="0"))
                stranger.receive(50)
                stranger.close()
            self.drain(main, 200)
        self.drain(main, 500)
        main.close()


@pytest.mark.slow
def test_training_goes_on_through_chaos(tmp_path):
    run = tmp_path / "run"
    address, learner, honest = learner_and_actors(run, 8, ["honest-0", "honest-1"])
    chaos = Chaos(address)
    chaos.start()
    try:
        output, _ = learner.communicate(timeout=900)
        chaos.stop.set()
        chaos.join(30)
        honest_outputs = [process.communicate(timeout=120)[0] for process in honest]
    finally:
        chaos.stop.set()
        for process in (learner, *honest):
            if process.poll() is None:
                process.kill()
    assert learner.returncode == 0, output
    assert chaos.rounds >= 1
    rows = train_rows(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in rows)
    final = read_metrics(run)[-1]
    assert final["stop_reason"] == "training finished after 8 updates"
    assert final["groups_trained"] == 8 * 4
    # The honest actors lost nothing to the chaos: none of their groups was rejected.
    for text in honest_outputs:
        assert "training finished" in text and "'rejected'" not in text, text
    # Ledger: the honest actors' groups balance; the chaos client's groups are the only
    # ones the learner settled without an actor reporting them as sent: at least those whose acks the
    # chaos client read, at most all it sent (acks of its last groups can die with the closing socket).
    assert -chaos.sent <= final["groups_unaccounted"] <= -chaos.acked, (final, chaos.acked, chaos.sent)
