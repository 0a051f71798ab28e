"""The hub's state machines on plain data, no transport: who is connected (`Sessions`) and where each group
stands (`GroupBook`), with the ledger they add up to."""

from artmlx.protocol.ledger import GroupBook
from artmlx.protocol.sessions import MAX_DEPARTED, Sessions


def test_a_full_house_makes_room_only_by_forgetting_an_actor_that_never_loaded_the_model():
    sessions = Sessions(max_actors=2)
    a, _ = sessions.join(b"a", "a", "h", now=1.0)
    b, _ = sessions.join(b"b", "b", "h", now=2.0)
    a.loaded = True
    assert (a.index, b.index) == (0, 1) and sessions.join(b"a", "a", "h", 3.0) == (a, 0)  # known: the same
    c, evicted = sessions.join(b"c", "c", "h", now=4.0)
    assert evicted == 1 and set(sessions.actors) == {b"a", b"c"} and c.index == 2
    c.loaded = True
    assert sessions.join(b"d", "d", "h", now=5.0) == (None, 0)  # every known actor loaded: no room
    assert sessions.producers() == 2 and [i.name for i in sessions.loaded()] == ["a", "c"]


def test_silence_departure_and_rejoining_keep_the_ledger_counts():
    sessions = Sessions()
    a, _ = sessions.join(b"a", "a", "h", now=0.0)
    b, _ = sessions.join(b"b", "b", "h", now=0.0)
    a.heard, b.heard = 10.0, 50.0
    assert sessions.silent(cutoff=20.0) == [b"a"]
    sessions.depart(b"a", {"groups_sent": 5, "groups_unacked": 2, "groups_resent": 1})
    b.stats = {"groups_sent": 3, "groups_unacked": 0}
    sessions.settle_departed(b"a")  # one of the lost actor's groups was settled after it left
    assert sessions.reported("groups_sent") == [5, 3]
    assert sessions.ledger({"trained": 6, "stale": 1}) == {"groups_sent": 8, "groups_resent": 1,
                                                            "groups_in_flight": 1, "groups_unaccounted": 0}
    sessions.join(b"a", "a", "h", now=60.0)  # rejoining: its counts come from its heartbeats again
    assert b"a" not in sessions.departed


def test_departed_actors_beyond_the_limit_fold_into_one_total():
    sessions = Sessions()
    for n in range(MAX_DEPARTED + 3):
        sessions.depart(n.to_bytes(4, "big"), {"groups_sent": 1, "name_like": "x"})
    assert len(sessions.departed) == MAX_DEPARTED and dict(sessions.departed_totals) == {"groups_sent": 3}
    assert sessions.ledger({"trained": MAX_DEPARTED + 3})["groups_unaccounted"] == 0


def test_a_group_is_received_once_held_then_settled_once_and_copies_are_duplicates():
    book = GroupBook(consumed=["old"])  # a legacy checkpoint's list: version 0
    assert book.arrival("old", b"a") == "consumed"
    assert book.arrival("g", b"a") == "new"
    book.hold("g", b"a")
    assert book.arrival("g", b"b") == "waiting" and book.waiting["g"] == b"b"  # the copy's sender holds it now
    assert book.settle("g", "trained", policy_version=7) == b"b"
    assert book.arrival("g", b"a") == "consumed" and book.settle("x", "rejected", 3) is None
    assert book.arrival("old", b"a") == "consumed"  # a second copy of the earlier process's group
    # "old" was settled by an earlier learner process: its first copy here settles it for this one's ledger
    assert dict(book.counts) == {"duplicate": 4, "received": 1, "trained": 1, "rejected": 1, "settled_earlier": 1}
    assert book.consumed == {"old": 0, "g": 7, "x": 3}
    assert book.forget_consumed(before_version=5) == 2 and book.consumed == {"g": 7}
