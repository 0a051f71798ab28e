"""Lifecycle on live loopback endpoints: shutdown handshake, expiry and rejoin, status."""

import time

from artmlx.netutil import free_port
from artmlx.protocol.client import ActorClient
from artmlx.protocol.sockets import ActorSocket
from tests.protocol.helpers import HubThread, make_group, wait_for


def test_shutdown_reaches_a_busy_actor_before_the_learner_closes():
    """ZeroMQ drops unread messages when a connection closes: the learner waits for a goodbye."""
    import threading

    hub = HubThread(hold=True, max_in_flight=1)
    client = ActorClient(ActorSocket(hub.address), "busy", heartbeat_s=0.1)
    client.hello("fp")
    client.submit(make_group())
    closer = threading.Thread(target=lambda: (time.sleep(0.5), hub.call(lambda h: h.shutdown("run finished"))))
    closer.start()
    time.sleep(1.0)  # the actor is busy (not reading) while the shutdown is sent
    client.submit(make_group(), timeout_s=10)  # waits for a slot, hears the shutdown instead
    closer.join()
    assert client.shutdown_reason == "run finished"
    assert wait_for(lambda: hub.call(lambda h: len(h.actors)) == 0, client)
    client.socket.close()
    hub.stop()


def test_a_busy_learner_does_not_lose_its_actors():
    """Silence counts only while the hub listens: a learner busy evaluating while its actor is busy
    generating (neither talks) must not drop the actor."""
    import threading

    hub = HubThread(actor_timeout_s=0.5)
    client = ActorClient(ActorSocket(hub.address), "patient", heartbeat_s=0.1)
    client.hello("fp")
    busy = threading.Thread(target=lambda: hub.call(lambda h: time.sleep(1.5)))
    busy.start()
    time.sleep(1.6)  # the actor is silent too (generating)
    busy.join()
    wait_for(lambda: False, client, timeout=0.3)
    assert hub.call(lambda h: (len(h.actors), h.counts["actors_lost"])) == (1, 0)
    client.socket.close()
    hub.stop()


def test_an_expired_actor_rejoins_and_resends():
    hub = HubThread(actor_timeout_s=0.5)
    client = ActorClient(ActorSocket(hub.address), "sleepy", heartbeat_s=0.1)
    client.hello("fp")
    time.sleep(1.5)  # the actor is silent while the hub listens: it is dropped
    assert wait_for(lambda: hub.call(lambda h: h.counts["actors_lost"]) == 1)
    client.submit(make_group())  # the hub does not know this actor any more
    assert wait_for(lambda: not client.outbox, client)
    assert client.acks["trained"] == 1 and client.resent == 1
    assert hub.call(lambda h: len(h.actors)) == 1
    client.socket.close()
    hub.stop()


def test_an_actor_joining_a_closing_learner_is_told_to_stop():
    import threading

    hub = HubThread()
    closer = threading.Thread(target=lambda: hub.call(lambda h: h.shutdown("run finished", drain_s=3.0)))
    closer.start()
    time.sleep(0.3)
    late = ActorClient(ActorSocket(hub.address), "late", heartbeat_s=0.1)
    assert late.hello("fp", timeout_s=5) is None and late.shutdown_reason == "run finished"
    closer.join()
    assert hub.call(lambda h: len(h.actors)) == 0
    late.socket.close()
    hub.stop()


def test_status_lists_connected_actors_by_name():
    from click.testing import CliRunner

    from artmlx.cli import cli
    from artmlx.protocol.status import format_status, query_status

    hub = HubThread()
    client = ActorClient(ActorSocket(hub.address), "mac-mini-1", heartbeat_s=0.1)
    client.hello("fp")
    client.stats = {"gen_tokens_per_s": 123.0}
    client.submit(make_group())
    assert wait_for(lambda: not client.outbox, client)
    client.pump(300)  # a heartbeat carries the stats
    state = query_status(hub.address)
    assert [a["name"] for a in state["actors"]] == ["mac-mini-1"]
    assert state["counts"]["trained"] == 1 and state["fingerprint"] == "fp"
    assert "mac-mini-1" in format_status(state)
    # the command itself, in this process (its own process adds only Python's start-up)
    printed = CliRunner().invoke(cli, ["status", hub.address])
    assert printed.exit_code == 0 and "mac-mini-1" in printed.output, printed.output
    client.socket.close()
    hub.stop()
    silent = CliRunner().invoke(cli, ["status", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.5"])
    assert silent.exit_code != 0 and "no answer" in silent.output and "within 0.5 s" in silent.output


def test_status_sums_generation_per_host():
    from artmlx.protocol.status import format_status, query_status

    hub = HubThread()
    clients = []
    for name, host, rate in (("m1-0", "m1", 100.0), ("m4-0", "m4", 300.0), ("m4-1", "m4", 250.0)):
        client = ActorClient(ActorSocket(hub.address), name, heartbeat_s=0.1)
        client.host = host
        client.hello("fp")
        client.stats = {"gen_tokens_per_s": rate}
        clients.append(client)
    assert wait_for(lambda: all(a["stats"].get("gen_tokens_per_s") for a in query_status(hub.address)["actors"]),
                    *clients)
    text = format_status(query_status(hub.address))
    assert "per host: m1 1 actor(s) 100 gen tok/s; m4 2 actor(s) 550 gen tok/s" in text, text
    for client in clients:
        client.socket.close()
    hub.stop()
