"""Batched multi-turn rollouts: play many groups of episodes in one batch, recording what was sampled.

All episodes of all requested groups share one batch. Each distinct prompt is prefilled once and
its KV cache is repeated for the G episodes of its group. Each turn then decodes every live
episode together (one forward per token for the whole batch), hands the replies to the
environments, and prefills the environment's answers as one ragged chunk into the same cache
(`RaggedKVCache`), so no context is recomputed across turns.

Sampling is plain temperature sampling; the recorded logprob of a sampled token is taken from the
tempered distribution it was drawn from, which is exactly what the learner recomputes. The host
synchronises only at turn boundaries and at decode steps 2, 4, 8, ... (to stop once every reply has
ended), never once per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import numpy as np

from ..chat import ChatFormat
from ..envs.base import Env
from ..trajectory import Episode, Group
from .ragged_cache import make_ragged_cache, prepare_cache, select_rows


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    max_reply_tokens: int = 8
    max_turns: int = 10
    max_episode_tokens: int = 2048


def sample_tokens(logits: mx.array, temperature: float, key: mx.array) -> tuple[mx.array, mx.array]:
    """Sample one token per row; return it with its logprob under the tempered distribution.

    Temperature 0 means greedy; the logprob is then that of the untempered distribution.
    """
    logits = logits.astype(mx.float32)
    if temperature == 0:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        tokens = mx.argmax(logits, axis=-1)
    else:
        scaled = logits / temperature
        logprobs = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
        tokens = mx.random.categorical(logprobs, key=key)
    return tokens, mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


@dataclass
class _Live:
    """An episode being played: its environment, transcript so far and cached length."""

    env: Env
    episode: Episode
    cached: int


class RolloutEngine:
    def __init__(self, model, tokenizer, make_env: Callable[[], Env], sampling: SamplingParams):
        self.model = model
        self.chat = ChatFormat(tokenizer)
        self.make_env = make_env
        self.sampling = sampling
        self.eos = mx.array(sorted(self.chat.eos_token_ids))

    def play(self, seeds: list[int], group_size: int, key: mx.array, policy_version: int = 0) -> list[Group]:
        """Play `group_size` episodes for each seed, all in one batch."""
        openings = []
        live: list[_Live] = []
        for seed in seeds:
            envs = [self.make_env() for _ in range(group_size)]
            messages = [env.reset(seed) for env in envs]
            if any(m != messages[0] for m in messages):
                raise ValueError(f"env.reset({seed}) returned different messages for one seed; it must be deterministic")
            prompt = self.chat.prompt_ids(messages[0])
            openings.append(prompt)
            for env in envs:
                episode = Episode(list(prompt), [False] * len(prompt), [0.0] * len(prompt))
                live.append(_Live(env, episode, len(prompt)))

        cache = make_ragged_cache(self.model, len(seeds))
        logits = self._prefill(cache, openings)
        rows = mx.repeat(mx.arange(len(seeds)), group_size)
        select_rows(cache, rows)
        logits = logits[rows]

        active = list(range(len(live)))
        for turn in range(self.sampling.max_turns):
            key, turn_key = mx.random.split(key)
            tokens, logprobs, valid = self._decode(cache, logits, turn_key)
            keep, pending = [], []
            for row, index in enumerate(active):
                if self._take_turn(live[index], tokens[row], logprobs[row], valid[row], turn):
                    keep.append(row)
                    pending.append(live[index].episode.tokens[live[index].cached :])
            if not keep:
                break
            select_rows(cache, mx.array(keep))
            active = [active[row] for row in keep]
            logits = self._prefill(cache, pending)
            for index in active:
                live[index].cached = len(live[index].episode.tokens)

        groups = []
        for g, seed in enumerate(seeds):
            episodes = [item.episode for item in live[g * group_size : (g + 1) * group_size]]
            groups.append(Group(seed=seed, episodes=episodes, policy_version=policy_version))
        return groups

    def _take_turn(self, item: _Live, tokens, logprobs, valid, turn: int) -> bool:
        """Record one reply, step the environment; True if the episode goes on."""
        episode = item.episode
        n_reply = int(valid.sum())
        reply = tokens[:n_reply].tolist()
        episode.tokens += reply
        episode.policy_mask += [True] * n_reply
        episode.logprobs += logprobs[:n_reply].tolist()
        episode.turns += 1
        # The last sampled column is never fed back; earlier real tokens are in the cache.
        item.cached += int(valid[: len(valid) - 1].sum())
        result = item.env.step(self.chat.reply_text(reply))
        episode.reward += float(result.reward)
        episode.info = dict(result.info)
        if result.done:
            return False
        if turn + 1 >= self.sampling.max_turns or len(episode.tokens) >= self.sampling.max_episode_tokens:
            episode.truncated = True
            return False
        continuation = self.chat.continuation_ids(result.messages, reply[-1] if reply else None)
        episode.tokens += continuation
        episode.policy_mask += [False] * len(continuation)
        episode.logprobs += [0.0] * len(continuation)
        return True

    def _prefill(self, cache, sequences: list[list[int]]) -> mx.array:
        """Feed ragged chunks (right padded); return each row's logits after its last real token."""
        lengths = [len(s) for s in sequences]
        if min(lengths) == 0:
            raise ValueError("empty chunk to prefill: the chat template produced no continuation tokens")
        width = max(lengths)
        padded = np.zeros((len(sequences), width), dtype=np.int32)
        for row, seq in enumerate(sequences):
            padded[row, : len(seq)] = seq
        n_new = mx.array(lengths)
        prepare_cache(cache, n_new)
        out = self.model(mx.array(padded), cache=cache)
        return mx.take_along_axis(out, (n_new - 1)[:, None, None], axis=1)[:, 0, :]

    def _decode(self, cache, logits: mx.array, key: mx.array):
        """Sample replies for all rows until each ends (EOS) or hits max_reply_tokens.

        Returns numpy arrays (rows, steps): tokens, logprobs, and whether each token is part of
        the reply (False after the row's EOS).
        """
        temperature = self.sampling.temperature
        alive = mx.ones((logits.shape[0],), dtype=mx.bool_)
        tokens, logprobs, valid = [], [], []
        check_at = 2
        for step in range(self.sampling.max_reply_tokens):
            key, step_key = mx.random.split(key)
            token, logprob = sample_tokens(logits, temperature, step_key)
            tokens.append(token)
            logprobs.append(logprob)
            valid.append(alive)
            alive = alive & ~(token[:, None] == self.eos[None, :]).any(axis=-1)
            if step + 1 == self.sampling.max_reply_tokens:
                break
            if step + 1 == check_at:
                check_at *= 2
                if not alive.any().item():
                    break
            prepare_cache(cache, valid[-1])
            logits = self.model(token[:, None], cache=cache)[:, -1, :]
            mx.async_eval(logits, alive)
        stacked = mx.stack(tokens, axis=1), mx.stack(logprobs, axis=1), mx.stack(valid, axis=1)
        mx.eval(*stacked)
        return tuple(np.array(a) for a in stacked)
