"""Environment rollouts: play groups of multi-turn episodes in batches, recording what was sampled.

All episodes of a batch of groups share one ragged KV cache (`engine/`). Each distinct prompt is
prefilled once and its cache rows repeated for the G episodes of its group. Each turn decodes every
live episode together, hands the replies to the environments, and prefills the environments'
answers as one ragged chunk into the same cache, so no context is recomputed across turns.
Transcripts are token ids appended as sampled, never re-tokenised text.

With a memory plan, at most `max_rows` episodes are played at once (the KV cache rule in
`engine/memory.py`); more groups than fit are played in successive batches, each with its own
split of the sampling key. `tick`, if given, is called between turns (an actor reads its socket
there); when it returns True the batch is abandoned and `play` returns no groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from ..chat import ChatFormat
from ..engine.generate import Engine
from ..engine.memory import MemoryPlan, slots_for
from ..model.policy import set_adapter_weights
from ..envs.base import Env
from ..hints import hinted_messages
from ..trajectory import Episode, Group
from .base import FailureLog


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    max_reply_tokens: int = 8
    max_turns: int = 10
    max_episode_tokens: int = 2048
    hint_form: str = "instruction"  # where a hint goes in its teacher's prompt (`hints.HINT_FORMS`)

    @classmethod
    def from_config(cls, config) -> "SamplingParams":
        return cls(temperature=config.temperature, max_reply_tokens=config.max_reply_tokens,
                   max_turns=config.max_turns, max_episode_tokens=config.max_episode_tokens,
                   hint_form=config.hint_form)

    @property
    def slots_per_row(self) -> int:
        return slots_for(self.max_episode_tokens, self.max_reply_tokens)


@dataclass
class _Live:
    """An episode being played: its environment, transcript so far and cached length."""

    env: Env
    episode: Episode
    cached: int
    opening: list[dict]  # the messages `env.reset` gave: a hint's teacher context starts from them


class EpisodeRollouts:
    def __init__(self, model, tokenizer, make_env: Callable[[], Env], sampling: SamplingParams,
                 plan: MemoryPlan | None = None, tick: Callable[[], bool] | None = None):
        self.engine = Engine(model, plan)
        self.tick = tick
        self.chat = ChatFormat(tokenizer)
        self.make_env = make_env
        self.sampling = sampling
        self.plan = plan
        self.failures = FailureLog()  # stays empty: an environment's errors raise

    def set_adapter(self, make_tensors: Callable[[], dict], version: int) -> None:
        """Replace the adapter in place (no reload) between batches; `make_tensors()` gives its arrays."""
        set_adapter_weights(self.engine.model, make_tensors())
        mx.eval(self.engine.model.parameters())

    def close(self) -> None:
        """Nothing runs in the background here (agent rollouts stop their server thread)."""

    @property
    def stats(self) -> dict:
        """Counts for the actor's heartbeat: an environment's episodes either play or raise, none to report."""
        return {}

    @property
    def max_rows(self) -> int:
        """Episodes played at once: what the memory plan allows, unbounded without one."""
        return self.plan.rows_per_batch(self.sampling.slots_per_row) if self.plan else 1 << 30

    def groups_per_batch(self, group_size: int) -> int:
        return max(1, self.max_rows // group_size)

    def play(self, seeds: list[int], group_size: int, key: mx.array, policy_version: int = 0) -> list[Group]:
        """Play `group_size` episodes for each seed, as few batches as memory allows."""
        per_batch = self.groups_per_batch(group_size)
        if len(seeds) <= per_batch:
            return self._play_batch(seeds, group_size, key, policy_version)
        groups = []
        for start in range(0, len(seeds), per_batch):
            key, batch_key = mx.random.split(key)
            batch = self._play_batch(seeds[start : start + per_batch], group_size, batch_key, policy_version)
            if not batch:  # abandoned (tick)
                return []
            groups += batch
        return groups

    def _play_batch(self, seeds: list[int], group_size: int, key: mx.array, policy_version: int) -> list[Group]:
        openings = []
        live: list[_Live] = []
        for seed in seeds:
            envs = [self.make_env() for _ in range(group_size)]
            messages = [env.reset(seed) for env in envs]
            if any(m != messages[0] for m in messages):
                raise ValueError(f"env.reset({seed}) returned different messages for one seed; it must be deterministic")
            prompt = self.chat.prompt_ids(messages[0])
            if len(prompt) >= self.sampling.max_episode_tokens:
                raise ValueError(f"env.reset({seed}) gave a prompt of {len(prompt)} tokens, not less than "
                                 f"max_episode_tokens ({self.sampling.max_episode_tokens}); raise max_episode_tokens")
            openings.append(prompt)
            for env in envs:
                episode = Episode(list(prompt), [False] * len(prompt), [0.0] * len(prompt))
                live.append(_Live(env, episode, len(prompt), messages[0]))

        engine, sampling = self.engine, self.sampling
        cache = engine.new_cache(len(seeds))
        logits = engine.prefill(cache, openings)  # each distinct prompt once
        rows = mx.repeat(mx.arange(len(seeds)), group_size)
        cache.select(rows)
        logits = logits[rows]

        active = list(range(len(live)))
        for turn in range(sampling.max_turns):
            if self.tick is not None and self.tick():
                return []
            key, turn_key = mx.random.split(key)
            tokens, logprobs, valid = engine.decode(cache, logits, turn_key, temperature=sampling.temperature,
                                                    max_tokens=sampling.max_reply_tokens,
                                                    stop_tokens=self.chat.eos_token_ids)
            keep, pending = [], []
            for row, index in enumerate(active):
                if self._take_turn(live[index], tokens[row], logprobs[row], valid[row], turn):
                    keep.append(row)
                    pending.append(live[index].episode.tokens[live[index].cached :])
            if not keep:
                break
            if min(map(len, pending)) == 0:
                raise ValueError("the chat template produced no continuation tokens after a reply")
            cache.select(mx.array(keep))
            active = [active[row] for row in keep]
            logits = engine.prefill(cache, pending)
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
        hint = episode.info.pop("hint", None)
        if hint is not None:  # the latest hint of the episode is its teacher's (learner/distill.py)
            episode.teacher_prompt = self.chat.prompt_ids(hinted_messages(item.opening, hint, self.sampling.hint_form))
        if result.done:
            return False
        continuation = self.chat.continuation_ids(result.messages, reply[-1] if reply else None)
        # An episode ends before the environment's answer would take it to max_episode_tokens, so no
        # transcript exceeds max_episode_tokens + max_reply_tokens (the learner rejects longer ones).
        if turn + 1 >= self.sampling.max_turns or len(episode.tokens) + len(continuation) >= self.sampling.max_episode_tokens:
            episode.truncated = True
            return False
        episode.tokens += continuation
        episode.policy_mask += [False] * len(continuation)
        episode.logprobs += [0.0] * len(continuation)
        return True
