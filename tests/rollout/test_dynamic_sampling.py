"""DAPO's dynamic sampling (`rollout/dynamic_sampling.py`): flat groups replaced, rounds bounded, counts exact."""

import random

from artmlx.rollout.dynamic_sampling import sample_with_signal
from artmlx.trajectory import Episode, Group


def group(seed: int, rewards: list[float]) -> Group:
    return Group(seed, [Episode([1], [True], [-0.5], reward=r) for r in rewards], 0)


class Rounds:
    """Plays groups whose signal is decided by a seeded coin: `signal` is the chance a group has signal."""

    def __init__(self, signal: float, seed: int = 0):
        self.rng, self.signal, self.calls, self.next_seed = random.Random(seed), signal, [], 0

    def __call__(self, round_index: int, count: int) -> list[Group]:
        self.calls.append((round_index, count))
        played = []
        for _ in range(count):
            rewards = [0.0, 1.0] if self.rng.random() < self.signal else [0.0, 0.0]
            played.append(group(self.next_seed, rewards))
            self.next_seed += 1
        return played


def test_off_returns_round_zero_as_it_is():
    rounds = Rounds(signal=0.3)
    groups, counts = sample_with_signal(rounds, 8, extra_rounds=0)
    assert len(groups) == 8 and counts == {} and rounds.calls == [(0, 8)]


def test_flat_groups_are_replaced_until_the_batch_is_full_and_counted():
    rounds = Rounds(signal=0.4, seed=1)
    groups, counts = sample_with_signal(rounds, 8, extra_rounds=10)
    assert len(groups) >= 8 and not any(g.flat for g in groups)
    assert counts["groups_sampled"] == sum(count for _, count in rounds.calls)
    assert counts["groups_flat_skipped"] == counts["groups_sampled"] - len(groups)
    assert counts["sampling_rounds"] == len(rounds.calls)
    # each further round asks for the missing groups scaled by the share with signal so far, at most `wanted`
    assert all(count <= 8 for _, count in rounds.calls)


def test_a_batch_with_signal_everywhere_is_the_same_update():
    rounds = Rounds(signal=1.0)
    groups, counts = sample_with_signal(rounds, 6, extra_rounds=4)
    assert [g.seed for g in groups] == list(range(6)) and rounds.calls == [(0, 6)]
    assert counts == {"groups_sampled": 6, "groups_flat_skipped": 0, "sampling_rounds": 1}


def test_rounds_are_bounded_and_an_all_flat_batch_is_returned_for_the_trainer_to_skip():
    rounds = Rounds(signal=0.0)
    groups, counts = sample_with_signal(rounds, 4, extra_rounds=3)
    assert len(rounds.calls) == 4 and counts["sampling_rounds"] == 4
    assert groups and all(g.flat for g in groups) and counts["groups_flat_skipped"] == counts["groups_sampled"]


def test_an_abandoned_round_ends_sampling_with_nothing():
    calls = []

    def play(round_index, count):
        calls.append(round_index)
        return [group(0, [0.0, 0.0])] * count if round_index == 0 else []

    assert sample_with_signal(play, 4, extra_rounds=3) == ([], {})
    assert calls == [0, 1]


def test_an_actor_drops_at_most_extra_rounds_flat_groups_in_a_row():
    from artmlx.rollout.dynamic_sampling import skip_flat

    signals = [False] * 10 + [True] + [False] * 3
    sent, in_a_row = [], 0
    for index, has_signal in enumerate(signals):
        if skip_flat(has_signal, in_a_row, extra_rounds=4):
            in_a_row += 1
            continue
        in_a_row = 0
        sent.append(index)
    # 4 dropped, the 5th sent; 4 dropped, the 10th sent; the group with signal always; 3 flat ones dropped
    assert sent == [4, 9, 10]
    assert not skip_flat(False, 0, extra_rounds=0) and not skip_flat(True, 0, extra_rounds=4)
