import mlx.core as mx
import numpy as np
import pytest

from artmlx.chat import ChatFormat
from artmlx.envs import make_env
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from tests.helpers import learner_logprobs, tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(perturb=0.02)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_learner_recompute(policy, temperature):
    """With unchanged weights the importance ratio is 1: the sampler's logprobs are the learner's."""
    model, tokenizer = policy
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(temperature=temperature))
    groups = engine.play([11, 12, 13], 4, mx.random.key(1))
    assert max(e.turns for g in groups for e in g.episodes) >= 2, "need multi-turn episodes to exercise the cache"
    recomputed, behaviour = learner_logprobs(model, groups, temperature)
    diff = recomputed - behaviour
    assert len(diff) > 20
    assert np.abs(diff).max() < 1e-3
    assert abs(np.exp(diff).mean() - 1.0) < 1e-4


def test_transcripts_are_exact_token_records(policy):
    model, tokenizer = policy
    chat = ChatFormat(tokenizer)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(max_reply_tokens=4))
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
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
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
