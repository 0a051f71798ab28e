"""A KV cache for a batch whose sequences grow by different amounts in one forward pass.

mlx-lm's `BatchKVCache` handles ragged *prompts* by left padding. Multi-turn episodes are ragged
again at every turn (replies end at different steps, environment messages differ in length), and
re-prefilling each turn would recompute the shared context. This cache instead keeps holes:

- every forward writes a right-padded chunk of N slots per row, of which `n_new[row]` are real;
- a per-row validity mask hides the padded slots from every later query;
- RoPE positions come from a per-row `offset` that counts only real tokens, so a row's cached keys
  are exactly those of its contiguous sequence and the learner's full forward recomputes the same
  logprobs.

Call `prepare(n_new)` on every layer's cache before a forward; mlx-lm's attention then calls
`make_mask` and `update_and_fetch` as it does for its own caches.
"""

from __future__ import annotations

import mlx.core as mx


class RaggedKVCache:
    step = 256

    def __init__(self, batch_size: int):
        self.keys = None
        self.values = None
        self.valid = mx.zeros((batch_size, 0), dtype=mx.bool_)
        self.offset = mx.zeros((batch_size,), dtype=mx.int32)
        self._idx = 0
        self._n_new = None

    def prepare(self, n_new: mx.array) -> None:
        """Declare how many of the next chunk's slots hold real tokens, per row."""
        self._n_new = n_new.astype(mx.int32)

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs) -> mx.array:
        if window_size is not None:
            raise ValueError("RaggedKVCache does not support sliding-window attention")
        causal = mx.tril(mx.ones((N, N), dtype=mx.bool_))
        batch = self.offset.shape[0]
        old = mx.broadcast_to(self.valid[:, None, None, : self._idx], (batch, 1, N, self._idx))
        new = mx.broadcast_to(causal[None, None], (batch, 1, N, N))
        return mx.concatenate([old, new], axis=-1)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if self._n_new is None:
            raise RuntimeError("RaggedKVCache.prepare(n_new) must be called before each forward")
        batch, heads, n, _ = keys.shape
        start, end = self._idx, self._idx + n
        if self.keys is None or end > self.keys.shape[2]:
            grow = ((n + self.step - 1) // self.step) * self.step
            new_k = mx.zeros((batch, heads, grow, keys.shape[3]), keys.dtype)
            new_v = mx.zeros((batch, heads, grow, values.shape[3]), values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :start, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :start, :], new_v], axis=2)
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values
        chunk_valid = mx.arange(n)[None, :] < self._n_new[:, None]
        self.valid = mx.concatenate([self.valid[:, :start], chunk_valid], axis=1)
        self.offset = self.offset + self._n_new
        self._idx = end
        self._n_new = None
        return self.keys[..., :end, :], self.values[..., :end, :]

    @property
    def state(self):
        return self.keys, self.values, self.valid, self.offset

    def select(self, rows: mx.array) -> None:
        """Keep (and reorder or repeat) the given rows, in place."""
        if self.keys is not None:
            self.keys = self.keys[rows]
            self.values = self.values[rows]
        self.valid = self.valid[rows]
        self.offset = self.offset[rows]


def make_ragged_cache(model, batch_size: int) -> list[RaggedKVCache]:
    """One cache per layer; refuses models whose layers need a different cache type."""
    if hasattr(model, "make_cache"):
        kinds = {type(c).__name__ for c in model.make_cache()}
        if kinds != {"KVCache"}:
            raise ValueError(
                f"this model uses {sorted(kinds)} caches (sliding window or recurrent layers); "
                "artmlx rollouts support full-attention models only"
            )
    return [RaggedKVCache(batch_size) for _ in model.layers]


def prepare_cache(cache: list[RaggedKVCache], n_new: mx.array) -> None:
    for layer_cache in cache:
        layer_cache.prepare(n_new)


def select_rows(cache: list[RaggedKVCache], rows: mx.array) -> None:
    for layer_cache in cache:
        layer_cache.select(rows)
