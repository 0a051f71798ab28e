"""Turn groups of episodes into padded micro-batches that fit a token budget, sharing each prompt.

The G episodes of a group start with the same prompt. Its tokens up to the first one any episode's
policy sampled (the group's common prefix, length P) are computed once per micro-batch: the prefix
row holds tokens[:P-1] and every episode row holds tokens[P-1:L-1] as inputs (targets tokens[P:L]),
attending to the prefix's keys and values. That is exactly the full forward's arithmetic for every
position the loss uses (the loss needs logits only at targets the policy sampled, all at or after P),
and saves (G-1) x P tokens of compute per group.

Units are groups, or parts of a group when one group alone exceeds the budget (each part then
carries the prefix again). Units are sorted by continuation length (less padding) and packed
greedily: a micro-batch holds units while rows x padded length + prefix rows x prefix length stay
within `max_tokens`. Lengths are padded to a multiple of `pad_multiple` so a compiled step sees few
distinct shapes. A unit longer than the budget gets a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..trajectory import Episode


def padded_length(length: int, pad_multiple: int) -> int:
    return -(-length // pad_multiple) * pad_multiple


def common_prefix(episodes: list[Episode]) -> int:
    """Length of the tokens every episode shares before the first policy-sampled token of any of them."""
    limit = min(e.policy_mask.index(True) if True in e.policy_mask else len(e.tokens) for e in episodes)
    first = episodes[0].tokens
    length = 0
    while length < limit and all(e.tokens[length] == first[length] for e in episodes[1:]):
        length += 1
    return length


@dataclass
class Unit:
    """Episodes (indices into the update's list) that share one prefix of `prefix` tokens."""

    episodes: list[int]
    prefix: int  # P: tokens shared by the episodes; the prefix row feeds P - 1 of them
    width: int  # inputs of the longest episode after the prefix row: L - 1 - (P - 1)

    def tokens(self, pad_multiple: int) -> int:
        prefix_row = padded_length(max(self.prefix - 1, 0), pad_multiple)
        return len(self.episodes) * padded_length(self.width, pad_multiple) + prefix_row


def make_units(episodes: list[Episode], groups: list[list[int]], max_tokens: int, pad_multiple: int,
               share_prefix: bool = True) -> list[Unit]:
    """One unit per group (its common prefix shared), split where a group alone exceeds `max_tokens`."""
    units = []
    for members in groups:
        prefix = common_prefix([episodes[i] for i in members]) if share_prefix else 0
        width = {i: len(episodes[i].tokens) - 1 - max(prefix - 1, 0) for i in members}
        part: list[int] = []
        for index in sorted(members, key=lambda i: -width[i]):  # a part is as wide as its first episode
            if part and Unit(part + [index], prefix, width[part[0]]).tokens(pad_multiple) > max_tokens:
                units.append(Unit(part, prefix, width[part[0]]))
                part = []
            part.append(index)
        if part:
            units.append(Unit(part, prefix, width[part[0]]))
    return units


def pack_units(units: list[Unit], max_tokens: int, pad_multiple: int = 1) -> list[list[Unit]]:
    """Units per micro-batch, longest first, each within `max_tokens` padded tokens."""
    order = sorted(units, key=lambda u: -u.width)
    batches: list[list[Unit]] = []
    current: list[Unit] = []
    for unit in order:
        trial = current + [unit]
        if current and _batch_tokens(trial, pad_multiple) > max_tokens:
            batches.append(current)
            trial = [unit]
        current = trial
    if current:
        batches.append(current)
    return batches


def _batch_tokens(units: list[Unit], pad_multiple: int) -> int:
    rows = sum(len(u.episodes) for u in units)
    width = padded_length(max(u.width for u in units), pad_multiple)
    prefix_width = padded_length(max(max(u.prefix - 1, 0) for u in units), pad_multiple)
    return rows * width + len(units) * prefix_width


@dataclass
class MicroBatch:
    prefix_inputs: mx.array | None  # (P, Wp) token ids of each unit's shared prefix (P - 1 tokens), or None
    prefix_lengths: mx.array  # (P,) real tokens in each prefix row
    row_prefix: mx.array  # (B,) which prefix row each episode row continues
    inputs: mx.array  # (B, T) token ids fed to the model after the prefix
    targets: mx.array  # (B, T) next token ids
    mask: mx.array  # (B, T) 1 where the target was sampled by the policy
    behaviour_logprobs: mx.array  # (B, T)
    advantages: mx.array  # (B, T): each target's advantage (the episode's, or per token with a hint)
    policy_positions: mx.array  # (n,) flat indices into B x T of the policy targets (padded with 0 to pad_multiple)
    gather_back: mx.array  # (B x T,) index into the n policy logprobs, n (a zero) elsewhere
    episodes: list[int]
    # hint_topk > 0 (`distill.topk_reverse_kl`): per policy position, in `policy_positions`' order, a hinted
    # teacher's K likeliest ids (n, K) and their logprobs (n, K), and 1 where the position's episode had a hint (n,)
    topk_ids: mx.array | None = None
    topk_teacher: mx.array | None = None
    topk_mask: mx.array | None = None

    @property
    def tokens(self) -> int:
        prefix = 0 if self.prefix_inputs is None else self.prefix_inputs.size
        return self.inputs.size + prefix

    def arrays(self) -> list[mx.array]:
        prefix = self.prefix_inputs if self.prefix_inputs is not None else mx.zeros((0, 0), mx.int32)
        return [prefix, self.prefix_lengths, self.row_prefix, self.inputs, self.targets, self.policy_positions,
                self.gather_back]


def make_microbatch(episodes: list[Episode], advantages: np.ndarray, units: list[Unit],
                    pad_multiple: int = 1, token_advantages: dict[int, np.ndarray] | None = None,
                    topk: int = 0, teacher_topk: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> MicroBatch:
    """Shift each transcript into (input, target) pairs after its unit's prefix and right-pad them.

    `advantages` holds one per episode; `token_advantages` (episode index -> one per token of the episode,
    `distill.token_advantages`) replaces it token by token for the episodes it names. With `topk` > 0 the
    batch carries `teacher_topk`'s (episode index -> ids and logprobs (sampled tokens, topk), in order) at
    its policy positions, zeros with mask 0 for episodes it does not name."""
    token_advantages = token_advantages or {}
    rows = [(u, i) for u, unit in enumerate(units) for i in unit.episodes]
    width = padded_length(max(unit.width for unit in units), pad_multiple)
    prefix_width = padded_length(max(max(unit.prefix - 1, 0) for unit in units), pad_multiple)
    shape = (len(rows), width)
    inputs, targets = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    mask, behaviour = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    advantage = np.zeros(shape, np.float32)
    row_prefix = np.zeros(len(rows), np.int32)
    for row, (u, i) in enumerate(rows):
        episode = episodes[i]
        start = max(units[u].prefix - 1, 0)
        tokens = np.asarray(episode.tokens, np.int32)
        n = len(tokens) - 1 - start
        inputs[row, :n], targets[row, :n] = tokens[start:-1], tokens[start + 1 :]
        mask[row, :n] = np.asarray(episode.policy_mask[start + 1 :], np.float32)
        behaviour[row, :n] = np.asarray(episode.logprobs[start + 1 :], np.float32)
        if i in token_advantages:
            advantage[row, :n] = np.asarray(token_advantages[i], np.float32)[start + 1 :]
        else:
            advantage[row, :n] = advantages[i]
        row_prefix[row] = u
    prefix_lengths = np.array([max(unit.prefix - 1, 0) for unit in units], np.int32)
    prefix_inputs = None
    if prefix_width:
        prefix_inputs = np.zeros((len(units), prefix_width), np.int32)
        for u, unit in enumerate(units):
            first = episodes[unit.episodes[0]].tokens
            prefix_inputs[u, : prefix_lengths[u]] = first[: prefix_lengths[u]]
    flat = np.flatnonzero(mask.reshape(-1) > 0)
    count = len(flat)
    padded = np.zeros(padded_length(max(count, 1), pad_multiple), np.int32)  # few distinct shapes to compile
    padded[:count] = flat
    gather_back = np.full(mask.size, len(padded), np.int32)
    gather_back[flat] = np.arange(count, dtype=np.int32)
    topk_arrays = {}
    if topk:
        topk_arrays = _topk_at_policy(episodes, units, rows, mask, topk, teacher_topk or {}, len(padded))
    return MicroBatch(**topk_arrays,
        prefix_inputs=None if prefix_inputs is None else mx.array(prefix_inputs),
        prefix_lengths=mx.array(prefix_lengths),
        row_prefix=mx.array(row_prefix),
        inputs=mx.array(inputs),
        targets=mx.array(targets),
        mask=mx.array(mask),
        behaviour_logprobs=mx.array(behaviour),
        advantages=mx.array(advantage),
        policy_positions=mx.array(padded),
        gather_back=mx.array(gather_back),
        episodes=[i for _, i in rows],
    )


def _topk_at_policy(episodes, units, rows, mask, topk, teacher_topk, padded) -> dict:
    """The teacher's top-K ids, logprobs and a hinted-mask at the batch's policy positions (row-major, as
    `policy_positions`), padded to `padded` rows."""
    ids, values, hinted = np.zeros((padded, topk), np.int32), np.zeros((padded, topk), np.float32), np.zeros(padded, np.float32)
    at = 0
    for row, (u, i) in enumerate(rows):
        here = int((mask[row] > 0).sum())
        if i in teacher_topk:
            start = max(units[u].prefix - 1, 0)
            before = int(np.asarray(episodes[i].policy_mask[: start + 1], bool).sum())  # sampled inside the prefix
            episode_ids, episode_values = teacher_topk[i]
            if len(episode_ids) != before + here or episode_ids.shape[1] != topk:
                raise ValueError(f"teacher top-{topk} of shape {episode_ids.shape} for an episode with "
                                 f"{before + here} sampled tokens")
            ids[at:at + here], values[at:at + here] = episode_ids[before:], episode_values[before:]
            hinted[at:at + here] = 1.0
        at += here
    return {"topk_ids": mx.array(ids), "topk_teacher": mx.array(values), "topk_mask": mx.array(hinted)}
