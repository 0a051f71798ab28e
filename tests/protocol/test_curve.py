"""CURVE done fully: private keys stay private, revocation without restart, one key per actor identity."""

import stat

import pytest
import zmq

from artmlx.protocol.client import ActorClient, ActorRefused
from artmlx.protocol.codec import encode
from artmlx.protocol.security import make_keys, secure_client
from artmlx.protocol.sockets import ActorSocket, LearnerSocket
from tests.protocol.helpers import HubThread, make_group, wait_for


def test_secret_keys_are_private_from_the_start_and_refused_otherwise(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    for secret in keys.glob("*.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    (keys / "learner.key_secret").chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        LearnerSocket("tcp://127.0.0.1:0", keys=keys)


def test_a_removed_key_is_revoked_on_reload_without_a_restart(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    hub = HubThread(keys=keys)
    client = ActorClient(ActorSocket(hub.address, keys=keys), "soon-revoked", heartbeat_s=0.05)
    client.hello("fp")
    client.submit(make_group())
    assert wait_for(lambda: not client.outbox, client)
    (keys / "allowed" / "actor.key").unlink()
    assert hub.call(lambda h: h.socket.reload_keys()) == 0
    with pytest.raises(ActorRefused, match="revoked"):
        wait_for(lambda: False, client, timeout=5)
    assert hub.call(lambda h: h.socket.rejections.counts["revoked"]) >= 1
    client.socket.close()
    hub.stop()


def test_another_key_cannot_take_over_an_actors_identity(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    make_keys(keys, actor="second")  # both keys are allowed
    hub = HubThread(keys=keys, hold=True)
    victim = ActorClient(ActorSocket(hub.address, keys=keys), "victim")
    victim.hello("fp")
    identity = victim.socket.socket.getsockopt(zmq.IDENTITY)
    context = zmq.Context()
    thief = context.socket(zmq.DEALER)
    thief.setsockopt(zmq.IDENTITY, identity)
    thief.setsockopt(zmq.LINGER, 0)
    secure_client(thief, keys, "second")
    thief.connect(hub.address)
    group = make_group(group_id="stolen")
    group.actor = "victim"
    for _ in range(20):
        thief.send_multipart(encode(group))
        if wait_for(lambda: hub.call(lambda h: h.socket.rejections.counts["impersonation"]) > 0, timeout=0.2):
            break
    assert hub.call(lambda h: h.socket.rejections.counts["impersonation"]) > 0
    assert [g.group_id for g in hub.received] == []
    thief.close()
    context.term()
    victim.socket.close()
    hub.stop()
