"""The generation engine: batched prefill and decode over a ragged KV cache, with sampler logprobs.

Everything that generates (environment rollouts, evaluation, and later the server) drives this.

- `prefill(cache, sequences)` feeds one right-padded chunk per row (a prompt, or an environment's
  answer after a reply) and returns the logits after each row's last real token. The trunk runs
  in column chunks of at most `prefill_tokens` tokens (from the memory plan), each evaluated before
  the next, so activations never exceed the workspace; the head (a 150,000-token vocabulary for
  Qwen) is applied only to the one hidden state per row that will be sampled, not to B x N
  positions.
- `decode(cache, logits, key, ...)` samples every row until each has produced a stop token or
  `max_tokens`, one forward per step for the whole batch. The host synchronises at steps 2, 4, 8, ...
  (to stop once every row has ended), never once per token.
- Sampling is plain temperature sampling by `sampling.sample` (the rule the server's scheduler uses
  too); the recorded logprob of a sampled token is its log probability under the tempered
  distribution it was drawn from, which is what the learner recomputes (temperature 0: greedy,
  logprob of the untempered distribution).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..model.families import check_supported, window_layers
from ..model.parts import model_parts
from .cache import RaggedCache
from .memory import MemoryPlan
from .prefix_cache import PrefixCache
from .sampling import sample


def sample_tokens(logits: mx.array, temperature: float, key: mx.array) -> tuple[mx.array, mx.array]:
    """Sample one token per row at one temperature; return it with its logprob under the tempered
    distribution (the rule of `sampling.sample`, with no options)."""
    tokens, logprobs = sample(logits, np.full((logits.shape[0],), temperature, np.float32), key)[:2]
    return tokens, logprobs


class Engine:
    """Batched generation for one model; `plan` (optional) bounds prefill chunks by memory."""

    def __init__(self, model, plan: MemoryPlan | None = None, cache_block: int = 256):
        check_supported(model)  # its layers must be ones the ragged cache holds
        self.windows = window_layers(model)  # sliding-window layers: their caches keep slot positions
        self.windowed = bool(self.windows)
        self.window = max(self.windows.values(), default=None)  # the widest sliding window
        self.model = model
        self.parts = model_parts(model)
        self.plan = plan
        self.cache_block = cache_block

    def new_cache(self, rows: int) -> RaggedCache:
        # the model's layout, read once at construction (every admission makes a cache)
        return RaggedCache(self.parts.cache_layers, rows, self.cache_block, self.windowed, self.parts.recurrent,
                           self.windows)

    def new_prefix_cache(self, max_bytes: int) -> PrefixCache:
        """A prefix cache for this model: whole entries only if it has recurrent layers, its window if any."""
        return PrefixCache(max_bytes, whole_entries=bool(self.parts.recurrent), window=self.window)

    def prefill(self, cache: RaggedCache, sequences: list[list[int]]) -> mx.array:
        """Feed one ragged chunk per row; return each row's logits after its last real token, (rows, V)."""
        lengths = np.array([len(s) for s in sequences])
        if lengths.min() == 0:
            raise ValueError("empty chunk to prefill: every row needs at least one token")
        rows, width = len(sequences), int(lengths.max())
        padded = np.zeros((rows, width), dtype=np.int32)
        for row, seq in enumerate(sequences):
            padded[row, : len(seq)] = seq
        columns = width
        if self.plan is not None:
            columns = max(1, self.plan.prefill_tokens(cache.used + width) // rows)
        last = lengths - 1
        hidden = None
        for start in range(0, width, columns):
            stop = min(start + columns, width)
            n_new = np.clip(lengths - start, 0, stop - start)
            h = cache.forward(self.parts.trunk, mx.array(padded[:, start:stop]), n_new)
            here = (last >= start) & (last < stop)
            picked = mx.take_along_axis(h, mx.array(np.clip(last - start, 0, stop - start - 1))[:, None, None], axis=1)[:, 0]
            hidden = picked if hidden is None else mx.where(mx.array(here)[:, None], picked, hidden)
            if stop < width:  # bound the workspace: finish this chunk before building the next
                mx.eval(hidden, cache.arrays())
        return self.parts.head(hidden)

    def decode(self, cache: RaggedCache, logits: mx.array, key: mx.array, *, temperature: float,
               max_tokens: int, stop_tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample replies for all rows until each ends (a stop token) or reaches `max_tokens`.

        Returns numpy arrays (rows, steps): tokens, logprobs, and whether each token is part of the
        reply (False after the row's stop token). The last sampled column is not fed to the cache.
        """
        stop = mx.array(sorted(stop_tokens))
        alive = mx.ones((logits.shape[0],), dtype=mx.bool_)
        tokens, logprobs, valid = [], [], []
        check_at = 2
        for step in range(max_tokens):
            key, step_key = mx.random.split(key)
            token, logprob = sample_tokens(logits, temperature, step_key)
            tokens.append(token)
            logprobs.append(logprob)
            valid.append(alive)
            alive = alive & ~(token[:, None] == stop[None, :]).any(axis=-1)
            if step + 1 == max_tokens:
                break
            if step + 1 == check_at:
                check_at *= 2
                if not alive.any().item():
                    break
            h = cache.forward(self.parts.trunk, token[:, None], valid[-1].astype(mx.int32))
            logits = self.parts.head(h[:, -1, :])
            # Evaluating the step's logprob now frees its (rows x vocabulary) distribution; left lazy until
            # the end, every step's would stay alive (20 GB for 256 rows x 128 steps of Qwen's vocabulary).
            mx.async_eval(logits, alive, logprob)
        stacked = mx.stack(tokens, axis=1), mx.stack(logprobs, axis=1), mx.stack(valid, axis=1)
        mx.eval(*stacked)
        return tuple(np.array(a) for a in stacked)
