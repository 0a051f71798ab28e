"""The hub against actors that misbehave with a valid key, over real loopback sockets."""

import threading

import numpy as np

import io

from rich.console import Console

from artmlx.apps.learner_view import render
from artmlx.protocol.client import ActorClient
from artmlx.protocol.codec import encode
from artmlx.protocol.messages import Ack, Heartbeat, Hello, StatusRequest, Welcome
from artmlx.protocol.sockets import ActorSocket
from artmlx.protocol.status import format_status
from tests.protocol.helpers import HubThread, make_group, wait_for


def raw_actor(hub, name="a", fingerprint="fp"):
    """A socket that has said hello with the run's fingerprint and read its Welcome."""
    socket = ActorSocket(hub.address)
    for _ in range(100):
        socket.send(Hello(actor=name, host="h", artmlx_version="0", fingerprint=fingerprint))
        reply = socket.receive(100)
        while reply is not None and not isinstance(reply, Welcome):
            reply = socket.receive(100)
        if isinstance(reply, Welcome):
            return socket, reply
    raise AssertionError("no welcome")


def acks(socket, timeout_ms=200):
    out = []
    message = socket.receive(timeout_ms)
    while message is not None:
        if isinstance(message, Ack):
            out.append(message)
        message = socket.receive(timeout_ms)
    return out


def test_groups_beyond_the_window_are_refused_not_buffered():
    hub = HubThread(hold=True, max_in_flight=2)
    socket, welcome = raw_actor(hub)
    assert welcome.max_in_flight == 2
    for _ in range(10):  # a client that ignores its window
        socket.send(None, frames=encode(make_group()))
    refused = []
    assert wait_for(lambda: refused.extend(a for a in acks(socket, 50) if a.status == "rejected") or len(refused) == 8)
    assert all("over its window" in a.reason for a in refused)
    assert len(hub.received) == 2 and hub.call(lambda h: len(h.waiting)) == 2
    socket.close()
    hub.stop()


def test_a_silent_actor_share_returns_to_the_producing_one():
    """Windows grow when the learner waits: one producing actor can fill the update alone."""
    hub = HubThread(hold=True, max_in_flight=lambda actors, batch: 2, groups_per_update=6, stall_s=0.5)
    silent, _ = raw_actor(hub, "silent")  # says hello, then nothing: it holds a share it never fills
    client = ActorClient(ActorSocket(hub.address), "busy", heartbeat_s=0.1)
    client.hello("fp")
    for _ in range(6):
        client.submit(make_group(), timeout_s=20)  # the last four fit only once the window has grown
    assert wait_for(lambda: len(hub.received) == 6, client)
    assert client.window >= 6
    silent.close()
    client.socket.close()
    hub.stop()


def test_status_floods_cannot_keep_the_learner_from_its_actors():
    hub = HubThread(hold=False)
    stop = threading.Event()

    def flood():
        socket = ActorSocket(hub.address)
        while not stop.is_set():
            socket.send(StatusRequest())
            socket.receive(0)
        socket.close()

    flooders = [threading.Thread(target=flood, daemon=True) for _ in range(2)]
    for thread in flooders:
        thread.start()
    client = ActorClient(ActorSocket(hub.address), "a")
    client.hello("fp")
    for _ in range(5):
        client.submit(make_group(), timeout_s=30)
    assert wait_for(lambda: len(hub.received) == 5 and not client.outbox, client, timeout=30)
    stop.set()
    for thread in flooders:
        thread.join(5)
    assert hub.call(lambda h: h.counts["status_dropped"]) > 0
    client.socket.close()
    hub.stop()


def test_adapters_go_only_to_actors_that_loaded_the_model():
    hub = HubThread()
    hub.call(lambda h: h.publish(1, {"w": np.ones((4, 4), np.float32)}))
    client = ActorClient(ActorSocket(hub.address), "a", heartbeat_s=0.05)
    client.hello("")  # before loading the model: configuration only
    assert not wait_for(lambda: client.adapter is not None, client, timeout=1.0)
    client.hello("fp")
    assert wait_for(lambda: client.adapter is not None, client)
    client.socket.close()
    hub.stop()


def test_a_heartbeat_from_before_the_actors_welcome_does_not_set_its_ledger_counts():
    """After a learner restart an actor may send one heartbeat of its old session (counting from that session)
    before it reads the new Welcome: the ledger takes counts only from heartbeats of this session."""
    hub = HubThread()
    socket, welcome = raw_actor(hub)
    socket.send(Heartbeat(sender="a", session="an-earlier-session", policy_version=7, stats={"groups_sent": 50}))
    assert wait_for(lambda: hub.call(lambda h: h.status()["actors"][0]["policy_version"]) == 7)  # it was read
    assert hub.call(lambda h: h.ledger())["groups_sent"] == 0
    socket.send(Heartbeat(sender="a", session=welcome.session, policy_version=0, stats={"groups_sent": 2}))
    assert wait_for(lambda: hub.call(lambda h: h.ledger())["groups_sent"] == 2)
    socket.close()
    hub.stop()


def test_names_and_stats_from_actors_are_typed_before_anyone_shows_them():
    hub = HubThread()
    socket, welcome = raw_actor(hub, name="[/x][bold]evil\x1b[0m")
    socket.send(Heartbeat(sender="x", session=welcome.session, policy_version=0,
                          stats={"gen_tokens_per_s": "fast", "groups_sent": "many", "device": "[/]\n"}))
    assert wait_for(lambda: hub.call(lambda h: bool(h.status()["actors"][0]["stats"].get("device"))))
    state = hub.call(lambda h: h.status())
    actor = state["actors"][0]
    assert "[" not in actor["name"] and "\x1b" not in actor["name"]
    assert actor["stats"] == {"device": "?/??"}
    assert "evil" in format_status(state)  # and nothing raises on the way
    console = Console(file=io.StringIO(), width=120)
    console.print(render({**state, "steps": 3, "step": 1, "phase": "[/]"}))
    assert "evil" in console.file.getvalue()
    socket.close()
    hub.stop()


def test_consumed_ids_older_than_the_staleness_bound_are_forgotten():
    hub = HubThread(hold=True)
    for version, group_id in ((0, "old"), (5, "new")):
        hub.call(lambda h, v=version, g=group_id: h.consume(g, "trained", policy_version=v))
    assert hub.call(lambda h: h.forget_consumed(3)) == 1
    assert hub.call(lambda h: sorted(h.consumed)) == ["new"]
    hub.stop()


def test_hello_floods_cannot_lock_actors_out_and_unloaded_actors_send_nothing():
    hub = HubThread(hold=True, max_actors=3)
    ghosts = []
    for index in range(5):  # hellos that never load the model
        socket, _ = raw_actor(hub, name=f"ghost-{index}", fingerprint="")
        ghosts.append(socket)
    socket = ghosts[-1]
    socket.send(None, frames=encode(make_group()))  # from an actor that never said it loaded the model
    refused = []
    assert wait_for(lambda: refused.extend(a for a in acks(socket, 50) if a.status == "rejected") or refused)
    assert "fingerprint" in refused[0].reason and hub.received == []
    client = ActorClient(ActorSocket(hub.address), "honest")
    assert client.hello("fp") is not None  # welcomed: the oldest ghosts made room
    client.submit(make_group())
    assert wait_for(lambda: len(hub.received) == 1, client)
    assert hub.call(lambda h: h.counts["pending_evicted"]) >= 2
    for ghost in ghosts:
        ghost.close()
    client.socket.close()
    hub.stop()


def test_a_stalled_learner_lets_an_actor_send_a_whole_batch_even_when_less_is_missing():
    """Growth by the update's deficit alone deadlocks an actor that waits for room for a whole batch."""
    hub = HubThread(hold=True, max_in_flight=lambda actors, batch: 2, groups_per_update=6, stall_s=0.3)
    client = ActorClient(ActorSocket(hub.address), "batcher", heartbeat_s=0.1)
    client.stats = {"groups_per_batch": 4}
    client.hello("fp")
    for _ in range(2):  # 4 + 4 groups: the second batch starts when only 2 are missing
        client.wait_for_room(4, timeout_s=20)
        for _ in range(4):
            client.submit(make_group(), timeout_s=20)
    assert wait_for(lambda: len(hub.received) == 8, client)
    client.socket.close()
    hub.stop()
