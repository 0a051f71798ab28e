"""The ledger's arithmetic on plain counts (the hub feeds it its live and departed actors' totals)."""

from artmlx.protocol.ledger import balance


def test_every_sent_group_is_settled_in_flight_or_unaccounted():
    counts = {"trained": 800, "stale": 20, "rejected": 3, "duplicate": 20}  # duplicates are copies, not groups
    assert balance(830, 20, 7, counts) == {"groups_sent": 830, "groups_resent": 20, "groups_in_flight": 7,
                                           "groups_unaccounted": 0}
    assert balance(832, 0, 0, counts)["groups_unaccounted"] == 9  # lost with a killed process
    assert balance(0, 0, 0, {})["groups_unaccounted"] == 0
