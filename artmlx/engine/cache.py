"""A KV cache for a batch whose rows grow by different amounts in one forward pass.

mlx-lm's `BatchKVCache` handles ragged *prompts* by left padding. Multi-turn episodes are ragged
again at every turn (replies end at different steps, environment messages differ in length), and
re-prefilling each turn would recompute the shared context. This cache keeps holes instead:

- every forward writes a right-padded chunk of N slots per row, of which `n_new[row]` are real;
- a per-row validity mask hides the padded slots from every later query;
- RoPE positions come from a per-row `offset` that counts only real tokens, so a row's cached keys
  are exactly those of its contiguous sequence and the learner's full forward recomputes the same
  logprobs.

The row state (validity, offsets, the write position) is one object shared by all layers and
advanced once per forward (`RaggedCache.forward`), not once per layer; keys and values live in
per-layer buffers that grow in blocks of `block` slots, so a decode step writes in place and
concatenates nothing. mlx-lm's attention calls `make_mask` (on the first layer's cache) and each
layer's `update_and_fetch` and reads `offset` for RoPE, as it does with its own caches.

Sliding-window layers keep only the slots some row may still see: once a window layer's buffer holds
`window + 2 * block` slots past `window_base`, the cache finds the first slot any row's next query can
reach (positions p > offset - window; every later query is further on) and drops the slots before it
from every window layer (one host read of the slot positions, a copy of the window layers' buffers).
Full-attention layers keep every slot. A window layer's buffer starts at slot `window_base`; a slot
below it that reappears (after a join or a compaction) holds zeros and is always outside the window.

Recurrent layers (Gated DeltaNet in Qwen3.5 / Qwen3-Next, LFM2's short convolutions) keep a state per
row instead of slots (`LayerState`, mlx-lm's `ArraysCache` interface): the layer reads its state, and
`make_mask` / `lengths` tell it which positions of the chunk are real, so a padded position leaves the
state unchanged and the convolution's window ends at the row's last real token (mlx-lm's own batched
generation uses the same two fields). Holes in older slots do not concern them: the state already
summarises a row's real tokens. Rows are selected, repeated and joined as KV rows are.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..model.lora_kernel import inference
from ..model.masks import window_visible


class RowState:
    """What all layers share: which slots are real, each row's position, where the next chunk goes."""

    def __init__(self, batch_size: int, windowed: bool = False, window: int | None = None):
        self.valid = mx.zeros((batch_size, 0), dtype=mx.bool_)
        self.window = window  # the widest sliding window of the bounded layers (None: no layer is bounded)
        self.window_base = 0  # first slot the bounded layers' buffers hold
        # per row: how many of its first real slots the bounded layers hold as zeros (moved to or above
        # window_base by a compaction or a join); the real slots below window_base are its first ones too
        self.window_dropped = np.zeros((batch_size,), np.int64)
        self.offset = mx.zeros((batch_size,), dtype=mx.int32)
        # Each slot's position, kept only for models with sliding-window layers (their masks need it)
        self.positions = mx.zeros((batch_size, 0), dtype=mx.int32) if windowed else None
        self.used = 0  # slots written so far (real or hole)
        self.n_new: mx.array | None = None
        self.chunk_full = False  # during a forward: known on the host that every row's chunk is all real
        self.width = 0
        # Known on the host: every slot below `used` is real in every row (one sequence, or rows that
        # grew alike). Attention then needs no mask array: None for one new token, "causal" for a chunk,
        # as mlx-lm's KVCache gives, which lets MLX take its fused attention and saves the mask's kernels.
        self.dense = True

    @property
    def rows(self) -> int:
        return self.offset.shape[0]


class LayerKV:
    """One layer's keys and values over the shared `RowState`."""

    def __init__(self, state: RowState, block: int, bounded: bool = False):
        self.state = state
        self.block = block
        self.bounded = bounded  # a sliding-window layer: its buffer starts at `state.window_base`
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def first_slot(self) -> int:
        return self.state.window_base if self.bounded else 0

    @property
    def offset(self) -> mx.array:
        return self.state.offset

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs) -> mx.array:
        state = self.state
        if window_size is not None:
            if return_array or not self._window_covers(N, window_size):
                return self._window_mask(N, window_size)
            return None if N == 1 else "causal"
        if state.dense and not return_array:
            return None if N == 1 else "causal"
        causal = mx.tril(mx.ones((N, N), dtype=mx.bool_))
        rows, used = state.rows, state.used
        old = mx.broadcast_to(state.valid[:, None, None, :used], (rows, 1, N, used))
        new = mx.broadcast_to(causal[None, None], (rows, 1, N, N))
        return mx.concatenate([old, new], axis=-1)

    def _window_covers(self, N: int, window: int) -> bool:
        """Whether, in a dense cache, a window layer's every buffered slot and the chunk lie inside every
        query's window, so that the window mask equals the causal one (no mask array: MLX's fused attention
        serves it; on CUDA an array mask sends decode attention to the unfused path)."""
        state = self.state
        return (state.dense and state.positions is not None and not state.window_dropped.any()
                and state.used + N - 1 - state.window_base < window)

    def _window_mask(self, N: int, window: int) -> mx.array:
        """A sliding-window layer's mask: a query at position q sees the real slots at positions
        q - window < p <= q (mlx-lm's `create_causal_mask(window_size=...)`), whatever their slot."""
        state = self.state
        if state.positions is None:
            raise RuntimeError("this cache keeps no slot positions: make it with windowed=True")
        used, base = state.used, state.window_base  # the slots a window layer's buffer holds
        query = state.offset[:, None] + mx.arange(N)[None, :]  # (rows, N)
        old = state.valid[:, None, base:used] & window_visible(query, state.positions[:, base:used], window)
        chunk = mx.arange(N)
        new = mx.broadcast_to(window_visible(chunk, chunk, window)[None], (state.rows, N, N))
        return mx.concatenate([old, new], axis=-1)[:, None]

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        state = self.state
        if state.n_new is None:
            raise RuntimeError("RaggedCache.forward must wrap every forward through the ragged cache")
        batch, heads, n, _ = keys.shape
        start, end = state.used - self.first_slot, state.used + n - self.first_slot  # indices in the buffer
        if self.keys is None or end > self.keys.shape[2]:
            grow = -(-max(end - (0 if self.keys is None else self.keys.shape[2]), 1) // self.block) * self.block
            new_k = mx.zeros((batch, heads, grow, keys.shape[3]), keys.dtype)
            new_v = mx.zeros((batch, heads, grow, values.shape[3]), values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys, new_k], axis=2)
                self.values = mx.concatenate([self.values, new_v], axis=2)
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values
        return self.keys[..., :end, :], self.values[..., :end, :]

    def select(self, rows: mx.array) -> None:
        if self.keys is not None:
            self.keys = self.keys[rows]
            self.values = self.values[rows]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class LayerState:
    """One recurrent layer's state per row (`size` arrays, batch first), as mlx-lm's `ArraysCache` offers it."""

    def __init__(self, state: RowState, size: int):
        self.state = state
        self.cache: list[mx.array | None] = [None] * size

    def __getitem__(self, index: int):
        return self.cache[index]

    def __setitem__(self, index: int, value: mx.array) -> None:
        self.cache[index] = value

    @property
    def lengths(self) -> mx.array | None:
        """Real tokens per row in this chunk (where the layer's convolution window ends); None: all of it."""
        return None if self.state.chunk_full else self.state.n_new

    def make_mask(self, N: int) -> mx.array | None:
        """(rows, N) True at the chunk's real positions; a False position leaves the row's state as it was."""
        if self.state.chunk_full:
            return None
        return mx.arange(N)[None, :] < self.state.n_new[:, None]

    def advance(self, n: int) -> None:
        """mlx-lm's layers call this after each chunk; the shared `RowState` advances once per forward instead."""

    def empty(self) -> bool:
        return self.cache[0] is None

    def select(self, rows: mx.array) -> None:
        self.cache = [None if c is None else c[rows] for c in self.cache]

    def arrays(self) -> list[mx.array]:
        return [c for c in self.cache if c is not None]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.arrays())


def _layer_arrays(layer) -> list[mx.array]:
    if isinstance(layer, LayerState):
        return layer.arrays()
    return [] if layer.keys is None else [layer.keys, layer.values]


class RaggedCache:
    """Per-layer KV buffers (and recurrent states) plus the shared row state; pass `.layers` to the model.

    `recurrent` maps the index of each recurrent layer to the number of arrays in its state
    (`model.parts.recurrent_layers`); every other layer caches keys and values."""

    def __init__(self, num_layers: int, batch_size: int, block: int = 256, windowed: bool = False,
                 recurrent: dict[int, int] | None = None, windows: dict[int, int] | None = None):
        self.recurrent = dict(recurrent or {})
        self.windows = dict(windows or {}) if windowed else {}  # layer index -> its sliding window
        self.state = RowState(batch_size, windowed, max(self.windows.values()) if self.windows else None)
        self.block = block
        self.layers = [LayerState(self.state, self.recurrent[i]) if i in self.recurrent
                       else LayerKV(self.state, block, bounded=i in self.windows) for i in range(num_layers)]

    def arrays(self) -> list[mx.array]:
        """Every array the cache holds (to evaluate it)."""
        return [a for layer in self.layers for a in _layer_arrays(layer)] + [self.state.offset]

    def like(self, batch_size: int) -> "RaggedCache":
        """An empty cache of the same kind (layers, block, windowed) for `batch_size` rows."""
        return RaggedCache(len(self.layers), batch_size, self.block, self.state.positions is not None, self.recurrent,
                           self.windows)

    @property
    def rows(self) -> int:
        return self.state.rows

    @property
    def offset(self) -> mx.array:
        return self.state.offset

    @property
    def used(self) -> int:
        return self.state.used

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def forward(self, fn, tokens: mx.array, n_new) -> mx.array:
        """Run `fn(tokens, cache_layers)` for a (rows, N) chunk with `n_new` real tokens per row (a NumPy
        array when the host knows them, which keeps the cache's `dense` mark; an mx.array otherwise)."""
        state = self.state
        n = tokens.shape[1]
        # the chunk's own part of the mask is causal whatever its padding: only the older slots need `dense`
        full = isinstance(n_new, np.ndarray) and bool((n_new == n).all())
        state.n_new = n_new.astype(mx.int32) if isinstance(n_new, mx.array) else mx.array(np.asarray(n_new, np.int32))
        state.chunk_full = full
        try:
            with inference():  # the graph built here is never differentiated: decode-only kernels may serve it
                out = fn(tokens, self.layers)
        finally:
            chunk_valid = mx.arange(n)[None, :] < state.n_new[:, None]
            state.valid = mx.concatenate([state.valid[:, : state.used], chunk_valid], axis=1)
            if state.positions is not None:
                chunk_positions = state.offset[:, None] + mx.arange(n, dtype=mx.int32)[None, :]
                state.positions = mx.concatenate([state.positions[:, : state.used], chunk_positions], axis=1)
            state.offset = state.offset + state.n_new
            state.used += n
            state.n_new = None
            state.chunk_full = False
            state.dense = state.dense and full
        self.trim_windows()
        return out

    def trim_windows(self, force: bool = False) -> None:
        """Drop the slots no row's next query can see from every sliding-window layer (see the module's
        docstring); checked once the window layers hold `window + 2 * block` slots (or when `force`)."""
        state = self.state
        if state.window is None or not state.used:
            return
        base, used = state.window_base, state.used
        if not force and used - base < state.window + 2 * self.block:
            return
        valid = np.array(state.valid[:, base:used])
        seen = valid & (np.array(state.positions[:, base:used]) > np.array(state.offset)[:, None] - state.window)
        first = np.where(seen.any(axis=1), seen.argmax(axis=1), used - base)
        drop = int(first.min())
        if drop == 0 or (not force and drop < self.block):
            return
        for layer in self.layers:
            if isinstance(layer, LayerKV) and layer.bounded and layer.keys is not None:
                layer.keys = mx.contiguous(layer.keys[..., drop:, :])  # a copy: the dropped slots are freed
                layer.values = mx.contiguous(layer.values[..., drop:, :])
        state.window_base = base + drop

    def select(self, rows: mx.array) -> None:
        """Keep (and reorder or repeat) the given rows, in place."""
        for layer in self.layers:
            layer.select(rows)
        self.state.valid = self.state.valid[rows]
        self.state.offset = self.state.offset[rows]
        self.state.window_dropped = self.state.window_dropped[np.array(rows)]
        if self.state.positions is not None:
            self.state.positions = self.state.positions[rows]


def make_ragged_cache(model, batch_size: int, block: int = 256, windowed: bool | None = None) -> RaggedCache:
    """A ragged cache for `model` (one the engine accepted: `Engine` checks its layers once); it keeps slot
    positions when the model has sliding-window layers (`windowed` None: ask the model)."""
    from ..model.families import window_layers
    from ..model.parts import cache_layers, recurrent_layers

    windows = window_layers(model)
    windowed = bool(windows) if windowed is None else windowed
    return RaggedCache(cache_layers(model), batch_size, block, windowed, recurrent_layers(model), windows)
