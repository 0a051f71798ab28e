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


class RowState:
    """What all layers share: which slots are real, each row's position, where the next chunk goes."""

    def __init__(self, batch_size: int, windowed: bool = False):
        self.valid = mx.zeros((batch_size, 0), dtype=mx.bool_)
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

    def __init__(self, state: RowState, block: int):
        self.state = state
        self.block = block
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self) -> mx.array:
        return self.state.offset

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs) -> mx.array:
        state = self.state
        if window_size is not None:
            return self._window_mask(N, window_size)
        if state.dense and not return_array:
            return None if N == 1 else "causal"
        causal = mx.tril(mx.ones((N, N), dtype=mx.bool_))
        rows, used = state.rows, state.used
        old = mx.broadcast_to(state.valid[:, None, None, :used], (rows, 1, N, used))
        new = mx.broadcast_to(causal[None, None], (rows, 1, N, N))
        return mx.concatenate([old, new], axis=-1)

    def _window_mask(self, N: int, window: int) -> mx.array:
        """A sliding-window layer's mask: a query at position q sees the real slots at positions
        q - window < p <= q (mlx-lm's `create_causal_mask(window_size=...)`), whatever their slot."""
        state = self.state
        if state.positions is None:
            raise RuntimeError("this cache keeps no slot positions: make it with windowed=True")
        used = state.used
        query = state.offset[:, None] + mx.arange(N)[None, :]  # (rows, N)
        old = state.valid[:, None, :used] & (query[:, :, None] - state.positions[:, None, :used] < window)
        chunk = mx.arange(N)
        new = (chunk[:, None] >= chunk[None, :]) & (chunk[:, None] - chunk[None, :] < window)
        new = mx.broadcast_to(new[None], (state.rows, N, N))
        return mx.concatenate([old, new], axis=-1)[:, None]

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        state = self.state
        if state.n_new is None:
            raise RuntimeError("RaggedCache.forward must wrap every forward through the ragged cache")
        batch, heads, n, _ = keys.shape
        start, end = state.used, state.used + n
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
                 recurrent: dict[int, int] | None = None):
        self.state = RowState(batch_size, windowed)
        self.block = block
        self.recurrent = dict(recurrent or {})
        self.layers = [LayerState(self.state, self.recurrent[i]) if i in self.recurrent else LayerKV(self.state, block)
                       for i in range(num_layers)]

    def arrays(self) -> list[mx.array]:
        """Every array the cache holds (to evaluate it)."""
        return [a for layer in self.layers for a in _layer_arrays(layer)] + [self.state.offset]

    def like(self, batch_size: int) -> "RaggedCache":
        """An empty cache of the same kind (layers, block, windowed) for `batch_size` rows."""
        return RaggedCache(len(self.layers), batch_size, self.block, self.state.positions is not None, self.recurrent)

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
        return out

    def select(self, rows: mx.array) -> None:
        """Keep (and reorder or repeat) the given rows, in place."""
        for layer in self.layers:
            layer.select(rows)
        self.state.valid = self.state.valid[rows]
        self.state.offset = self.state.offset[rows]
        if self.state.positions is not None:
            self.state.positions = self.state.positions[rows]


def row_kv(cache: RaggedCache, row: int) -> list[tuple[mx.array, ...]]:
    """Row `row`'s keys and values at its real slots, in position order: (heads, n, head_dim) per layer; a
    recurrent layer gives its state arrays for the row instead (the state after the row's every token)."""
    slots = mx.array(np.flatnonzero(np.array(cache.state.valid[row, :cache.used])).astype(np.int32))
    return [tuple(c[row] for c in layer.cache) if isinstance(layer, LayerState)
            else (layer.keys[row][:, slots], layer.values[row][:, slots]) for layer in cache.layers]


def prefix_length(prefix: list[tuple[mx.array, ...]], recurrent: dict[int, int]) -> int:
    """Positions held by a `row_kv` prefix (its first attention layer's keys)."""
    return next(kv[0].shape[1] for i, kv in enumerate(prefix) if i not in recurrent)


def cache_with_prefixes(like: RaggedCache, prefixes: list) -> RaggedCache:
    """A cache of `like`'s kind whose row r already holds `prefixes[r]` (per-layer (heads, n_r, head_dim) keys
    and values of its first n_r positions, or a recurrent layer's state after them, as `row_kv` gives them)
    or nothing (None): right-padded with holes."""
    recurrent = like.recurrent
    lengths = [0 if p is None else prefix_length(p, recurrent) for p in prefixes]
    cache = like.like(len(prefixes))
    width = max(lengths)
    if width == 0:
        return cache
    template = next(p for p in prefixes if p is not None)
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LayerState):  # rows without a prefix start from the zero state
            layer.cache = [mx.stack([p[index][j] if p is not None else mx.zeros_like(template[index][j])
                                     for p in prefixes]) for j in range(len(layer.cache))]
            continue
        keys, values = [], []
        for prefix, n in zip(prefixes, lengths):
            k0, v0 = template[index]
            k, v = prefix[index] if prefix is not None else (k0[:, :0], v0[:, :0])
            pad = width - n
            if pad:
                k = mx.concatenate([k, mx.zeros((k0.shape[0], pad, k0.shape[2]), k0.dtype)], axis=1)
                v = mx.concatenate([v, mx.zeros((v0.shape[0], pad, v0.shape[2]), v0.dtype)], axis=1)
            keys.append(k)
            values.append(v)
        layer.keys, layer.values = mx.stack(keys), mx.stack(values)
    lengths_array = mx.array(lengths, dtype=mx.int32)
    cache.state.valid = mx.arange(width)[None, :] < lengths_array[:, None]
    cache.state.offset = lengths_array
    cache.state.used = width
    cache.state.dense = min(lengths) == width
    if cache.state.positions is not None:  # a prefix holds positions 0 .. n_r - 1 in slot order
        cache.state.positions = mx.broadcast_to(mx.arange(width, dtype=mx.int32)[None, :], (len(prefixes), width))
    return cache


def make_ragged_cache(model, batch_size: int, block: int = 256, windowed: bool | None = None) -> RaggedCache:
    """A ragged cache for `model` (one the engine accepted: `Engine` checks its layers once); it keeps slot
    positions when the model has sliding-window layers (`windowed` None: ask the model)."""
    from ..model.parts import cache_layers, recurrent_layers

    if windowed is None:
        from ..model.families import has_sliding_window

        windowed = has_sliding_window(model)
    return RaggedCache(cache_layers(model), batch_size, block, windowed, recurrent_layers(model))


def _slots(layer: LayerKV, used: int) -> tuple[mx.array, mx.array]:
    return layer.keys[..., :used, :], layer.values[..., :used, :]


def join_caches(first: RaggedCache, second: RaggedCache) -> RaggedCache:
    """One cache with the rows of `first` then `second` (the shorter slot axis padded with holes).

    How a continuously batched server adds requests between decode steps: the newcomers are prefilled
    in a cache of their own and joined to the running one; their positions (offsets) are their own.
    """
    used = max(first.used, second.used)
    joined = first.like(first.rows + second.rows)
    parts = []
    for cache in (first, second):
        pad = used - cache.used
        valid = mx.concatenate([cache.state.valid[:, : cache.used], mx.zeros((cache.rows, pad), mx.bool_)], axis=1)
        parts.append((cache, pad, valid))
    for index, layer in enumerate(joined.layers):
        if isinstance(layer, LayerState):
            layer.cache = [_join_states(first.layers[index][j], first.rows, second.layers[index][j], second.rows)
                           for j in range(len(layer.cache))]
            continue
        keys, values = [], []
        for cache, pad, _ in parts:
            k, v = _slots(cache.layers[index], cache.used)
            if pad:
                k = mx.concatenate([k, mx.zeros((*k.shape[:2], pad, k.shape[3]), k.dtype)], axis=2)
                v = mx.concatenate([v, mx.zeros((*v.shape[:2], pad, v.shape[3]), v.dtype)], axis=2)
            keys.append(k)
            values.append(v)
        layer.keys, layer.values = mx.concatenate(keys, axis=0), mx.concatenate(values, axis=0)
    joined.state.valid = mx.concatenate([valid for _, _, valid in parts], axis=0)
    if joined.state.positions is not None:
        joined.state.positions = mx.concatenate(
            [mx.concatenate([c.state.positions[:, : c.used], mx.zeros((c.rows, pad), mx.int32)], axis=1)
             for c, pad, _ in parts], axis=0)
    joined.state.offset = mx.concatenate([first.state.offset, second.state.offset])
    joined.state.used = used
    joined.state.dense = first.state.dense and second.state.dense and first.used == second.used
    return joined


def _join_states(a: mx.array | None, rows_a: int, b: mx.array | None, rows_b: int) -> mx.array | None:
    """Two batches' state arrays as one (a side that has not run yet holds the zero state)."""
    if a is None and b is None:
        return None
    like = a if a is not None else b
    a = a if a is not None else mx.zeros((rows_a, *like.shape[1:]), like.dtype)
    b = b if b is not None else mx.zeros((rows_b, *like.shape[1:]), like.dtype)
    return mx.concatenate([a, b], axis=0)


def compact(cache: RaggedCache) -> None:
    """Move every row's real slots to the front and drop the slots that are holes in every row.

    Rows of a long-lived batch (a server) leave holes where others decoded after they joined; the
    order of cached keys does not matter to attention (positions are in the keys already, through
    RoPE), so gathering them keeps every row's attention exactly as it was."""
    state = cache.state
    if state.used == 0:
        return
    valid = state.valid[:, : state.used]
    # real slots first, in slot order (distinct keys: no reliance on a stable sort), so a row's real
    # slots stay in position order, which the prefix cache slices by
    slot = mx.arange(state.used)[None, :]
    order = mx.argsort(mx.where(valid, slot, slot + state.used), axis=1)
    real = np.array(valid.sum(axis=1))
    keep = int(real.max())
    order = order[:, :keep]
    for layer in cache.layers:
        if isinstance(layer, LayerState):  # a state has no slots
            continue
        k, v = _slots(layer, state.used)
        index = order[:, None, :, None]
        layer.keys = mx.take_along_axis(k, index, axis=2)
        layer.values = mx.take_along_axis(v, index, axis=2)
    state.valid = mx.take_along_axis(valid, order, axis=1)
    if state.positions is not None:
        state.positions = mx.take_along_axis(state.positions[:, : state.used], order, axis=1)
    state.used = keep
    state.dense = int(real.min()) == keep
