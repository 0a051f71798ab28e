"""The one sampling rule: every generator (rollouts, evaluation, the server's scheduler) draws with `sample`.

For each row of next-token logits, in this order (vLLM's):
1. `logit_bias` and the penalties are added to the logits. The penalties are OpenAI's, over the
   tokens the row has generated so far (`c[j]` = how often token j came):
   `logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty`;
2. temperature: the logits are divided by it (0: greedy, the distribution stays untempered);
3. `top_p` (nucleus): the most likely tokens whose mass before them is below `top_p` are kept (at
   least one; tokens tied with the least likely kept one are kept too), the rest get probability 0,
   and the distribution is renormalised;
4. the token: the argmax for greedy rows; otherwise a draw from the distribution (Gumbel-max; on the
   CPU backend by inverse CDF, see `_inverse_cdf`). A row with a `seed` draws its Gumbel noise from its
   own key `(seed mod 2**32, stream * 2**24 + t)` for its t-th token, so its tokens do not depend on
   what else is in the batch or on the step key; the others share the step's key.
The recorded logprob of a token is its log probability under the distribution of step 3, the one it
was drawn from; `top` asks for the `k` most likely tokens of that distribution too.

Only steps 2 and 4 change what the learner recomputes (temperature only), so a row that used
`top_p < 1`, a bias or a penalty has logprobs the learner cannot reproduce: `Options.modified` names
them, and trainers refuse such sequences. A seed changes which token is drawn, not the distribution.

The plain path (temperature only: `options` None) is two ops past the logits, as before: rows
without options cost nothing extra, and options are applied only to the rows that have them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import mlx.core as mx
import numpy as np

LOG2E = 1.4426950408889634
CDF_BLOCK = 512
"""Tokens per block of the CPU draw (`_inverse_cdf`): 297 blocks for Qwen's vocabulary."""
SEED_STREAM_TOKENS = 1 << 24
"""Tokens per seed stream: a seeded row's t-th token (t below this) has a key of its own."""


@dataclass
class Options:
    """What one sequence asks of the sampler beyond its temperature (the defaults change nothing)."""

    top_p: float = 1.0
    """Nucleus mass kept, in [0, 1]; 1: all tokens."""
    seed: int | None = None
    """Draw from this sequence's own keys (reproducible whatever the batch); None: the step's key."""
    seed_stream: int = 0
    """Which stream of the seed (the choice index when one request asks for several with one seed)."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Token id -> added to its logit before temperature."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated so far (OpenAI's; in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was generated so far (OpenAI's; in [-2, 2])."""
    top_logprobs: int = 0
    """The k most likely tokens of the distribution drawn from, recorded with each token."""

    @property
    def plain(self) -> bool:
        return not (self.modified or self.seed is not None or self.top_logprobs)

    @property
    def modified(self) -> list[str]:
        """The options that change the distribution from the tempered one (what the learner recomputes)."""
        return [name for name, used in (("top_p", self.top_p < 1.0), ("logit_bias", bool(self.logit_bias)),
                                        ("presence_penalty", self.presence_penalty != 0.0),
                                        ("frequency_penalty", self.frequency_penalty != 0.0)) if used]


class Sampled(NamedTuple):
    tokens: mx.array  # (rows,)
    logprobs: mx.array  # (rows,), under the distribution each token was drawn from
    top_ids: mx.array | None = None  # (rows, k) most likely first, when a row asked for top_logprobs
    top_logprobs: mx.array | None = None  # (rows, k)


def sample(logits: mx.array, temperatures: np.ndarray, key: mx.array, options: Sequence[Options] | None = None,
           generated: Sequence[Sequence[int]] | None = None) -> Sampled:
    """One token per row of `logits` (rows, V) at that row's temperature (0: greedy) with its `options`
    (None: none for any row) and the tokens it `generated` so far (for penalties and seeds)."""
    logits = logits.astype(mx.float32)
    if options is not None:
        logits = _add_bias_and_penalties(logits, options, generated)
    greedy = temperatures == 0
    if greedy.all():
        scaled = logits
    else:
        scaled = logits / mx.array(np.where(greedy, 1.0, temperatures).astype(np.float32))[:, None]
    # The learner's formula (learner/grpo.py), op for op: a token's logprob must equal its recomputation bit for bit
    logprobs = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    if options is not None:
        logprobs = _nucleus(logprobs, np.array([o.top_p for o in options], np.float32))
    if greedy.all():
        tokens = mx.argmax(scaled, axis=-1)  # top_p keeps the argmax; the bias is in `scaled`
    elif mx.default_device() == mx.cpu:
        tokens = _inverse_cdf(_exp(logprobs), key)
    else:
        tokens = mx.random.categorical(logprobs, key=key)
    if not greedy.all():
        if greedy.any():
            tokens = mx.where(mx.array(greedy), mx.argmax(scaled, axis=-1), tokens)
        if options is not None:
            tokens = _seeded_draws(tokens, logprobs, options, generated, greedy)
    picked = mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    k = max((o.top_logprobs for o in options), default=0) if options is not None else 0
    if not k:
        return Sampled(tokens, picked)
    top_ids = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
    top_values = mx.take_along_axis(logprobs, top_ids, axis=-1)
    order = mx.argsort(-top_values, axis=-1)
    return Sampled(tokens, picked, mx.take_along_axis(top_ids, order, axis=-1),
                   mx.take_along_axis(top_values, order, axis=-1))


def _exp(x: mx.array) -> mx.array:
    """exp(x) as 2 ** (x log2 e): on x86 MLX's CPU `exp` took 51 ms for 16 x 151,936 elements, `power` 26 ms
    (NumPy's exp 10 ms); at a real vocabulary the sampler's exponentials were most of a CPU decode step."""
    return mx.power(2.0, x * LOG2E)


def _inverse_cdf(probs: mx.array, key: mx.array) -> mx.array:
    """One draw per row from `probs` (rows, V), non-negative and unnormalised, by inverse CDF in two levels: a
    block of `CDF_BLOCK` tokens by the blocks' masses, then the token inside it, each where a uniform fraction of
    the running mass falls (float64 running sums, a 48-bit fraction; one running sum over 150 k float32 entries
    would move the rare tokens' boundaries). Exact like Gumbel-max, with one random number per row instead of one
    per entry, and no array of the row's width beyond the padded copy; a token of probability 0 is never drawn."""
    rows, vocab = probs.shape
    blocks = -(-vocab // CDF_BLOCK)
    padded = mx.pad(probs, [(0, 0), (0, blocks * CDF_BLOCK - vocab)]).reshape(rows, blocks, CDF_BLOCK)
    coarse, fine = mx.split(mx.random.uniform(shape=(rows, 2), key=key).astype(mx.float64), 2, axis=1)
    fraction = (coarse + fine * 2.0**-24) / (1.0 + 2.0**-24)  # in [0, 1): both are below 1
    mass = padded.sum(axis=-1).astype(mx.float64)
    running = mx.cumsum(mass, axis=-1)
    target = fraction * running[:, -1:]
    block = (running <= target).sum(axis=-1, keepdims=True)  # below `blocks`: the target is below the total
    within = (target - (mx.take_along_axis(running, block, axis=-1) - mx.take_along_axis(mass, block, axis=-1)))
    within = mx.clip(within / mx.take_along_axis(mass, block, axis=-1), 0.0, 1.0 - 2.0**-48)
    inner = mx.cumsum(mx.take_along_axis(padded, block[:, :, None], axis=1)[:, 0].astype(mx.float64), axis=-1)
    token = block[:, 0] * CDF_BLOCK + (inner <= within * inner[:, -1:]).sum(axis=-1)
    return token.astype(mx.uint32)


def _add_bias_and_penalties(logits: mx.array, options: Sequence[Options], generated) -> mx.array:
    """One scatter-add of every row's bias and penalty entries (rows without them add nothing)."""
    rows, ids, deltas = [], [], []
    for row, option in enumerate(options):
        if option.logit_bias:
            rows += [row] * len(option.logit_bias)
            ids += option.logit_bias.keys()
            deltas += option.logit_bias.values()
        if (option.presence_penalty or option.frequency_penalty) and generated[row]:
            seen, counts = np.unique(np.asarray(generated[row]), return_counts=True)
            rows += [row] * len(seen)
            ids += seen.tolist()
            deltas += (-(counts * option.frequency_penalty + option.presence_penalty)).tolist()
    if not rows:
        return logits
    return logits.at[mx.array(rows), mx.array(ids)].add(mx.array(np.array(deltas, np.float32)))


def _nucleus(logprobs: mx.array, top_p: np.ndarray) -> mx.array:
    """Renormalised nucleus of the rows with top_p < 1; the other rows are returned as they are."""
    rows = np.flatnonzero(top_p < 1.0)
    if not len(rows):
        return logprobs
    index = mx.array(rows)
    part = logprobs[index]
    ordered = mx.sort(part, axis=-1)[:, ::-1]
    probs = mx.exp(ordered)
    before = mx.cumsum(probs, axis=-1) - probs  # the mass of the tokens more likely than each
    kept = mx.maximum((before < mx.array(top_p[rows])[:, None]).sum(axis=-1), 1)
    least = mx.take_along_axis(ordered, (kept - 1)[:, None], axis=-1)
    part = mx.where(part >= least, part, -mx.inf)
    logprobs[index] = part - mx.logsumexp(part, axis=-1, keepdims=True)
    return logprobs


def _seeded_draws(tokens: mx.array, logprobs: mx.array, options: Sequence[Options], generated,
                  greedy: np.ndarray) -> mx.array:
    """Replace the draws of seeded, non-greedy rows by Gumbel-max with each row's own key."""
    rows = [row for row, option in enumerate(options) if option.seed is not None and not greedy[row]]
    if not rows:
        return tokens
    keys = np.array([[options[row].seed % (1 << 32), (options[row].seed_stream * SEED_STREAM_TOKENS
                                                        + len(generated[row]) % SEED_STREAM_TOKENS) % (1 << 32)]
                     for row in rows], np.uint32)
    vocab = logprobs.shape[-1]
    noise = mx.vmap(lambda key: mx.random.gumbel((vocab,), key=key))(mx.array(keys))
    index = mx.array(rows)
    tokens[index] = mx.argmax(logprobs[index] + noise, axis=-1).astype(tokens.dtype)
    return tokens
