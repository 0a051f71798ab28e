"""The learner hub's logic in one process, a message at a time, on plain data (`InMemoryTransport`):
sessions, admission, windows, acknowledgements, shutdown and the ledger, with nothing on the wire.
(tests/protocol/test_delivery.py and test_liveness.py prove the same over real sockets and processes.)"""

import numpy as np

from artmlx.protocol.hub import LearnerHub
from artmlx.protocol.messages import Ack, AdapterUpdate, Heartbeat, Held, Hello, Refuse, Shutdown, Welcome
from artmlx.protocol.transport import HubTransport, InMemoryTransport
from artmlx.protocol.sockets import LearnerSocket
from tests.protocol.helpers import make_group


def new_hub(**settings):
    transport = InMemoryTransport()
    return LearnerHub(transport, {"env": "tictactoe"}, "fp", **settings), transport


def say(hub, transport, actor: bytes, *messages):
    """Deliver the actor's messages, let the hub handle them, return (groups admitted, replies to it)."""
    for message in messages:
        transport.deliver(actor, message)
    admitted = []
    while transport.inbound:  # poll(0) handles what is there by its deadline: at least one message
        admitted += hub.poll(0)
    return [group for _, group in admitted], transport.take(actor)


def hello(actor: str, fingerprint="fp"):
    return Hello(actor=actor, host="h", artmlx_version="test", fingerprint=fingerprint)


def test_both_transports_offer_what_the_hub_uses():
    names = {"receive", "send", "keep_adapter", "send_adapter", "reload_keys", "close"}
    for kind in (LearnerSocket, InMemoryTransport):
        assert names <= set(dir(kind))
    assert isinstance(InMemoryTransport().rejections.total, int) and HubTransport is not None


def test_a_wrong_fingerprint_is_refused_and_a_joiner_gets_the_current_adapter():
    hub, transport = new_hub()
    _, replies = say(hub, transport, b"a", hello("a", fingerprint="other"))
    assert len(replies) == 1 and isinstance(replies[0], Refuse) and "fingerprint mismatch" in replies[0].reason
    assert not hub.actors
    hub.publish(3, {"w": np.ones((2, 2), np.float32)})
    _, replies = say(hub, transport, b"b", hello("b"))
    assert [type(reply) for reply in replies] == [Welcome, AdapterUpdate]
    assert replies[0].policy_version == 3 and replies[1].policy_version == 3
    assert float(replies[1].tensors["w"].sum()) == 4.0


def test_groups_are_admitted_once_acknowledged_when_consumed_and_resends_are_duplicates():
    hub, transport = new_hub(max_in_flight=2)
    say(hub, transport, b"a", hello("a"))
    first, second, third = make_group(), make_group(), make_group()
    admitted, replies = say(hub, transport, b"a", first, first, second)
    assert [g.group_id for g in admitted] == [first.group_id, second.group_id]
    # received at once, the copy too (its Held may have been lost), settled later
    assert replies == [Held(first.group_id), Held(first.group_id), Held(second.group_id)]
    assert (hub.counts["received"], hub.counts["duplicate"], hub.actors[b"a"].in_flight) == (2, 1, 2)
    admitted, replies = say(hub, transport, b"a", third)  # a third is over the window of 2
    assert admitted == [] and replies[0].status == "rejected" and "over its window" in replies[0].reason
    hub.consume(first.group_id, "trained", policy_version=0)
    assert transport.take(b"a") == [Ack(first.group_id, "trained", "")] and hub.actors[b"a"].in_flight == 1
    _, replies = say(hub, transport, b"a", first)  # its ack was lost: the resend is answered, not trained
    assert replies == [Ack(first.group_id, "duplicate", "already consumed")]


def test_shutdown_settles_everything_and_the_ledger_balances():
    hub, transport = new_hub(max_in_flight=8)
    say(hub, transport, b"a", hello("a"))
    groups = [make_group() for _ in range(4)]
    admitted, _ = say(hub, transport, b"a", *groups[:3])
    hub.consume(admitted[0].group_id, "trained", policy_version=0)
    transport.take(b"a")
    transport.deliver(b"a", Heartbeat(sender="a", stats={"groups_sent": 4, "groups_unacked": 3, "groups_resent": 0}))
    hub.shutdown("done", drain_s=0.05)  # the two still waiting are acknowledged as stale first
    replies = transport.take(b"a")
    assert [r.status for r in replies if isinstance(r, Ack)] == ["stale", "stale"]
    assert any(isinstance(r, Shutdown) for r in replies)
    _, replies = say(hub, transport, b"a", groups[3])  # it arrives after the end: settled as stale
    assert replies == [Ack(groups[3].group_id, "stale", "the run ended before it was trained")]
    _, replies = say(hub, transport, b"a", Heartbeat(sender="a", stats={
        "leaving": True, "groups_sent": 4, "groups_unacked": 0, "groups_resent": 0}))
    assert not hub.actors
    ledger = hub.ledger()
    assert (ledger["groups_sent"], ledger["groups_in_flight"], ledger["groups_unaccounted"]) == (4, 0, 0)
    assert (hub.counts["trained"], hub.counts["stale"]) == (1, 3)
    assert hub.counts["received"] == 4 and hub.counts["duplicate"] == 0  # every group answered, counted once
