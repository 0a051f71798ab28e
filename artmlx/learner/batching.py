"""Turn episodes into padded micro-batches that fit a token budget.

Episodes are sorted by length (less padding) and packed greedily: a micro-batch holds as many rows
as keep rows x padded length within `max_tokens`. Lengths are padded up to a multiple of
`pad_multiple` so a compiled step sees few distinct shapes. An episode longer than the budget gets
a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..trajectory import Episode


def padded_length(length: int, pad_multiple: int) -> int:
    return -(-length // pad_multiple) * pad_multiple


def pack_microbatches(lengths: list[int], max_tokens: int, pad_multiple: int = 1) -> list[list[int]]:
    """Indices of episodes per micro-batch, longest first, each within `max_tokens` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for index in order:
        new_width = max(width, padded_length(lengths[index], pad_multiple))
        if current and new_width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, new_width = [], padded_length(lengths[index], pad_multiple)
        current.append(index)
        width = new_width
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    inputs: mx.array  # (B, T) token ids fed to the model
    targets: mx.array  # (B, T) next token ids
    mask: mx.array  # (B, T) 1 where the target was sampled by the policy
    behaviour_logprobs: mx.array  # (B, T)
    advantages: mx.array  # (B,)
    episodes: list[int]


def make_microbatch(episodes: list[Episode], advantages: np.ndarray, indices: list[int],
                    pad_multiple: int = 1) -> MicroBatch:
    """Shift each transcript into (input, target) pairs and right-pad them."""
    width = padded_length(max(len(episodes[i].tokens) - 1 for i in indices), pad_multiple)
    shape = (len(indices), width)
    inputs, targets = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    mask, behaviour = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    for row, i in enumerate(indices):
        episode = episodes[i]
        n = len(episode.tokens) - 1
        tokens = np.asarray(episode.tokens, np.int32)
        inputs[row, :n], targets[row, :n] = tokens[:-1], tokens[1:]
        mask[row, :n] = np.asarray(episode.policy_mask[1:], np.float32)
        behaviour[row, :n] = np.asarray(episode.logprobs[1:], np.float32)
    return MicroBatch(
        inputs=mx.array(inputs),
        targets=mx.array(targets),
        mask=mx.array(mask),
        behaviour_logprobs=mx.array(behaviour),
        advantages=mx.array(np.asarray(advantages, np.float32)[indices]),
        episodes=list(indices),
    )
