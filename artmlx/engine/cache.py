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
        used, base = state.used, state.window_base  # the slots a window layer's buffer holds
        query = state.offset[:, None] + mx.arange(N)[None, :]  # (rows, N)
        old = state.valid[:, None, base:used] & (query[:, :, None] - state.positions[:, None, base:used] < window)
        chunk = mx.arange(N)
        new = (chunk[:, None] >= chunk[None, :]) & (chunk[:, None] - chunk[None, :] < window)
        new = mx.broadcast_to(new[None], (state.rows, N, N))
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


def row_kv(cache: RaggedCache, row: int) -> list[tuple[mx.array, ...]]:
    """Row `row`'s keys and values at its real slots, in position order: (heads, n, head_dim) per layer; a
    recurrent layer gives its state arrays for the row instead (the state after the row's every token).
    A sliding-window layer has zeros at the positions it dropped (`window_from` says how many)."""
    real = np.flatnonzero(np.array(cache.state.valid[row, :cache.used])).astype(np.int32)
    slots = mx.array(real)
    out = []
    for layer in cache.layers:
        if isinstance(layer, LayerState):
            out.append(tuple(c[row] for c in layer.cache))
        elif layer.bounded and cache.state.window_base:
            kept = mx.array(real >= cache.state.window_base)[None, :, None]
            index = mx.array(np.maximum(real - cache.state.window_base, 0))
            out.append((mx.where(kept, layer.keys[row][:, index], 0), mx.where(kept, layer.values[row][:, index], 0)))
        else:
            out.append((layer.keys[row][:, slots], layer.values[row][:, slots]))
    return out


def window_from(cache: RaggedCache, row: int) -> int:
    """Positions of row `row` whose keys its sliding-window layers no longer hold (0 .. window_from - 1)."""
    state = cache.state
    below = int(np.array(state.valid[row, :state.window_base]).sum()) if state.window_base else 0
    return max(int(state.window_dropped[row]), below)  # both are the row's first real slots


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
    # positions whose window-layer keys are zeros in the prefix (a prefix cache hit says so: `Prefix.window_from`)
    cache.state.window_dropped = np.array([getattr(p, "window_from", 0) if p is not None else 0 for p in prefixes])
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
    from ..model.families import window_layers
    from ..model.parts import cache_layers, recurrent_layers

    windows = window_layers(model)
    windowed = bool(windows) if windowed is None else windowed
    return RaggedCache(cache_layers(model), batch_size, block, windowed, recurrent_layers(model), windows)


def _slots(layer: LayerKV, used: int) -> tuple[mx.array, mx.array]:
    """The buffer's slots from `layer.first_slot` up to `used`."""
    return layer.keys[..., : used - layer.first_slot, :], layer.values[..., : used - layer.first_slot, :]


def _pad_slots(k: mx.array, before: int, after: int) -> mx.array:
    """`k` with `before` and `after` zero slots (holes) around it on the slot axis."""
    parts = [mx.zeros((*k.shape[:2], before, k.shape[3]), k.dtype)] if before else []
    parts += [k] + ([mx.zeros((*k.shape[:2], after, k.shape[3]), k.dtype)] if after else [])
    return mx.concatenate(parts, axis=2) if len(parts) > 1 else k


def join_caches(first: RaggedCache, second: RaggedCache) -> RaggedCache:
    """One cache with the rows of `first` then `second` (the shorter slot axis padded with holes).

    How a continuously batched server adds requests between decode steps: the newcomers are prefilled
    in a cache of their own and joined to the running one; their positions (offsets) are their own.
    """
    used = max(first.used, second.used)
    joined = first.like(first.rows + second.rows)
    joined.state.window_base = min(first.state.window_base, second.state.window_base)
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
            # a window layer's buffer starts at its cache's window_base; the joined one at the smaller base
            before = cache.layers[index].first_slot - layer.first_slot
            keys.append(_pad_slots(k, before, pad))
            values.append(_pad_slots(v, before, pad))
        layer.keys, layer.values = mx.concatenate(keys, axis=0), mx.concatenate(values, axis=0)
    joined.state.valid = mx.concatenate([valid for _, _, valid in parts], axis=0)
    if joined.state.positions is not None:
        joined.state.positions = mx.concatenate(
            [mx.concatenate([c.state.positions[:, : c.used], mx.zeros((c.rows, pad), mx.int32)], axis=1)
             for c, pad, _ in parts], axis=0)
    joined.state.offset = mx.concatenate([first.state.offset, second.state.offset])
    # a side whose window layers had dropped more slots has zeros in [joined base, its base): count its real ones
    base = joined.state.window_base
    joined.state.window_dropped = np.concatenate(
        [np.maximum(c.state.window_dropped, np.array(c.state.valid[:, :c.state.window_base].sum(axis=1)))
         if c.state.window_base > base else c.state.window_dropped for c in (first, second)])
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
    base = state.window_base
    for layer in cache.layers:
        if isinstance(layer, LayerState):  # a state has no slots
            continue
        k, v = _slots(layer, state.used)
        first = layer.first_slot  # a window layer's buffer holds slots from window_base: the older ones are zeros
        index = mx.maximum(order - first, 0)[:, None, :, None]
        layer.keys = mx.take_along_axis(k, index, axis=2)
        layer.values = mx.take_along_axis(v, index, axis=2)
        if first:
            dropped = (order < first)[:, None, :, None]
            layer.keys, layer.values = mx.where(dropped, 0, layer.keys), mx.where(dropped, 0, layer.values)
    if base:  # the buffers hold every slot again; the rows' dropped slots are their first real ones
        state.window_dropped = np.maximum(state.window_dropped, np.array(valid[:, :base].sum(axis=1)))
        state.window_base = 0
    state.valid = mx.take_along_axis(valid, order, axis=1)
    if state.positions is not None:
        state.positions = mx.take_along_axis(state.positions[:, : state.used], order, axis=1)
    state.used = keep
    state.dense = int(real.min()) == keep
    cache.trim_windows()
