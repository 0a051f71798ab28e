"""Groups checked against the run (admission.py): property tests over well-formed but wrong groups."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artmlx.protocol.admission import (LOGPROB_FLOOR, REWARD_LIMIT, GroupLimits, group_problem, inbound_message_limit,
                                       printable, typed_stats)
from artmlx.protocol.codec import decode, encode
from artmlx.protocol.messages import TrajectoryGroup

LIMITS = GroupLimits(env="tictactoe", group_size=4, vocab_size=1000, max_tokens=64, max_turns=2,
                     max_reply_tokens=8)


def honest_group(lengths=(12, 10, 14, 9), replies=(3, 5), actor="a"):
    """What the engine could have produced: per episode a prompt, then up to two replies of at most 8 tokens."""
    rng = np.random.default_rng(len(lengths))
    tokens, mask, logprobs = [], [], []
    for length in lengths:
        policy = np.zeros(length, bool)
        policy[length - replies[1]:] = True
        policy[4:4 + replies[0]] = True
        tokens.append(rng.integers(0, LIMITS.vocab_size, length).astype(np.int32))
        mask.append(policy)
        logprobs.append(np.where(policy, -rng.random(length) * 20, 0).astype(np.float32))
    g = len(lengths)
    return TrajectoryGroup(
        group_id="g", actor=actor, env="tictactoe", fingerprint="fp", seed=0, policy_version=0,
        tokens=np.concatenate(tokens), policy_mask=np.concatenate(mask), logprobs=np.concatenate(logprobs),
        lengths=np.array(lengths, np.int32), rewards=np.linspace(-1, 1, g).astype(np.float32),
        scores=np.zeros(g, np.float32), turns=np.full(g, 2, np.int32), truncated=np.zeros(g, bool),
        outcomes=["win"] * g)


def test_an_honest_group_passes_and_survives_the_wire():
    group = decode(encode(honest_group()))
    assert group_problem(group, LIMITS, "a") == ""


@pytest.mark.parametrize("edit, reason", [
    (lambda g: setattr(g, "actor", "someone-else"), "sent by"),
    (lambda g: setattr(g, "env", "arithmetic"), "environment"),
    (lambda g: g.tokens.__setitem__(3, LIMITS.vocab_size), "outside the vocabulary"),
    (lambda g: g.rewards.__setitem__(0, 3e38), "rewards must lie within"),
    (lambda g: g.scores.__setitem__(1, -2e6), "scores must lie within"),
    (lambda g: g.logprobs.__setitem__(int(np.flatnonzero(g.policy_mask)[0]), -1e30), "below"),
    (lambda g: g.turns.__setitem__(0, 3), "turns"),
])
def test_each_wrong_value_is_named(edit, reason):
    group = honest_group()
    edit(group)
    assert reason in group_problem(group, LIMITS, "a")


def test_wrong_group_size_and_long_episodes_are_named():
    assert "group_size is 4" in group_problem(honest_group(lengths=(12, 10, 14)), LIMITS, "a")
    assert "more than the run allows (64)" in group_problem(honest_group(lengths=(12, 10, 65, 9)), LIMITS, "a")
    # 20 sampled tokens in one episode: more than 2 replies of 8.
    assert "sampled tokens" in group_problem(honest_group(lengths=(30, 30, 30, 30), replies=(10, 10)), LIMITS, "a")
    assert group_problem(honest_group(lengths=(30, 30, 30, 30), replies=(8, 8)), LIMITS, "a") == ""
    # a run that allows groups shortened by refused agent trajectories takes 3 of 4, not 1 or 5
    shortened = dataclasses.replace(LIMITS, min_group_size=3)
    assert group_problem(honest_group(lengths=(12, 10, 14)), shortened, "a") == ""
    assert "at least 3" in group_problem(honest_group(lengths=(12, 10)), shortened, "a")
    assert "group_size is 4" in group_problem(honest_group(lengths=(12,) * 5), shortened, "a")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_group_that_passes_is_within_every_bound(data):
    """Random edits of an honest group: whatever passes the codec and the checks is safe to train."""
    group = honest_group()
    for _ in range(data.draw(st.integers(0, 4))):
        field = data.draw(st.sampled_from(["tokens", "logprobs", "rewards", "scores", "turns", "lengths"]))
        array = getattr(group, field)
        index = data.draw(st.integers(0, len(array) - 1))
        if array.dtype.kind == "f":
            value = data.draw(st.floats(-1e38, 1e-5, allow_nan=False) if field == "logprobs"
                              else st.floats(-3e38, 3e38, allow_nan=False))
        else:
            value = data.draw(st.integers(0, 2**31 - 1))
        array[index] = value
    try:
        group = decode(encode(group))
    except Exception:
        return  # the codec's own checks refused it
    if group_problem(group, LIMITS, "a"):
        return
    assert len(group.lengths) == LIMITS.group_size
    assert group.tokens.max() < LIMITS.vocab_size and group.lengths.max() <= LIMITS.max_tokens
    assert np.abs(group.rewards).max() <= REWARD_LIMIT and np.abs(group.scores).max() <= REWARD_LIMIT
    assert group.logprobs[group.policy_mask].min() >= LOGPROB_FLOOR
    # Then the loss's inputs are finite: a group advantage and an importance ratio of any admitted value.
    rewards = group.rewards.astype(np.float64)
    assert math.isfinite((rewards - rewards.mean()).max() / (rewards.std() + 1e-6))
    assert np.isfinite(np.exp(-group.logprobs[group.policy_mask].astype(np.float64))).all()


@given(st.text(max_size=300))
def test_printable_names_carry_no_markup_or_control_characters(text):
    shown = printable(text)
    assert len(shown) <= 128 and "[" not in shown and "]" not in shown
    assert all(ch == " " or ch.isprintable() for ch in shown)


def test_stats_keep_known_keys_with_their_types():
    raw = {"gen_tokens_per_s": "fast", "peak_memory_gb": 1.5, "groups_sent": -3, "batches": True,
           "device": "[red]gpu\n", "leaving": "yes", "unknown": 1, "groups_unacked": 2}
    assert typed_stats(raw) == {"peak_memory_gb": 1.5, "device": "?red?gpu?", "groups_unacked": 2}
    assert typed_stats({"leaving": True})["leaving"] is True


def test_messages_from_actors_are_limited_by_the_run():
    assert inbound_message_limit(LIMITS) == 4 << 20  # small runs: the floor
    big = GroupLimits(env="e", group_size=64, vocab_size=10, max_tokens=65536, max_turns=1, max_reply_tokens=1)
    full = 64 * 65536
    # ids, logprobs and mask of a full group, and a teacher prompt (hints) as long as each episode
    assert inbound_message_limit(big) > full * (4 + 4 + 1 + 4)
    assert inbound_message_limit(big) < full * 14
    # The longest honest group of a run, encoded, fits.
    longest = honest_group(lengths=(LIMITS.max_tokens,) * LIMITS.group_size)
    assert sum(len(frame) for frame in encode(longest)) < inbound_message_limit(LIMITS)
