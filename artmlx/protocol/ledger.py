"""Where every group the actors sent ended up: the run's ledger, as plain arithmetic over counts.

sent (distinct groups; resends are counted apart) = trained + stale + rejected + settled_earlier +
in_flight, where in_flight is what the actors still held unacknowledged; each group settles once (later
copies are duplicates). Actor numbers come from their last heartbeat (exact for actors that left on
shutdown, which first reconcile lost acks; up to a heartbeat old for ones that were killed), so
`unaccounted` is 0 in a clean run, on lossy links too, and otherwise counts groups lost with a killed
process. The ledger covers this learner process: an actor that stays across a learner restart (`--resume`,
learner ranks restarted) counts from its Welcome by the new process, leaving out what the earlier one
acknowledged; what it resends that the earlier one had settled without the actor hearing is
`settled_earlier` (the resumed checkpoint knows the id).
"""

from __future__ import annotations

import collections

SETTLED = ("trained", "stale", "rejected", "settled_earlier")
RUN_SETTLED = ("trained", "stale", "rejected")
"""What a checkpoint carries forward: groups settled by every learner process up to it (a group an earlier
process settled and this one sees again is `settled_earlier` here and counted there, never twice)."""


def run_totals(before: dict, counts: dict) -> dict:
    """The run's settled groups over all its learner processes: a checkpoint's totals (`before`, empty for a
    new run) plus this process's counts; `learner_starts` counts the processes. Groups an earlier process
    settled after its last checkpoint are not in them: the updates they went into were lost and redone."""
    totals = {key: int(before.get(key, 0)) + int(counts.get(key, 0)) for key in RUN_SETTLED}
    return {**totals, "learner_starts": int(before.get("learner_starts", 0)) + 1}


def checked_run_totals(value) -> dict:
    """A checkpoint's `ledger` entry, refused by name when it is not counts (an older checkpoint has none)."""
    if value is None:
        return {}
    keys = (*RUN_SETTLED, "learner_starts")
    if not isinstance(value, dict) or any(not isinstance(value.get(k, 0), int) or value.get(k, 0) < 0 for k in keys):
        raise ValueError(f"the checkpoint's ledger must map {', '.join(keys)} to counts, got {value!r:.200}")
    return {key: value[key] for key in keys if key in value}


def balance(sent: int, resent: int, in_flight: int, counts: dict) -> dict:
    """The ledger from the actors' totals and the learner's settled counts."""
    settled = sum(counts.get(key, 0) for key in SETTLED)
    return {"groups_sent": sent, "groups_resent": resent, "groups_in_flight": in_flight,
            "groups_unaccounted": sent - settled - in_flight}


class GroupBook:
    """Every group id the hub has answered: held for the learner (`waiting`, with the actor that sent it) or
    settled (`consumed`, with the policy version it was sampled at), and the counts of both.

    `received` counts a group's first arrival, `duplicate` its copies; a group settles once, as trained,
    stale or rejected. Plain data: the hub's socket loop drives it, its unit tests read it."""

    def __init__(self, consumed: dict[str, int] | set[str] | None = None):
        # a legacy checkpoint's plain list of ids: version 0
        self.consumed: dict[str, int] = dict(consumed) if isinstance(consumed, dict) else dict.fromkeys(consumed or (), 0)
        self.earlier = set(self.consumed)  # settled by an earlier learner process, not yet seen by this one
        self.waiting: dict[str, bytes] = {}
        self.counts: collections.Counter = collections.Counter()

    def arrival(self, group_id: str, identity: bytes) -> str:
        """Count a group as it arrives: "consumed" (a copy of a settled one), "waiting" (a copy of a held one,
        now answered to `identity`), or "new" (its first arrival)."""
        if group_id in self.consumed:
            self.counts["duplicate"] += 1
            if group_id in self.earlier:  # its ack was lost with the earlier process: settled for this ledger now
                self.earlier.discard(group_id)
                self.counts["settled_earlier"] += 1
            return "consumed"
        if group_id in self.waiting:  # its Held was lost, or it was resent after a reconnect
            self.counts["duplicate"] += 1
            self.waiting[group_id] = identity
            return "waiting"
        self.counts["received"] += 1
        return "new"

    def hold(self, group_id: str, identity: bytes) -> None:
        self.waiting[group_id] = identity

    def settle(self, group_id: str, status: str, policy_version: int = 0) -> bytes | None:
        """Settle a group (trained, stale, rejected); returns the actor holding it, if it was waiting."""
        self.consumed[group_id] = policy_version
        self.counts[status] += 1
        return self.waiting.pop(group_id, None)

    def forget_consumed(self, before_version: int) -> int:
        """Drop settled ids sampled before `before_version` (their resends are stale anyway)."""
        old = [group_id for group_id, version in self.consumed.items() if version < before_version]
        for group_id in old:
            del self.consumed[group_id]
            self.earlier.discard(group_id)
        return len(old)
