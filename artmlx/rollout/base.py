"""What every kind of rollouts offers the actor, the learner's evaluation and the benchmarks.

Two kinds implement `Rollouts`: `episodes.EpisodeRollouts` (environments played on the engine) and
`agents.AgentRollouts` (the user's agent code against an in-process OpenAI server). Failures that do
not raise (an agent's rollout that raised, a trajectory refused) go into `failures`, a `FailureLog`;
an environment's errors raise, so its log stays empty.
"""

from __future__ import annotations

import collections
from typing import Callable, Protocol, runtime_checkable

from ..trajectory import Group


@runtime_checkable
class Rollouts(Protocol):
    failures: "FailureLog"

    @property
    def max_rows(self) -> int:
        """Episodes played at once at most."""

    @property
    def stats(self) -> dict:
        """Counts for the actor's heartbeat."""

    def groups_per_batch(self, group_size: int) -> int:
        """Groups one `play` call fills without a second batch."""

    def set_adapter(self, make_tensors: Callable[[], dict], version: int) -> None:
        """Sample from these adapter weights (made by `make_tensors()`) from now on."""

    def play(self, seeds: list[int], group_size: int, key=None, policy_version: int = 0) -> list[Group]:
        """`group_size` episodes for each seed, tagged with `policy_version`."""

    def close(self) -> None:
        """Stop whatever runs in the background."""


class FailureLog:
    """Failed rollouts by reason (exception type and first line of its message).

    The first failure of each reason is kept with its traceback for `firsts()`; later ones are only
    counted, and `repeats()` gives one line per reason for those since its last call, so a function
    that fails on every call writes a line per reason per report, never a line per failure.
    """

    def __init__(self):
        self.counts: collections.Counter[str] = collections.Counter()
        self.consecutive = 0
        self.first_of_streak = ""  # the details of the failure that began the current run of failures
        self._new: list[str] = []
        self._since: collections.Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def failed(self, reason: str, details: str) -> None:
        if reason in self.counts:
            self._since[reason] += 1
        else:
            self._new.append(details)
        self.counts[reason] += 1
        if self.consecutive == 0:
            self.first_of_streak = details
        self.consecutive += 1

    def succeeded(self) -> None:
        self.consecutive = 0

    def firsts(self) -> list[str]:
        """Each reason's first failure (with its traceback) not yet returned."""
        new, self._new = self._new, []
        return new

    def repeats(self) -> list[str]:
        """`reason (xN)` for every reason that failed again since the last call, N being those repeats."""
        since, self._since = self._since, collections.Counter()
        return [f"{reason} (x{count:,} more; {self.counts[reason]:,} in all)" for reason, count in since.most_common()]

    def report(self, repeats_since: str = "") -> list[str]:
        """The lines to print now: each new reason's first failure with its traceback, then, when `repeats_since`
        names the period ("since the last report"), one line counting the repeats in it."""
        lines = [f"group dropped: {first}" for first in self.firsts()]
        repeats = self.repeats() if repeats_since else []
        if repeats:
            lines.append(f"rollout failures repeated {repeats_since}: {'; '.join(repeats)}")
        return lines
