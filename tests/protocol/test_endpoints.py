"""Live ZeroMQ endpoints on loopback: fuzzing, CURVE, reconnects, refusals, flow control."""

import random
import socket as socketlib
import time

import msgpack
import numpy as np
import pytest
import zmq

from artmlx.protocol.client import ActorClient, ActorRefused, LearnerGone
from artmlx.protocol.codec import encode
from artmlx.protocol.messages import Hello
from artmlx.protocol.security import make_keys
from artmlx.protocol.sockets import ActorSocket, LearnerSocket
from tests.protocol.helpers import HubThread, make_group


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


def free_port():
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fuzzed_frames_are_all_rejected_and_the_learner_stays_alive():
    hub = HubThread()
    raw = zmq.Context().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(hub.address)
    rng = random.Random(0)
    valid = encode(make_group())
    sent = 0
    for i in range(3000):
        kind = i % 6
        if kind == 0:
            frames = [rng.randbytes(rng.randint(0, 200))]
        elif kind == 1:  # truncated valid header
            frames = [valid[0][: rng.randint(0, len(valid[0]) - 1)], *valid[1:]]
        elif kind == 2:  # flipped bytes in a valid header
            head = bytearray(valid[0])
            for _ in range(3):
                head[rng.randrange(len(head))] = rng.randrange(256)
            frames = [bytes(head), *valid[1:]]
        elif kind == 3:  # valid-looking message whose arrays have the wrong length
            frames = [valid[0], *[bytes(f)[: len(f) // 2] for f in valid[1:]]]
        elif kind == 4:  # frames dropped or added
            frames = valid[:-1] if i % 2 else [*valid, b"extra"]
        else:  # wrong version, unknown types and hostile containers
            frames = [msgpack.packb(rng.choice([
                {"type": "group", "version": 2, "id": "x", "body": {}},
                {"type": "nope", "version": 1, "id": "x", "body": {}},
                {"type": "hello", "version": 1, "id": "x", "body": {"actor": ["a"] * 10}},
                [1, 2, 3],
                {"type": "hello", "version": 1, "id": "x", "body": {"actor": "a", "host": "h", "artmlx_version": "0",
                                                                 "protocol_version": -5, "fingerprint": ""}},
            ]))]
        raw.send_multipart(frames)
        sent += 1
    # Oversized frame: over MAXMSGSIZE the connection is dropped, the learner lives on.
    big = zmq.Context().socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect(hub.address)
    # Flipped bytes inside a string can leave a valid message: it comes from an actor that never said
    # hello, so it is turned away as unknown (and never delivered).
    handled = lambda h: h.socket.rejections.total + h.counts["unknown_actor"]  # noqa: E731
    assert wait_for(lambda: hub.call(handled) >= sent, timeout=60), (hub.call(handled), sent)
    assert hub.call(handled) == sent
    assert hub.call(lambda h: h.socket.rejections.total) > 0.9 * sent
    assert hub.received == []
    # A valid client is still served.
    client = ActorClient(ActorSocket(hub.address), "good", heartbeat_s=0.2)
    client.hello("fp")
    client.submit(make_group())
    assert wait_for(lambda: not client.outbox, client)
    assert len(hub.received) == 1
    client.socket.close()
    raw.close()
    big.close()
    hub.stop()


def test_oversized_messages_are_cut_off_by_maxmsgsize():
    learner = LearnerSocket("tcp://127.0.0.1:0", max_message_bytes=1 << 16)
    sender = zmq.Context().socket(zmq.DEALER)
    sender.setsockopt(zmq.LINGER, 0)
    sender.connect(learner.address)
    sender.send_multipart([b"x" * (1 << 17)])
    assert learner.receive(300) is None
    client = ActorSocket(learner.address)
    received = None
    deadline = time.monotonic() + 5
    while received is None and time.monotonic() < deadline:
        client.send(Hello(actor="a", host="h", artmlx_version="0"))  # no queueing before the connection is up
        received = learner.receive(100)
    assert isinstance(received[1], Hello)
    sender.close()
    client.close()
    learner.close()


def test_fingerprint_mismatch_is_refused_with_the_reason():
    hub = HubThread()
    client = ActorClient(ActorSocket(hub.address), "wrong-model")
    with pytest.raises(ActorRefused, match="fingerprint mismatch"):
        client.hello("not-the-run-fingerprint", timeout_s=5)
    client.socket.close()
    hub.stop()


def test_groups_from_another_model_or_the_future_are_rejected():
    hub = HubThread()
    client = ActorClient(ActorSocket(hub.address), "a")
    client.hello("fp")
    client.submit(make_group(fingerprint="other"))
    client.submit(make_group(version=5))
    assert wait_for(lambda: not client.outbox, client)
    assert client.acks == {"rejected": 2} and hub.received == []
    client.socket.close()
    hub.stop()


def test_late_joiner_gets_the_current_adapter_at_once():
    hub = HubThread()
    hub.call(lambda h: h.publish(3, {"w": np.full((8, 8), 3.0, np.float32)}))
    client = ActorClient(ActorSocket(hub.address), "late")
    welcome = client.hello("fp")
    assert welcome.policy_version == 3
    assert wait_for(lambda: client.adapter is not None, client)
    assert client.adapter.policy_version == 3 and float(client.adapter.tensors["w"].sum()) == 192.0
    client.socket.close()
    hub.stop()


def test_window_limits_unacknowledged_groups():
    hub = HubThread(hold=True, max_in_flight=2)
    client = ActorClient(ActorSocket(hub.address), "a")
    client.hello("fp")
    client.submit(make_group())
    client.submit(make_group())
    with pytest.raises(LearnerGone):
        client.submit(make_group(), timeout_s=0.5)  # the learner holds both: no slot frees up
    assert wait_for(lambda: len(hub.received) == 2, client)
    hub.call(lambda h: h.consume(hub.received[0].group_id, "trained"))
    assert wait_for(lambda: len(client.outbox) == 1, client)
    client.socket.close()
    hub.stop()


def test_curve_admits_only_allowed_keys(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    hub = HubThread(bind="tcp://127.0.0.1:0", keys=keys)
    hub.call(lambda h: h.publish(1, {"w": np.ones(4, np.float32)}))
    good = ActorClient(ActorSocket(hub.address, keys=keys), "good")
    good.hello("fp")
    good.submit(make_group())
    assert wait_for(lambda: not good.outbox and good.adapter is not None, good)

    stranger_keys = tmp_path / "stranger"
    make_keys(stranger_keys)
    # The stranger knows the learner's public key but its own key is not allowed.
    (stranger_keys / "learner.key").write_bytes((keys / "learner.key").read_bytes())
    stranger = ActorClient(ActorSocket(hub.address, keys=stranger_keys), "stranger")
    with pytest.raises(LearnerGone):
        stranger.hello("fp", timeout_s=2)
    stranger.submit(make_group(group_id="from-stranger"), timeout_s=1)
    time.sleep(0.5)
    assert stranger.adapter is None
    assert [g.group_id for g in hub.received if g.group_id == "from-stranger"] == []

    plain = ActorClient(ActorSocket(hub.address), "plaintext")
    with pytest.raises(LearnerGone):
        plain.hello("fp", timeout_s=1)
    assert len(hub.received) == 1
    for client in (good, stranger, plain):
        client.socket.close()
    hub.stop()


def test_binding_the_network_without_keys_needs_insecure():
    with pytest.raises(ValueError, match="--insecure"):
        LearnerSocket("tcp://0.0.0.0:0")
    learner = LearnerSocket("tcp://0.0.0.0:0", insecure=True)
    learner.close()


def test_learner_restart_resends_unacknowledged_groups_without_double_counting():
    address = f"tcp://127.0.0.1:{free_port()}"
    first = HubThread(bind=address, hold=True)
    client = ActorClient(ActorSocket(address), "a", heartbeat_s=0.1)
    client.hello("fp")
    ids = [make_group().group_id for _ in range(4)]
    for group_id in ids:
        client.submit(make_group(group_id=group_id))
    assert wait_for(lambda: len(first.received) == 4, client)
    # The first learner trains two groups, then dies before consuming the rest.
    for group_id in ids[:2]:
        first.call(lambda h, g=group_id: h.consume(g, "trained"))
    assert wait_for(lambda: len(client.outbox) == 2, client)
    consumed = first.call(lambda h: set(h.consumed))
    first.stop()

    # An ack that was lost: pretend the actor never heard about ids[1].
    client.outbox[ids[1]] = encode(make_group(group_id=ids[1]))
    second = HubThread(bind=address, consumed=consumed)
    assert wait_for(lambda: not client.outbox, client, timeout=20)
    assert sorted(g.group_id for g in second.received) == sorted(ids[2:])
    assert client.acks["duplicate"] == 1 and client.acks["trained"] == 4
    assert second.call(lambda h: h.counts["duplicate"]) == 1
    client.socket.close()
    second.stop()


def test_kill_9_of_the_learner_process_then_restart(tmp_path):
    """A learner process dies holding groups; its successor gets them resent, none twice."""
    import json
    import os
    import signal
    import subprocess
    import sys

    address = f"tcp://127.0.0.1:{free_port()}"
    state = tmp_path / "state.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))

    def start(*extra):
        return subprocess.Popen([sys.executable, "-m", "tests.protocol.hub_process", address, str(state), *extra],
                                env=env)

    def read_state():
        try:
            return json.loads(state.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    first = start("--hold-after", "2")
    client = ActorClient(ActorSocket(address), "a", heartbeat_s=0.1)
    client.hello("fp", timeout_s=60)
    first_session = client.session
    for _ in range(6):
        client.submit(make_group(), timeout_s=60)
    assert wait_for(lambda: (read_state() or {}).get("received", []).__len__() == 6, client, timeout=30)
    assert client.acks["trained"] == 2 and len(client.outbox) == 4
    held = set(client.outbox)
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    second = start()
    try:
        assert wait_for(lambda: not client.outbox, client, timeout=60)
        # The hub writes its state right after acknowledging; give it that moment.
        assert wait_for(lambda: len((read_state() or {}).get("consumed", [])) == 6, timeout=10)
        final = read_state()
        assert client.session != first_session
        assert set(final["received"]) == held
        assert client.acks["trained"] == 6 and client.resent >= 4
        assert len(final["consumed"]) == 6
    finally:
        second.kill()
        second.wait(10)
        client.socket.close()


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


def test_status_lists_connected_actors_by_name():
    import subprocess
    import sys

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
    printed = subprocess.run([sys.executable, "-m", "artmlx", "status", hub.address], capture_output=True, text=True,
                             timeout=60)
    assert printed.returncode == 0 and "mac-mini-1" in printed.stdout, printed.stderr
    client.socket.close()
    hub.stop()
    silent = subprocess.run([sys.executable, "-m", "artmlx", "status", f"tcp://127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=60)
    assert silent.returncode != 0 and "no answer" in silent.stderr


def test_ledger_accounts_for_every_group_sent():
    """sent (resends included) = trained + stale + rejected + duplicate + still unacknowledged."""
    import threading

    hub = HubThread(hold=True, max_in_flight=8)
    first = ActorClient(ActorSocket(hub.address), "first", heartbeat_s=0.1)
    second = ActorClient(ActorSocket(hub.address), "second", heartbeat_s=0.1)
    first.hello("fp")
    second.hello("fp")
    for _ in range(4):
        first.submit(make_group())
    first.submit(make_group(fingerprint="other-model"))  # rejected by the hub
    for _ in range(3):
        second.submit(make_group())
    assert wait_for(lambda: len(hub.received) == 7 and first.acks["rejected"] == 1, first)
    ids = [g.group_id for g in hub.received]
    hub.call(lambda h: [h.consume(g, "trained") for g in ids[:3]] + [h.consume(ids[3], "stale")])
    assert wait_for(lambda: sum(first.acks.values()) + sum(second.acks.values()) == 5, first, second)
    first._resend_all()  # copies of what the hub still waits on count as duplicates
    second._resend_all()
    assert wait_for(lambda: hub.call(lambda h: h.counts["duplicate"]) == 3, first, second)

    closer = threading.Thread(target=lambda: hub.call(lambda h: h.shutdown("done")))
    closer.start()
    assert wait_for(lambda: first.shutdown_reason and second.shutdown_reason, first, second)
    closer.join()
    ledger = hub.call(lambda h: h.ledger())
    assert ledger == {"groups_sent": 11, "groups_resent": 3, "groups_in_flight": 3, "groups_unaccounted": 0}
    first.submit(make_group())  # after shutdown nothing more is sent
    assert first.sent == 5
    first.socket.close()
    second.socket.close()
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


def test_windows_shrink_as_actors_join():
    """Capacity-based admission: one update (8 groups) shared between the live actors, plus a batch of 2."""
    hub = HubThread(max_in_flight=lambda actors: -(-8 // actors) + 2)
    first = ActorClient(ActorSocket(hub.address), "first", heartbeat_s=0.05)
    assert first.hello("fp").max_in_flight == 10 and first.window == 10
    second = ActorClient(ActorSocket(hub.address), "second", heartbeat_s=0.05)
    assert second.hello("fp").max_in_flight == 6
    assert wait_for(lambda: first.window == 6, first)
    assert hub.call(lambda h: h.status()["window"]) == 6
    first.socket.close()
    second.socket.close()
    hub.stop()
