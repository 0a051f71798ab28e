"""The learner's forward (shared prompts, head only at policy positions) against the plain full forward."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.envs import make_env
from artmlx.learner.batching import common_prefix, make_units, pack_units
from artmlx.learner.grpo import token_logprobs
from artmlx.learner.settings import trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.trajectory import Episode
from tests.helpers import tiny_policy


@pytest.fixture(scope="module")
def played():
    model, tokenizer = tiny_policy(perturb=0.02)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(temperature=1.0))
    groups = engine.play([3, 4, 5], 4, mx.random.key(7))
    episodes = [e for g in groups for e in g.episodes]
    members = [list(range(i * 4, i * 4 + 4)) for i in range(3)]
    return model, episodes, members


def _full_forward(model, episodes, temperature=1.0):
    """Reference: every episode on its own through the whole model, logprobs of its policy targets."""
    out = []
    for e in episodes:
        tokens = mx.array([e.tokens])
        logp = token_logprobs(model(tokens[:, :-1]), tokens[:, 1:], temperature)[0]
        out.append(logp[mx.array(np.flatnonzero(np.array(e.policy_mask[1:])))])
    return out


def _learner_forward(model, episodes, members, **settings):
    trainer = GRPOTrainer(model, trainer_settings({"temperature": 1.0, **settings}))
    results = {}
    for batch in trainer.microbatches(episodes, np.zeros(len(episodes), np.float32), members):
        logp = trainer.policy_logprobs(batch)
        for row, index in enumerate(batch.episodes):
            mask = np.array(batch.mask[row]) > 0
            results[index] = np.array(logp[row])[mask]
    return [results[i] for i in range(len(episodes))]


def weighted_losses(trainer, batches, episodes, weights):
    """Sum of weight x logprob over every policy position: through the learner's micro-batches, and through
    the plain full forward of each episode (same value and gradients when the learner is right)."""
    def learner_loss(model):
        total = mx.array(0.0)
        for batch in batches:
            logp = trainer.policy_logprobs(batch)
            for row, index in enumerate(batch.episodes):
                positions = mx.array(np.flatnonzero(np.array(batch.mask[row]) > 0))
                total = total + (logp[row][positions] * weights[index]).sum()
        return total

    def full_loss(model):
        return sum((lp * w).sum() for lp, w in zip(_full_forward(model, episodes), weights))

    return learner_loss, full_loss


@pytest.mark.parametrize("budget", [0, 96])
def test_shared_prefix_logprobs_equal_full_forward(played, budget):
    """Whole groups per micro-batch, or groups split across several (budget 96 tokens): same logprobs."""
    model, episodes, members = played
    assert all(common_prefix([episodes[i] for i in m]) > 10 for m in members)
    expected = _full_forward(model, episodes)
    got = _learner_forward(model, episodes, members, max_batch_tokens=budget)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, np.array(e), atol=1e-5, rtol=1e-5)


def test_shared_prefix_gradients_equal_full_forward(played):
    model, episodes, members = played
    weights = [mx.array(np.random.default_rng(i).standard_normal(int(sum(e.policy_mask[1:]))).astype(np.float32))
               for i, e in enumerate(episodes)]
    trainer = GRPOTrainer(model, trainer_settings({"max_batch_tokens": 128}))
    batches = trainer.microbatches(episodes, np.zeros(len(episodes), np.float32), members)
    assert len(batches) > 1
    learner_loss, full_loss = weighted_losses(trainer, batches, episodes, weights)

    learner_grads = dict(tree_flatten(nn.value_and_grad(model, learner_loss)(model)[1]))
    full_grads = dict(tree_flatten(nn.value_and_grad(model, full_loss)(model)[1]))
    assert learner_grads.keys() == full_grads.keys() and learner_grads
    for name in full_grads:
        np.testing.assert_allclose(np.array(learner_grads[name]), np.array(full_grads[name]), atol=2e-4, rtol=1e-3)


def test_groups_whose_prompts_differ_share_only_their_common_part(played):
    model, episodes, members = played
    odd = Episode(list(episodes[0].tokens), list(episodes[0].policy_mask), list(episodes[0].logprobs))
    odd.tokens[5] = (odd.tokens[5] + 1) % 90 + 6  # a different prompt token: the shared part ends before it
    group = [episodes[1], episodes[2], odd]
    assert common_prefix(group) == 5
    expected = _full_forward(model, group)
    got = _learner_forward(model, group, [[0, 1, 2]])
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, np.array(e), atol=1e-5, rtol=1e-5)


def test_packing_keeps_groups_whole_within_the_budget():
    def episode(prompt, reply):
        return Episode([1] * prompt + [2] * reply, [False] * prompt + [True] * reply, [0.0] * prompt + [-1.0] * reply)

    episodes = [episode(10, 5 + i) for i in range(8)] + [episode(30, 2) for _ in range(4)]
    groups = [list(range(4)), list(range(4, 8)), list(range(8, 12))]
    units = make_units(episodes, groups, max_tokens=1000, pad_multiple=1)
    assert [u.prefix for u in units] == [10, 10, 30]
    assert [sorted(u.episodes) for u in units] == groups
    assert units[0].width == 8  # the longest episode (18 tokens) feeds tokens[9:17] after the prefix row
    batches = pack_units(units, max_tokens=40, pad_multiple=1)
    assert sorted(i for batch in batches for u in batch for i in u.episodes) == list(range(12))
    # A group that alone exceeds the budget is split into parts that each carry its prefix.
    split = make_units(episodes, groups[:1], max_tokens=20, pad_multiple=1)
    assert len(split) > 1 and all(u.prefix == 10 for u in split)
    assert sorted(i for u in split for i in u.episodes) == groups[0]
