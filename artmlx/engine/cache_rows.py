"""Operations on the rows of ragged caches (`cache.py`): a row's KV out (for the prefix cache), a cache
built from such prefixes, two caches joined (continuous batching), holes compacted away."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .cache import LayerKV, LayerState, RaggedCache
from .prefix_cache import Shared


def rows_kv(cache: RaggedCache, rows: list[int], ends: list[int] | None = None,
            group_bytes: int = 0) -> list[tuple[list[tuple[mx.array, ...]], Shared, int]]:
    """For each row of `rows`, its keys and values at its real slots, in position order: (heads, n, head_dim)
    per layer, only its first `ends[i]` positions when given; a recurrent layer gives its state arrays for the
    row instead (the state after the row's every token: `ends` cannot cut it). A sliding-window layer has zeros
    at the positions it dropped (`windows_from` says how many). One host read of the validity mask for all the
    rows (a device sync each would stall the decode loop).

    Rows are gathered together, one gather per layer and array for each group of rows of similar lengths (in
    order of length, a group ends where its padding would exceed its real slots or its buffers `group_bytes`;
    0: no bound): each row's arrays are views of its group's buffers (padded to the group's longest row), and the
    `Shared` that comes with it (with the row's index in them) holds those buffers and counts them once for the
    whole group. (A gather per row and layer cost the H200's host ~3 ms per kept sequence, 48 launches each at
    the 0.5B shape.)"""
    valid = np.array(cache.state.valid[mx.array(rows), :cache.used])
    reals = [np.flatnonzero(row_valid).astype(np.int32)[: None if ends is None else ends[i]]
             for i, row_valid in enumerate(valid)]
    by_length = sorted(range(len(rows)), key=lambda i: len(reals[i]))
    slot_bytes, state_bytes = _row_bytes(cache)
    out: list = [None] * len(rows)
    start = 0
    while start < len(by_length):
        stop, real = start + 1, len(reals[by_length[start]])
        while stop < len(by_length):
            longest, real_after = len(reals[by_length[stop]]), real + len(reals[by_length[stop]])
            count = stop + 1 - start
            if count * longest > 2 * real_after or (
                    group_bytes and count * (slot_bytes * longest + state_bytes) > group_bytes):
                break
            stop, real = stop + 1, real_after
        group = by_length[start:stop]
        for i, kept in zip(group, _gather_rows(cache, [rows[i] for i in group], [reals[i] for i in group])):
            out[i] = kept
        start = stop
    return out


def _row_bytes(cache: RaggedCache) -> tuple[int, int]:
    """Bytes one row takes in `rows_kv`'s buffers: per position (keys and values), and its recurrent states."""
    slot = state = 0
    for layer in cache.layers:
        if isinstance(layer, LayerState):
            state += sum(c[0].nbytes for c in layer.cache if c is not None)
        elif layer.keys is not None:
            slot += 2 * layer.keys.shape[1] * layer.keys.shape[3] * layer.keys.dtype.size
    return slot, state


def _gather_rows(cache: RaggedCache, rows: list[int], reals: list[np.ndarray]) -> list[tuple[list, Shared, int]]:
    width = max(len(real) for real in reals)
    # every row's real slots, padded by repeating its last one (positions past a row's end are sliced away)
    index = np.stack([np.concatenate([real, np.full(width - len(real), real[-1], np.int32)]) for real in reals])
    picked = mx.array(rows)
    base, layers = cache.state.window_base, []
    for layer in cache.layers:
        if isinstance(layer, LayerState):
            layers.append(tuple(c[picked] for c in layer.cache))
            continue
        windowed = layer.bounded and base  # the buffer starts at slot `base`; the slots below it are zeros
        slots = mx.array(np.maximum(index - base, 0) if windowed else index)
        # (rows, heads, slots, head_dim) in one gather, laid out as the cache (a later gather of rows reads it whole)
        heads = mx.arange(layer.keys.shape[1])[None, :, None]
        k, v = (a[picked[:, None, None], heads, slots[:, None, :]] for a in (layer.keys, layer.values))
        if windowed:
            kept = mx.array(index >= base)[:, None, :, None]
            k, v = mx.where(kept, k, 0), mx.where(kept, v, 0)
        layers.append((k, v))
    shared = Shared(sum(a.nbytes for arrays in layers for a in arrays), layers)
    states = [isinstance(layer, LayerState) for layer in cache.layers]
    return [([tuple(a[i] if state else a[i, :, :len(real)] for a in arrays) for arrays, state in zip(layers, states)],
             shared, i) for i, real in enumerate(reals)]


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
    or nothing (None): right-padded with holes. Rows whose prefixes are views of one group's buffers (`Prefix.shared`:
    sequences kept together, such as a group of agents' previous turns) come out of those in one gather per layer,
    their slots past the prefix holes whatever they hold."""
    recurrent = like.recurrent
    lengths = [0 if p is None else prefix_length(p, recurrent) for p in prefixes]
    cache = like.like(len(prefixes))
    width = max(lengths)
    if width == 0:
        return cache
    template = next(p for p in prefixes if p is not None)
    groups: dict[int, list[int]] = {}  # rows by the buffers their prefixes view (a row of its own: negative keys)
    for r, p in enumerate(prefixes):
        shared = getattr(p, "shared", None)
        groups.setdefault(id(shared) if shared is not None and shared.layers else -1 - r, []).append(r)
    order = [r for members in groups.values() for r in members]
    restore = None if order == sorted(order) else mx.array(np.argsort(order))
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LayerState):  # rows without a prefix start from the zero state
            layer.cache = [mx.stack([p[index][j] if p is not None else mx.zeros_like(template[index][j])
                                     for p in prefixes]) for j in range(len(layer.cache))]
            continue
        keys, values, (k0, v0) = [], [], template[index]
        for key, members in groups.items():
            prefix = prefixes[members[0]]
            if key >= 0:
                rows = mx.array([prefixes[r].row for r in members])
                parts = [a[rows] for a in prefix.shared.layers[index]]
            else:
                parts = [a[None] for a in (prefix[index] if prefix is not None else (k0[:, :0], v0[:, :0]))]
            k, v = (_fit_slots(a, width) for a in parts)
            keys.append(k)
            values.append(v)
        layer.keys, layer.values = (mx.concatenate(arrays, axis=0) if len(arrays) > 1 else arrays[0]
                                    for arrays in (keys, values))
        if restore is not None:
            layer.keys, layer.values = layer.keys[restore], layer.values[restore]
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


def _fit_slots(a: mx.array, width: int) -> mx.array:
    """(rows, heads, slots, head_dim) `a` cut or padded with zero slots to `width` slots."""
    if a.shape[2] >= width:
        return a[:, :, :width]
    return mx.concatenate([a, mx.zeros((*a.shape[:2], width - a.shape[2], a.shape[3]), a.dtype)], axis=2)


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
