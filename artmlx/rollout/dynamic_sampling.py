"""DAPO's dynamic sampling: flat groups are replaced by groups with signal before an update.

A group whose G episodes all got the same reward has zero advantage everywhere: it costs its
generation and trains nothing (the learner drops it, `learner/trainer.py`). On a weak model and a
0/1 reward most groups are flat (SmolLM2-135M on sums of 0-20: 10-14 of 16 in every update), so an
update trains on a handful of groups. Dynamic sampling (Yu et al. 2025, "DAPO", section 3.2) keeps
sampling new tasks until the batch holds `wanted` groups with signal:

- round 0 plays the update's `wanted` seeds exactly as without it (an update with no flat group is
  the same update);
- each further round plays new seeds, as many as the missing groups divided by the share of groups
  with signal seen so far (at most `wanted`), until the batch is full or `extra_rounds` are spent;
- a flat group whose episodes carry directive hints has signal (it trains through its hinted tokens), unless
  `hint_group_reward_below` leaves its hints out;
- every group with signal is kept (a last round may bring a few more than `wanted`): nothing that
  carries a gradient is thrown away. Flat groups are counted, not trained.

`artmlx run` does the same on its actors: an actor does not send a flat group and plays on
(`apps/actor.py`), so the learner's updates hold groups with signal; as in `train`, at most `extra_rounds`
flat groups in a row are skipped and the next one is sent (`skip_flat`). Without that bound a model that has
learned the task makes actors play on and on: in a 4-game-group soak on tic-tac-toe, actors had skipped 17,733
of 18,052 groups by update 370 and updates took ten times as long.
"""

from __future__ import annotations

import math
from typing import Callable

from ..trajectory import Group


def sample_with_signal(play_round: Callable[[int, int], list[Group]], wanted: int,
                       extra_rounds: int, hint_reward_below: float = 0.0) -> tuple[list[Group], dict]:
    """`play_round(round, count)` plays `count` new groups; returns the groups with signal (hinted flat groups
    only where their hints count under `hint_reward_below`, `Group.carries_signal`) and counts for
    the update's metrics row. `extra_rounds` 0 is dynamic sampling off: round 0's groups as they are. If
    no group has signal after every round, the last round's groups are returned (the trainer counts them
    as flat and makes no optimizer step)."""
    groups = play_round(0, wanted)
    if extra_rounds <= 0 or not groups:  # off, or abandoned (an actor's tick)
        return groups, {}
    kept = [group for group in groups if group.carries_signal(hint_reward_below)]
    played, rounds = len(groups), 1
    while len(kept) < wanted and rounds <= extra_rounds:
        missing = wanted - len(kept)
        count = min(wanted, math.ceil(missing * played / max(len(kept), 1)))
        groups = play_round(rounds, count)
        if not groups:
            return [], {}
        rounds += 1
        played += len(groups)
        kept += [group for group in groups if group.carries_signal(hint_reward_below)]
    counts = {"groups_sampled": played, "groups_flat_skipped": played - len(kept), "sampling_rounds": rounds}
    return (kept or groups), counts


def skip_flat(has_signal: bool, skipped_in_a_row: int, extra_rounds: int) -> bool:
    """Whether an actor drops a group instead of sending it: it is flat, dynamic sampling is on, and fewer than
    `extra_rounds` flat groups in a row were dropped before it (the bound `sample_with_signal` keeps per update)."""
    return extra_rounds > 0 and not has_signal and skipped_in_a_row < extra_rounds
