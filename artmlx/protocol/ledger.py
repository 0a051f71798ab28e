"""Where every group the actors sent ended up: the run's ledger, as plain arithmetic over counts.

sent (distinct groups; resends are counted apart) = trained + stale + rejected + in_flight, where
in_flight is what the actors still held unacknowledged; each group settles once (later copies are
duplicates). Actor numbers come from their last heartbeat (exact for actors that left on shutdown,
which first reconcile lost acks; up to a heartbeat old for ones that were killed), so `unaccounted`
is 0 in a clean run, on lossy links too, and otherwise counts groups lost with a killed process.
Counts restart with a learner process, so after `--resume` the ledger covers this process only.
"""

from __future__ import annotations

SETTLED = ("trained", "stale", "rejected")


def balance(sent: int, resent: int, in_flight: int, counts: dict) -> dict:
    """The ledger from the actors' totals and the learner's settled counts."""
    settled = sum(counts.get(key, 0) for key in SETTLED)
    return {"groups_sent": sent, "groups_resent": resent, "groups_in_flight": in_flight,
            "groups_unaccounted": sent - settled - in_flight}
