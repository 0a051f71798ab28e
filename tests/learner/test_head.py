"""The vocabulary projection in chunks: the same logprobs and gradients as the whole projection."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from artmlx.engine.memory import head_chunk_rows
from artmlx.learner.head import chunked_logprobs


def numpy_logprobs(hidden, weight, targets, temperature):
    """log softmax((hidden @ weight.T) / T) at the targets, and its gradient wrt hidden for a sum
    weighted by `coefficients` (below): d/dh = (onehot - softmax) / T @ weight, row by row."""
    logits = (hidden.astype(np.float64) @ weight.T.astype(np.float64)) / temperature
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return logp[np.arange(len(targets)), targets], np.exp(logp)


@pytest.mark.parametrize("rows, temperature", [(3, 1.0), (4, 0.7), (64, 1.3)])
def test_chunks_equal_the_whole_projection_in_value_and_gradient(rows, temperature):
    rng = np.random.default_rng(0)
    n, dims, vocab = 10, 16, 50  # 10 rows in chunks of 3: a ragged last chunk
    hidden = rng.standard_normal((n, dims)).astype(np.float32)
    weight = rng.standard_normal((vocab, dims)).astype(np.float32) * 0.5
    targets = rng.integers(0, vocab, n)
    coefficients = rng.standard_normal(n).astype(np.float32)
    head = nn.Linear(dims, vocab, bias=False)
    head.weight = mx.array(weight)

    def loss(x):
        return (chunked_logprobs(head, x, mx.array(targets), temperature, rows) * mx.array(coefficients)).sum()

    values = chunked_logprobs(head, mx.array(hidden), mx.array(targets), temperature, rows)
    grad = mx.grad(loss)(mx.array(hidden))
    expected, probabilities = numpy_logprobs(hidden, weight, targets, temperature)
    onehot = np.eye(vocab)[targets]
    expected_grad = ((onehot - probabilities) * coefficients[:, None] / temperature) @ weight
    assert np.allclose(np.array(values), expected, atol=1e-5)
    assert np.allclose(np.array(grad), expected_grad, atol=1e-5)


def test_a_quantized_tied_head_gives_the_plain_gradient():
    """The embedded-model case: a 4-bit tied embedding's `as_linear`, against MLX's own autodiff."""
    embedding = nn.QuantizedEmbedding(256, 64, group_size=64, bits=4)
    embedding.weight, embedding.scales, embedding.biases = mx.quantize(mx.random.normal((256, 64)) * 0.1, 64, 4)
    hidden = mx.random.normal((37, 64), key=mx.random.key(1))
    targets = mx.random.randint(0, 256, (37,), key=mx.random.key(2))

    def plain(x):
        logits = embedding.as_linear(x).astype(mx.float32)
        return (mx.take_along_axis(logits, targets[:, None], axis=-1)[:, 0] - mx.logsumexp(logits, axis=-1)).sum()

    def chunked(x):
        return chunked_logprobs(embedding.as_linear, x, targets, 1.0, 8).sum()

    assert np.allclose(np.array(mx.grad(chunked)(hidden)), np.array(mx.grad(plain)(hidden)), atol=1e-5)
    assert abs(chunked(hidden).item() - plain(hidden).item()) < 1e-3


def test_chunk_rows_follow_the_vocabulary():
    assert head_chunk_rows(151936) == 220 and head_chunk_rows(262144) == 128 and head_chunk_rows(64) == 4096
