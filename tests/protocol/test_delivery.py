"""Delivery on live loopback endpoints: adapters to joiners, windows, resends after restarts, the ledger."""

import time

import numpy as np
import pytest

from artmlx.netutil import free_port
from artmlx.protocol.client import ActorClient, LearnerGone
from artmlx.protocol.codec import encode
from artmlx.protocol.sockets import ActorSocket
from tests.protocol.helpers import HubThread, make_group, wait_for


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


def test_actor_waits_until_a_whole_batch_fits_the_window():
    """An actor starts a batch only when all of it fits, so it samples with the newest adapter by then."""
    hub = HubThread(hold=True, max_in_flight=4)
    client = ActorClient(ActorSocket(hub.address), "a")
    client.hello("fp")
    for _ in range(3):
        client.submit(make_group())
    client.wait_for_room(1, timeout_s=0.5)  # one slot is free
    with pytest.raises(LearnerGone):
        client.wait_for_room(2, timeout_s=0.5)  # two are not, while the learner holds three
    assert wait_for(lambda: len(hub.received) == 3, client)
    hub.call(lambda h: h.consume(hub.received[0].group_id, "trained"))
    client.wait_for_room(2, timeout_s=10)
    assert len(client.outbox) == 2
    # A batch larger than the window waits for an empty window (then submit paces it group by group).
    with pytest.raises(LearnerGone):
        client.wait_for_room(9, timeout_s=0.5)
    hub.call(lambda h: [h.consume(g.group_id, "trained") for g in hub.received[1:]])
    client.wait_for_room(9, timeout_s=10)
    assert not client.outbox
    client.socket.close()
    hub.stop()


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
    # The second learner's ledger covers its own session: the actor's 3 groups still unacknowledged at its
    # Welcome (2 trained here, 1 settled by the first learner whose ack was lost), none unaccounted.
    assert wait_for(lambda: second.call(lambda h: h.ledger())["groups_sent"] == 3, client)
    ledger = second.call(lambda h: h.ledger())
    assert ledger["groups_unaccounted"] == 0 and ledger["groups_in_flight"] == 0, ledger
    assert second.call(lambda h: (h.counts["trained"], h.counts["settled_earlier"])) == (2, 1)
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


def test_ledger_accounts_for_every_group_sent():
    """sent (distinct groups) = trained + stale + rejected + still unacknowledged; copies settle nothing."""
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
    assert wait_for(lambda: first.left and second.left, first, second)
    closer.join()
    ledger = hub.call(lambda h: h.ledger())
    # 8 groups; 3 copies resent by hand; the 3 still waiting at shutdown are acknowledged as stale
    assert ledger == {"groups_sent": 8, "groups_resent": 3, "groups_in_flight": 0, "groups_unaccounted": 0}
    assert hub.call(lambda h: h.counts["stale"]) == 4
    first.submit(make_group())  # after shutdown nothing more is sent
    assert first.sent == 5
    first.socket.close()
    second.socket.close()
    hub.stop()


def test_windows_shrink_as_actors_join():
    """Capacity-based admission: one update (8 groups) shared between the live actors, plus a batch of 2."""
    hub = HubThread(max_in_flight=lambda actors, batch: -(-8 // actors) + (batch or 2))
    first = ActorClient(ActorSocket(hub.address), "first", heartbeat_s=0.05)
    assert first.hello("fp").max_in_flight == 10 and first.window == 10
    second = ActorClient(ActorSocket(hub.address), "second", heartbeat_s=0.05)
    assert second.hello("fp").max_in_flight == 6
    assert wait_for(lambda: first.window == 6, first)
    assert hub.call(lambda h: h.status()["window"]) == 6
    first.socket.close()
    second.socket.close()
    hub.stop()


def test_lost_messages_and_acks_are_recovered_and_the_ledger_balances():
    """A group whose message died with a connection is resent after RESEND_AFTER_S; an ack lost on the
    way is reconciled when the actor leaves (it resends, the closing learner answers duplicate)."""
    import threading

    from artmlx.protocol.client import RESEND_AFTER_S
    from artmlx.protocol.messages import Ack

    hub = HubThread(hold=True, max_in_flight=8)
    client = ActorClient(ActorSocket(hub.address), "a", heartbeat_s=0.1)
    client.hello("fp")
    lost, kept = make_group(), make_group()
    client.outbox[lost.group_id] = encode(lost)  # "sent" on a connection that died: it never arrived
    client.sent_at[lost.group_id] = time.monotonic()
    client.sent += 1
    client.submit(kept)
    assert wait_for(lambda: len(hub.received) == 1, client)
    client.sent_at[lost.group_id] -= RESEND_AFTER_S + 1  # its time is up
    assert wait_for(lambda: len(hub.received) == 2, client) and client.resent == 1
    hub.call(lambda h: h.consume(kept.group_id, "trained") or h.consume(lost.group_id, "trained"))
    dropped = []  # the network loses the ack of `kept`
    while len(dropped) + client.acks["trained"] < 2:
        message = client.socket.receive(100)
        if isinstance(message, Ack) and message.group_id == kept.group_id:
            dropped.append(message)
        elif message is not None:
            client._handle(message, True)
    assert list(client.outbox) == [kept.group_id]
    closer = threading.Thread(target=lambda: hub.call(lambda h: h.shutdown("done", drain_s=10)))
    closer.start()
    assert wait_for(lambda: client.left, client)
    closer.join()
    assert client.outbox == {} and client.acks["duplicate"] == 1
    ledger = hub.call(lambda h: h.ledger())
    assert ledger == {"groups_sent": 2, "groups_resent": 2, "groups_in_flight": 0, "groups_unaccounted": 0}
    client.socket.close()
    hub.stop()


def test_a_held_group_is_never_resent_however_long_the_update_takes():
    """The learner answers `Held` on receipt: a group it holds for longer than RESEND_AFTER_S (a long
    update on a Mac) is not sent again, while one it never answered is (its message was lost)."""
    from artmlx.protocol.client import RESEND_AFTER_S

    hub = HubThread(hold=True, max_in_flight=8)
    client = ActorClient(ActorSocket(hub.address), "a", heartbeat_s=0.1)
    client.hello("fp")
    held, lost = make_group(), make_group()
    client.submit(held)
    assert wait_for(lambda: len(hub.received) == 1 and held.group_id not in client.sent_at, client)
    client.outbox[lost.group_id] = encode(lost)  # "sent" on a connection that died
    client.sent_at[lost.group_id] = time.monotonic() - RESEND_AFTER_S - 1
    client.sent += 1
    assert wait_for(lambda: len(hub.received) == 2, client)
    for _ in range(20):  # the update goes on; the actor keeps pumping
        client.pump(10)
    assert client.resent == 1 and hub.call(lambda h: h.counts["duplicate"]) == 0
    assert list(client.outbox) == [held.group_id, lost.group_id]  # both still count against the window
    hub.call(lambda h: h.consume(held.group_id, "trained") or h.consume(lost.group_id, "trained"))
    assert wait_for(lambda: not client.outbox, client)
    client.socket.close()
    hub.stop()


def test_at_shutdown_a_busy_actor_waits_for_acks_on_their_way_before_resending():
    """An actor that was busy with a batch when the learner said shutdown gives the acks already on
    their way `LEAVE_RESEND_S` from when it heard it, so an orderly shutdown resends nothing settled
    (a clean 12-update run resent 20 groups, answered as duplicates, before); what is still
    unacknowledged then is reconciled as before."""
    from artmlx.protocol.client import LEAVE_RESEND_S
    from artmlx.protocol.messages import Shutdown

    hub = HubThread(hold=True, max_in_flight=8)
    client = ActorClient(ActorSocket(hub.address), "a", heartbeat_s=0.1)
    client.hello("fp")
    pending = make_group()
    client.outbox[pending.group_id] = encode(pending)  # sent seconds ago, just before a long batch
    client.sent_at[pending.group_id] = time.monotonic() - 5.0
    client.sent += 1
    client._handle(Shutdown(reason="done"), True)  # heard when the batch ended
    client.pump(10)
    assert client.resent == 0  # its ack may be on the way
    time.sleep(LEAVE_RESEND_S + 0.1)
    client.pump(10)
    assert client.resent == 1  # none came: reconcile
    client.socket.close()
    hub.stop()
