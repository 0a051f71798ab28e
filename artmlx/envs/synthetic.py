"""A synthetic workload of controlled lengths, for throughput and memory benchmarks.

Each task is a prompt of `prompt_tokens` random three-letter words; the policy replies, the
environment answers with `user_tokens` more words, for `turns` replies in all. The reward of each
reply is a hash of its text mapped to [0, 1) (so rewards vary within a group and every group
trains), summed over the episode; `info["score"]` is the mean. On the tokenizers of
`artmlx model synth` a space and a three-letter word are exactly one token, so prompt and answer
lengths are exact there; with other tokenizers they are whatever those words tokenize to.
A random-weight model almost never samples an end-of-turn token (1 in ~150,000), so its replies run
to `max_reply_tokens`: the workload's lengths are the run's settings.
"""

from __future__ import annotations

import hashlib
import random
import string

from .base import StepResult

_LETTERS = string.ascii_lowercase


def _words(rng: random.Random, count: int) -> str:
    return "".join(" " + "".join(rng.choice(_LETTERS) for _ in range(3)) for _ in range(count))


class Synthetic:
    name = "synthetic"
    outcomes = ()

    def __init__(self, prompt_tokens: int = 256, turns: int = 2, user_tokens: int = 32):
        for label, value, low in (("prompt_tokens", prompt_tokens, 1), ("turns", turns, 1), ("user_tokens", user_tokens, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"synthetic {label} must be an integer >= {low}, got {value!r}")
        self.prompt_tokens, self.turns, self.user_tokens = prompt_tokens, turns, user_tokens
        self.rng = random.Random(0)
        self.turn = 0
        self.total = 0.0

    def reset(self, seed: int) -> list[dict]:
        self.rng = random.Random(seed)
        self.turn, self.total = 0, 0.0
        return [{"role": "user", "content": _words(self.rng, self.prompt_tokens)}]

    def step(self, assistant_text: str) -> StepResult:
        self.turn += 1
        digest = hashlib.blake2b(assistant_text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        reward = int.from_bytes(digest, "big") / 2**64
        self.total += reward
        done = self.turn >= self.turns
        info = {"score": self.total / self.turn}
        messages = [] if done else [{"role": "user", "content": _words(self.rng, self.user_tokens)}]
        return StepResult(messages, reward, done, info)
