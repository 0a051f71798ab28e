"""The ledger's arithmetic on plain counts (the hub feeds it its live and departed actors' totals)."""

from artmlx.protocol.ledger import balance


def test_every_sent_group_is_settled_in_flight_or_unaccounted():
    counts = {"trained": 800, "stale": 20, "rejected": 3, "duplicate": 20}  # duplicates are copies, not groups
    assert balance(830, 20, 7, counts) == {"groups_sent": 830, "groups_resent": 20, "groups_in_flight": 7,
                                           "groups_unaccounted": 0}
    assert balance(832, 0, 0, counts)["groups_unaccounted"] == 9  # lost with a killed process
    assert balance(0, 0, 0, {})["groups_unaccounted"] == 0


def test_run_totals_add_a_checkpoint_s_settled_groups_to_this_process_s():
    from artmlx.protocol.ledger import run_totals

    first = run_totals({}, {"trained": 12, "stale": 2, "rejected": 1, "duplicate": 5, "settled_earlier": 0})
    assert first == {"trained": 12, "stale": 2, "rejected": 1, "learner_starts": 1}
    # the resumed process: what it sees again of the earlier one's groups is settled_earlier, not counted twice
    second = run_totals(first, {"trained": 20, "stale": 1, "settled_earlier": 3, "duplicate": 3})
    assert second == {"trained": 32, "stale": 3, "rejected": 1, "learner_starts": 2}


def test_a_checkpoint_ledger_that_is_not_counts_is_refused_by_name():
    import pytest

    from artmlx.protocol.ledger import checked_run_totals

    assert checked_run_totals(None) == {}  # a checkpoint written before run totals were kept
    assert checked_run_totals({"trained": 4, "learner_starts": 1}) == {"trained": 4, "learner_starts": 1}
    for bad in ([1, 2], {"trained": -1}, {"stale": "7"}, {"trained": 1.5}):
        with pytest.raises(ValueError, match="checkpoint's ledger"):
            checked_run_totals(bad)
