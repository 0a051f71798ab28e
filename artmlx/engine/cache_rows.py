"""Operations on the rows of ragged caches (`cache.py`): a row's KV out (for the prefix cache), a cache
built from such prefixes, two caches joined (continuous batching), holes compacted away."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .cache import LayerKV, LayerState, RaggedCache


def rows_kv(cache: RaggedCache, rows: list[int], ends: list[int] | None = None) -> list[list[tuple[mx.array, ...]]]:
    """For each row of `rows`, its keys and values at its real slots, in position order: (heads, n, head_dim)
    per layer, only its first `ends[i]` positions when given; a recurrent layer gives its state arrays for the
    row instead (the state after the row's every token: `ends` cannot cut it). A sliding-window layer has zeros
    at the positions it dropped (`windows_from` says how many). One host read of the validity mask for all the
    rows (a device sync each would stall the decode loop)."""
    valid = np.array(cache.state.valid[mx.array(rows), :cache.used])
    out = []
    for i, (row, row_valid) in enumerate(zip(rows, valid)):
        real = np.flatnonzero(row_valid).astype(np.int32)[: None if ends is None else ends[i]]
        slots = mx.array(real)
        layers = []
        for layer in cache.layers:
            if isinstance(layer, LayerState):
                layers.append(tuple(c[row] for c in layer.cache))
            elif layer.bounded and cache.state.window_base:
                kept = mx.array(real >= cache.state.window_base)[None, :, None]
                index = mx.array(np.maximum(real - cache.state.window_base, 0))
                layers.append((mx.where(kept, layer.keys[row][:, index], 0),
                               mx.where(kept, layer.values[row][:, index], 0)))
            else:
                layers.append((layer.keys[row][:, slots], layer.values[row][:, slots]))
        out.append(layers)
    return out


def windows_from(cache: RaggedCache, rows: list[int]) -> list[int]:
    """For each row of `rows`, how many of its first positions its sliding-window layers no longer hold."""
    state = cache.state
    below = (np.array(state.valid[mx.array(rows), :state.window_base]).sum(axis=1) if state.window_base
             else np.zeros(len(rows), np.int64))
    return [max(int(state.window_dropped[row]), int(n)) for row, n in zip(rows, below)]  # both are its first real slots


def prefix_length(prefix: list[tuple[mx.array, ...]], recurrent: dict[int, int]) -> int:
    """Positions held by a `rows_kv` prefix (its first attention layer's keys)."""
    return next(kv[0].shape[1] for i, kv in enumerate(prefix) if i not in recurrent)


def cache_with_prefixes(like: RaggedCache, prefixes: list) -> RaggedCache:
    """A cache of `like`'s kind whose row r already holds `prefixes[r]` (per-layer (heads, n_r, head_dim) keys
    and values of its first n_r positions, or a recurrent layer's state after them, as `rows_kv` gives them)
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
    # signed: argsort gives uint32, and `order - first` below must go negative for a window layer's dropped slots
    order = mx.argsort(mx.where(valid, slot, slot + state.used), axis=1).astype(mx.int32)
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
