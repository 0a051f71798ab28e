"""The learner's forward pass: shared prompt prefixes, and logits only where the policy sampled.

For a micro-batch (`batching.MicroBatch`):
1. the prefix rows (one per group part) run through the trunk; their keys and values are kept;
2. each episode row runs its continuation through the trunk attending to its prefix row's keys and
   values (RoPE positions continue from the prefix length; a mask hides the prefix row's padding);
3. hidden states are gathered at the policy-sampled targets only (n of B x T positions) and
   projected onto the vocabulary there, a chunk of rows at a time with its own backward
   (`head.chunked_logprobs`): at most a chunk x V logits alive instead of n x V;
4. the n logprobs are scattered back to (B, T) (zeros elsewhere) for `grpo.policy_loss`.
The result equals `token_logprobs(model(full inputs), targets)` at every policy position; the tests
check it against that plain forward, values and gradients.

A recurrent layer's prefix is a state, not keys (`PrefixState`): the prefix pass runs with a padding
mask and lengths so each prefix row's state (and convolution window) stops at its last real token, and
each episode row starts from its prefix row's state; gradients flow into the prefix pass through it.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx

from ..model.masks import window_visible
from ..engine.memory import head_chunk_rows
from ..model.parts import ModelParts
from .head import chunked_logprobs


class _PrefixState:
    def __init__(self):
        self.row_prefix: mx.array | None = None
        self.prefix_valid: mx.array | None = None  # (B, Wp) per episode row
        self.offset: int | mx.array = 0
        self.prefix_lengths: mx.array | None = None  # (P,) real tokens of each prefix row, in the prefix pass


class PrefixState:
    """A recurrent layer's state across the two passes (mlx-lm's `ArraysCache` interface): the prefix
    rows' states after their last real token, then each episode row's start from its prefix row's."""

    def __init__(self, state: _PrefixState, size: int):
        self.state = state
        self.final: list[mx.array | None] = [None] * size  # the prefix rows' states after the prefix pass

    def __getitem__(self, index: int):
        if self.state.row_prefix is None:  # the prefix rows start from the zero state
            return None
        final = self.final[index]
        return None if final is None else final[self.state.row_prefix]

    def __setitem__(self, index: int, value: mx.array) -> None:
        if self.state.row_prefix is None:  # an episode row's state after its continuation is not needed
            self.final[index] = value

    @property
    def lengths(self):
        return self.state.prefix_lengths if self.state.row_prefix is None else None

    def make_mask(self, N: int):
        if self.state.row_prefix is None:
            return mx.arange(N)[None, :] < self.state.prefix_lengths[:, None]
        return None  # episode rows are right-padded: their padding comes after every real position

    def advance(self, n: int) -> None:
        """Positions are the shared state's business."""

    def empty(self) -> bool:
        return self[0] is None

    def checkpoint_state(self):
        """As `PrefixKV.checkpoint_state`: which pass, and in the episode pass the prefix states as inputs."""
        state = self.state
        seen = (state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths)
        return seen, ([] if state.row_prefix is None else [a for a in self.final if a is not None])

    @contextlib.contextmanager
    def restored(self, seen, arrays):
        state = self.state
        now = (state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths, list(self.final))
        state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths = seen
        if arrays:
            given = iter(arrays)
            self.final = [None if a is None else next(given) for a in self.final]
        try:
            yield
        finally:
            state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths, self.final = now


class PrefixKV:
    """A differentiable per-layer cache: stores the prefix rows' keys/values, then serves them to episode rows."""

    def __init__(self, state: _PrefixState):
        self.state = state
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self):
        return self.state.offset

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        state = self.state
        chunk = mx.arange(N)
        # a sliding-window layer hides keys more than window_size - 1 back
        causal = chunk[:, None] >= chunk[None, :] if window_size is None else window_visible(chunk, chunk, window_size)
        if state.row_prefix is None:  # the prefix rows themselves: plain causal attention
            return "causal" if window_size is None else causal
        rows, width = state.prefix_valid.shape
        old = mx.broadcast_to(state.prefix_valid[:, None, None, :], (rows, 1, N, width))
        if window_size is not None:  # prefix slot p is at position p; row queries continue from the prefix
            query = state.offset[:, None] + chunk[None, :]
            old = old & window_visible(query, mx.arange(width)[None, :], window_size)[:, None]
        return mx.concatenate([old, mx.broadcast_to(causal[None, None], (rows, 1, N, N))], axis=-1)

    def checkpoint_state(self):
        """What a layer call sees (`checkpointing`): which pass and its offsets, and in the episode pass the
        prefix keys and values, returned apart so they become the checkpointed call's explicit inputs."""
        state = self.state
        seen = (state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths)
        return seen, ([] if state.row_prefix is None else [self.keys, self.values])

    @contextlib.contextmanager
    def restored(self, seen, arrays):
        """The state of `checkpoint_state` back for a recomputation, and afterwards the state of now."""
        state = self.state
        now = (state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths, self.keys, self.values)
        state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths = seen
        if arrays:
            self.keys, self.values = arrays
        try:
            yield
        finally:
            state.row_prefix, state.prefix_valid, state.offset, state.prefix_lengths, self.keys, self.values = now

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        state = self.state
        if state.row_prefix is None:
            self.keys, self.values = keys, values
            return keys, values
        rows = state.row_prefix
        return (mx.concatenate([self.keys[rows], keys], axis=2),
                mx.concatenate([self.values[rows], values], axis=2))


def hidden_states(parts: ModelParts, prefix_inputs: mx.array, prefix_lengths: mx.array,
                  row_prefix: mx.array, inputs: mx.array) -> mx.array:
    """Trunk outputs (B, T, D) for the episode rows, each continuing its prefix row."""
    if prefix_inputs.size == 0:
        return parts.trunk(inputs, None)
    state = _PrefixState()
    cache = [PrefixState(state, parts.recurrent[i]) if i in parts.recurrent else PrefixKV(state)
             for i in range(parts.cache_layers)]
    state.prefix_lengths = prefix_lengths
    parts.trunk(prefix_inputs, cache)  # fills every layer's keys and values (or states); its outputs are not needed
    width = prefix_inputs.shape[1]
    lengths = prefix_lengths[row_prefix]
    state.prefix_lengths = None
    state.row_prefix = row_prefix
    state.prefix_valid = mx.arange(width)[None, :] < lengths[:, None]
    state.offset = lengths
    return parts.trunk(inputs, cache)


def policy_logprobs(parts: ModelParts, temperature: float,
                    prefix_inputs, prefix_lengths, row_prefix, inputs, targets, policy_positions,
                    gather_back, extra_targets: mx.array | None = None):
    """Logprobs (B, T) of the targets under the current policy at policy positions, 0 elsewhere.

    With `extra_targets` (n, K): token ids per policy position (in `policy_positions`' order), also their
    logprobs (n, K) from the same head pass: returns (logprobs, extra logprobs)."""
    hidden = hidden_states(parts, prefix_inputs, prefix_lengths, row_prefix, inputs)
    batch, length = inputs.shape
    picked_targets = targets.reshape(-1)[policy_positions]
    at_policy = hidden.reshape(batch * length, hidden.shape[-1])[policy_positions]
    if extra_targets is not None:
        picked_targets = mx.concatenate([picked_targets[:, None], extra_targets.astype(picked_targets.dtype)], axis=1)
    if parts.split:
        chosen = chunked_logprobs(parts.head, at_policy, picked_targets, temperature, head_chunk_rows(parts.vocab_size))
    else:  # an unlisted model family: the trunk already made full logits (the head is the identity)
        logits = at_policy.astype(mx.float32)
        if temperature not in (0, 1):
            logits = logits / temperature
        many = picked_targets if picked_targets.ndim == 2 else picked_targets[:, None]
        chosen = mx.take_along_axis(logits, many, axis=-1) - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = chosen if picked_targets.ndim == 2 else chosen[:, 0]
    extra = None
    if extra_targets is not None:
        chosen, extra = chosen[:, 0], chosen[:, 1:]
    chosen = mx.concatenate([chosen, mx.zeros((1,), chosen.dtype)])
    logp = chosen[gather_back].reshape(batch, length)
    return logp if extra is None else (logp, extra)


def teacher_topk(parts: ModelParts, temperature: float, k: int,
                 prefix_inputs, prefix_lengths, row_prefix, inputs, targets, policy_positions, gather_back):
    """A teacher's view of the policy positions, without gradient: the logprobs (B, T) of the targets (0 off
    policy), and its k likeliest token ids (n, k) with their logprobs (n, k), in `policy_positions`' order."""
    hidden = hidden_states(parts, prefix_inputs, prefix_lengths, row_prefix, inputs)
    batch, length = inputs.shape
    picked_targets = targets.reshape(-1)[policy_positions]
    at_policy = hidden.reshape(batch * length, hidden.shape[-1])[policy_positions]
    rows = head_chunk_rows(parts.vocab_size) if parts.split else max(1, at_policy.shape[0])
    chosen, ids, values = [], [], []
    for start in range(0, at_policy.shape[0], rows):
        part = at_policy[start:start + rows]
        logits = (parts.head(part) if parts.split else part).astype(mx.float32)
        if temperature not in (0, 1):
            logits = logits / temperature
        logits = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        top = mx.argpartition(-logits, k - 1, axis=-1)[:, :k]
        chosen.append(mx.take_along_axis(logits, picked_targets[start:start + rows, None], axis=-1)[:, 0])
        ids.append(top.astype(mx.int32))
        values.append(mx.take_along_axis(logits, top, axis=-1))
        mx.eval(chosen[-1], ids[-1], values[-1])  # one chunk's logits alive at a time
    flat = mx.concatenate([*chosen, mx.zeros((1,), mx.float32)])
    return flat[gather_back].reshape(batch, length), mx.concatenate(ids), mx.concatenate(values)
