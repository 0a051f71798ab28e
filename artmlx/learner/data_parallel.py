"""Data-parallel GRPO updates over `mx.distributed`: every rank trains a share of each optimizer step's groups.

All ranks hold the same adapters and optimizer state and see the same groups. An optimizer step's groups are
split among the ranks whole (a group's episodes share their prompt in the micro-batches), balanced by the
padded tokens they cost (`shard_groups`); each rank sums the gradients of its share's micro-batches, whose
loss weights already normalise over the whole step, and `sum_across` adds the ranks' sums: the gradient of
the whole step, up to the order of float additions. Every rank then applies the same clipped AdamW step, so
the adapters stay equal without a broadcast. A rank with no group this step contributes zeros.

The group is whatever `mx.distributed.init` made: the ring backend (TCP, CPU and Metal) with `mlx.launch`'s
hostfile and `MLX_RANK`, or NCCL on CUDA. A peer that dies makes the survivors' next collective raise
RuntimeError ("[ring] connection to a peer was lost"); the process edge handles it.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten


def shard_groups(costs: list[int], ranks: int) -> list[list[int]]:
    """Indices of the groups each rank trains: largest first, each to the rank with the fewest tokens so far
    (ties to the lowest rank), so shares differ by at most one group's cost. Every rank computes the same split."""
    shares: list[list[int]] = [[] for _ in range(ranks)]
    loads = [0] * ranks
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(ranks), key=lambda r: (loads[r], r))
        shares[rank].append(index)
        loads[rank] += costs[index]
    return [sorted(share) for share in shares]


def sum_across(tree, group: mx.distributed.Group):
    """The element-wise sum of `tree` (arrays, nested dicts/lists) over the ranks, in one collective."""
    leaves = tree_flatten(tree)
    if not leaves:
        return tree
    flat = mx.concatenate([value.astype(mx.float32).reshape(-1) for _, value in leaves])
    total = mx.distributed.all_sum(flat, group=group)
    out, start = [], 0
    for name, value in leaves:
        out.append((name, total[start:start + value.size].reshape(value.shape).astype(value.dtype)))
        start += value.size
    return tree_unflatten(out)


def zeros_like_tree(tree):
    return tree_map(mx.zeros_like, tree)


def sum_scalars(values: dict[str, float], group: mx.distributed.Group, maxima: tuple[str, ...] = ()) -> dict:
    """`values` summed over the ranks, except the names in `maxima`, whose largest value is kept."""
    names = sorted(values)
    summed = [n for n in names if n not in maxima]
    out = {}
    if summed:
        total = mx.distributed.all_sum(mx.array([values[n] for n in summed], mx.float32), group=group)
        out.update(zip(summed, np.array(total).tolist()))
    kept = [n for n in names if n in maxima]
    if kept:
        largest = mx.distributed.all_max(mx.array([values[n] for n in kept], mx.float32), group=group)
        out.update(zip(kept, np.array(largest).tolist()))
    return out


def same_everywhere(tree, group: mx.distributed.Group) -> bool:
    """Whether every rank holds the same values (a check after loading: ranks must start equal)."""
    leaves = tree_flatten(tree)
    checksum = mx.array([float(mx.sum(v.astype(mx.float32) * (i + 1)).item()) for i, (_, v) in enumerate(leaves)])
    spread = mx.distributed.all_max(checksum, group=group) - mx.distributed.all_min(checksum, group=group)
    return bool(mx.all(spread == 0).item())
