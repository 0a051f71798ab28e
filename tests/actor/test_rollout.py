import mlx.core as mx
import numpy as np
import pytest

from artmlx.actor.ragged_cache import make_ragged_cache, prepare_cache, select_rows
from artmlx.actor.rollout import RolloutEngine, SamplingParams, sample_tokens
from artmlx.chat import ChatFormat
from artmlx.envs import make_env
from artmlx.learner.batching import make_microbatch
from artmlx.learner.grpo import token_logprobs
from tests.helpers import tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(perturb=0.02)


def test_ragged_cache_matches_full_forward(policy):
    """Ragged chunks with holes give each row the logits of its own contiguous sequence."""
    model, _ = policy
    rng = np.random.default_rng(0)
    rows = [[int(t) for t in rng.integers(6, 100, size=n)] for n in (5, 9, 2)]
    later = [[int(t) for t in rng.integers(6, 100, size=n)] for n in (3, 1, 6)]
    cache = make_ragged_cache(model, 3)
    for chunks in (rows, later):
        width = max(map(len, chunks))
        padded = np.zeros((3, width), np.int32)
        for i, c in enumerate(chunks):
            padded[i, : len(c)] = c
        prepare_cache(cache, mx.array([len(c) for c in chunks]))
        out = model(mx.array(padded), cache=cache)
    for i in range(3):
        full = rows[i] + later[i]
        expected = model(mx.array([full]))[0, -len(later[i]):]
        np.testing.assert_allclose(np.array(out[i, : len(later[i])]), np.array(expected), atol=2e-4, rtol=1e-4)
    # Reordering/repeating rows keeps each row's state.
    select_rows(cache, mx.array([2, 2, 0]))
    assert cache[0].offset.tolist() == [8, 8, 8]


def test_sampled_logprobs_are_tempered_log_softmax():
    logits = mx.array([[0.0, 1.0, 2.0], [2.0, 0.0, -1.0]])
    for temperature in (1.0, 0.5):
        tokens, logprobs = sample_tokens(logits, temperature, mx.random.key(3))
        scaled = np.array(logits) / temperature
        ref = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
        np.testing.assert_allclose(np.array(logprobs), ref[np.arange(2), np.array(tokens)], rtol=1e-5)
    greedy, _ = sample_tokens(logits, 0.0, mx.random.key(0))
    assert greedy.tolist() == [2, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_learner_recompute(policy, temperature):
    """With unchanged weights the importance ratio is 1: the sampler's logprobs are the learner's."""
    model, tokenizer = policy
    engine = RolloutEngine(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(temperature=temperature))
    groups = engine.play([11, 12, 13], 4, mx.random.key(1))
    episodes = [e for g in groups for e in g.episodes]
    assert max(e.turns for e in episodes) >= 2, "need multi-turn episodes to exercise the cache"
    batch = make_microbatch(episodes, np.zeros(len(episodes)), list(range(len(episodes))))
    recomputed = np.array(token_logprobs(model(batch.inputs), batch.targets, temperature))
    mask = np.array(batch.mask) > 0
    diff = (recomputed - np.array(batch.behaviour_logprobs))[mask]
    ratio = np.exp(diff)
    assert mask.sum() > 20
    assert np.abs(diff).max() < 1e-3
    assert abs(ratio.mean() - 1.0) < 1e-4


def test_transcripts_are_exact_token_records(policy):
    model, tokenizer = policy
    chat = ChatFormat(tokenizer)
    engine = RolloutEngine(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(max_reply_tokens=4))
    groups = engine.play([5, 6], 3, mx.random.key(2), policy_version=7)
    assert [g.seed for g in groups] == [5, 6] and all(g.policy_version == 7 for g in groups)
    for group in groups:
        prompt = chat.prompt_ids(make_env("tictactoe").reset(group.seed))
        assert len(group.episodes) == 3
        for episode in group.episodes:
            assert episode.tokens[: len(prompt)] == prompt
            assert not any(episode.policy_mask[: len(prompt)])
            mask = np.array(episode.policy_mask)
            logprobs = np.array(episode.logprobs)
            assert (logprobs[~mask] == 0).all() and (logprobs[mask] <= 0).all()
            # Every reply is at most max_reply_tokens long and ends a turn.
            runs = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
            lengths = np.flatnonzero(runs == -1) - np.flatnonzero(runs == 1)
            assert len(lengths) == episode.turns and lengths.max() <= 4
            assert episode.info.get("outcome") in ("win", "draw", "loss", "illegal") or episode.truncated


def test_episode_replay_reproduces_environment_messages(policy):
    """Re-running the environment on the decoded replies reproduces the recorded env tokens."""
    model, tokenizer = policy
    chat = ChatFormat(tokenizer)
    engine = RolloutEngine(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    (group,) = engine.play([21], 6, mx.random.key(4))
    for episode in group.episodes:
        env = make_env("tictactoe")
        rebuilt = chat.prompt_ids(env.reset(21))
        mask = episode.policy_mask
        i = len(rebuilt)
        while i < len(episode.tokens):
            j = i
            while j < len(episode.tokens) and mask[j]:
                j += 1
            reply = episode.tokens[i:j]
            rebuilt += reply
            result = env.step(chat.reply_text(reply))
            if result.done:
                break
            rebuilt += chat.continuation_ids(result.messages, reply[-1])
            i = len(rebuilt)
        assert rebuilt == episode.tokens
