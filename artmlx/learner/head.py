"""The policy tokens' logprobs through the vocabulary projection, a chunk of rows at a time.

The head turns n hidden states into n x V logits (V = 151,936 for Qwen): for a 4,096-token episode
that is 2.5 GB per float32 copy, and a plain `logsumexp` with its gradient keeps several (the memory
plan counted 16 bytes per entry: 10 GB, more than a 7B model's activations with checkpointing).
`chunked_logprobs` never holds more than `rows` x V of them:
- forward: per chunk of rows, logits -> the target's logit minus the logsumexp, then the chunk's
  logits are dropped;
- backward (a custom VJP, so nothing of the forward is kept): per chunk, the logits again, softmax,
  d(logprob)/d(logits) = onehot(target) - softmax, times the cotangent, back through the head.
Each chunk's input is made to depend on the previous chunk's output (`mx.depends`): MLX would
otherwise schedule every chunk's projection at once and hold them all (measured: chunking alone, with
or without `mx.checkpoint`, did not lower the peak). Measured on this CPU, V = 151,936, 128-row
chunks: peak 0.78 GB at 1,024 and at 2,048 policy tokens, against 1.87 and 3.74 GB unchunked, same
values and gradients, 1.5x the head's time (its forward runs twice).

The head's own weights get no gradient here (the base is frozen; LoRA never targets the head). How
many rows a chunk has, and the memory it takes, is the memory plan's (`engine/memory.head_chunk_rows`).
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

def _scaled_logits(head: Callable, temperature: float) -> Callable:
    """x -> head(x) in float32, divided by the temperature (the sampler's)."""
    def logits_of(x: mx.array) -> mx.array:
        logits = head(x).astype(mx.float32)
        return logits if temperature in (0, 1) else logits / temperature
    return logits_of


def _chunks(n: int, rows: int) -> list[tuple[int, int]]:
    return [(start, min(start + rows, n)) for start in range(0, n, rows)]


def chunked_logprobs(head: Callable, hidden: mx.array, targets: mx.array, temperature: float,
                     rows: int) -> mx.array:
    """log softmax(head(hidden) / temperature)[target] for each of the n rows of `hidden` (n, D).

    `targets` (n,) gives one logprob per row; (n, J) gives J per row (the sampled token and a hinted teacher's
    top K, `distill.topk_reverse_kl`), ids may repeat within a row."""
    if targets.ndim == 2:
        return _chunked_logprobs_many(head, hidden, targets, temperature, rows)
    logits_of = _scaled_logits(head, temperature)
    chunks = lambda n: _chunks(n, rows)  # noqa: E731

    @mx.custom_function
    def logprobs(x: mx.array, t: mx.array) -> mx.array:
        out = []
        for start, end in chunks(x.shape[0]):
            part = x[start:end] if not out else mx.depends(x[start:end], out[-1])
            logits = logits_of(part)
            picked = mx.take_along_axis(logits, t[start:end, None], axis=-1)[:, 0]
            out.append(picked - mx.logsumexp(logits, axis=-1))
        return mx.concatenate(out) if out else mx.zeros((0,), mx.float32)

    @logprobs.vjp
    def logprobs_vjp(primals, cotangent, output):
        x, t = primals
        grads = []
        for start, end in chunks(x.shape[0]):
            # after the forward's last chunk (`output`), then after the previous chunk's gradient
            part = mx.depends(x[start:end], grads[-1] if grads else output)
            weight = cotangent[start:end, None]
            d_logits = -mx.softmax(logits_of(part), axis=-1) * weight
            at_target = t[start:end, None]
            d_logits = mx.put_along_axis(d_logits, at_target,
                                         mx.take_along_axis(d_logits, at_target, axis=-1) + weight, axis=-1)
            grads.append(mx.vjp(logits_of, [part], [d_logits])[1][0])
        grad = mx.concatenate(grads) if grads else mx.zeros_like(x)
        return grad.astype(x.dtype), mx.zeros_like(t)

    return logprobs(hidden, targets)


def _chunked_logprobs_many(head: Callable, hidden: mx.array, targets: mx.array, temperature: float,
                           rows: int) -> mx.array:
    """`chunked_logprobs` with J targets per row (n, J): the same chunking and custom backward, the
    logits' gradient taken by MLX from the chunk's picks (which adds up repeated ids)."""
    logits_of = _scaled_logits(head, temperature)
    chunks = lambda n: _chunks(n, rows)  # noqa: E731

    def pick(logits: mx.array, t: mx.array) -> mx.array:
        return mx.take_along_axis(logits, t, axis=-1) - mx.logsumexp(logits, axis=-1, keepdims=True)

    @mx.custom_function
    def logprobs(x: mx.array, t: mx.array) -> mx.array:
        out = []
        for start, end in chunks(x.shape[0]):
            part = x[start:end] if not out else mx.depends(x[start:end], out[-1])
            out.append(pick(logits_of(part), t[start:end]))
        return mx.concatenate(out) if out else mx.zeros((0, t.shape[1]), mx.float32)

    @logprobs.vjp
    def logprobs_vjp(primals, cotangent, output):
        x, t = primals
        grads = []
        for start, end in chunks(x.shape[0]):
            part = mx.depends(x[start:end], grads[-1] if grads else output)
            logits = logits_of(part)
            d_logits = mx.vjp(lambda l: pick(l, t[start:end]), [logits], [cotangent[start:end]])[1][0]
            grads.append(mx.vjp(logits_of, [part], [d_logits])[1][0])
        grad = mx.concatenate(grads) if grads else mx.zeros_like(x)
        return grad.astype(x.dtype), mx.zeros_like(t)

    return logprobs(hidden, targets)
