"""Bad input and access control on live loopback endpoints: fuzzing, size limits, refusals, CURVE."""

import random
import time

import msgpack
import numpy as np
import pytest
import zmq

from artmlx.protocol.client import ActorClient, ActorRefused, LearnerGone
from artmlx.protocol.codec import encode
from artmlx.protocol.messages import PROTOCOL_VERSION, Hello
from artmlx.protocol.security import make_keys
from artmlx.protocol.sockets import ActorSocket, LearnerSocket
from tests.protocol.helpers import HubThread, make_group, wait_for


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
                {"type": "group", "version": PROTOCOL_VERSION + 1, "id": "x", "body": {}},
                {"type": "nope", "version": PROTOCOL_VERSION, "id": "x", "body": {}},
                {"type": "hello", "version": PROTOCOL_VERSION, "id": "x", "body": {"actor": ["a"] * 10}},
                [1, 2, 3],
                {"type": "hello", "version": PROTOCOL_VERSION, "id": "x", "body": {
                    "actor": "a", "host": "h", "artmlx_version": "0", "protocol_version": -5, "fingerprint": ""}},
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
