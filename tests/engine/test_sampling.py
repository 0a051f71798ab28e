"""The one sampling rule against a NumPy reference of each option, rows with and without options mixed."""

import mlx.core as mx
import numpy as np

from artmlx.engine.sampling import Options, sample

VOCAB = 50


def reference_logprobs(logits: np.ndarray, temperature: float, option: Options, generated: list[int]) -> np.ndarray:
    """bias and penalties on the logits, then temperature, then the nucleus, renormalised (NumPy)."""
    row = logits.astype(np.float64).copy()
    for token, bias in option.logit_bias.items():
        row[token] += bias
    counts = np.bincount(generated, minlength=VOCAB).astype(np.float64)
    row -= counts * option.frequency_penalty + (counts > 0) * option.presence_penalty
    row /= temperature or 1.0
    logprobs = row - np.logaddexp.reduce(row)
    if option.top_p < 1:
        order = np.argsort(-logprobs)
        probs = np.exp(logprobs[order])
        kept = max(1, int(((np.cumsum(probs) - probs) < option.top_p).sum()))
        mask = logprobs >= logprobs[order[kept - 1]]
        logprobs = np.where(mask, logprobs - np.logaddexp.reduce(logprobs[mask]), -np.inf)
    return logprobs


def test_each_row_gets_its_own_options_in_one_call():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, VOCAB)).astype(np.float32) * 2
    temperatures = np.array([1.0, 0.7, 0.0, 1.3, 1.0, 0.9], np.float32)
    options = [Options(), Options(top_p=0.5), Options(logit_bias={3: 5.0, 7: -100.0}),
               Options(presence_penalty=1.2, frequency_penalty=0.6), Options(seed=4, top_logprobs=5),
               Options(top_p=0.8, logit_bias={1: 2.0}, frequency_penalty=-0.5)]
    generated = [[], [1, 2], [3, 3], [5, 5, 5, 9], [8], [1, 1, 2]]
    for step in range(20):
        out = sample(mx.array(logits), temperatures, mx.random.key(step), options, generated)
        tokens, picked = np.array(out.tokens), np.array(out.logprobs)
        for row, (temperature, option) in enumerate(zip(temperatures, options)):
            expected = reference_logprobs(logits[row], temperature, option, generated[row])
            assert np.isfinite(expected[tokens[row]])  # drawn from inside its nucleus
            np.testing.assert_allclose(picked[row], expected[tokens[row]], atol=1e-4)
        assert tokens[2] == np.argmax(reference_logprobs(logits[2], 0.0, options[2], generated[2]))
        top = np.array(out.top_ids)[4]
        np.testing.assert_array_equal(top, np.argsort(-reference_logprobs(logits[4], 1.0, options[4], [8]))[:5])


def test_a_seeded_row_draws_the_same_whatever_the_batch_and_step_key():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, VOCAB)).astype(np.float32)
    seeded = Options(seed=12345)
    alone = sample(mx.array(logits[2:3]), np.ones(1, np.float32), mx.random.key(0), [seeded], [[1, 2]])
    batched = sample(mx.array(logits), np.ones(4, np.float32), mx.random.key(99),
                     [Options(), Options(top_p=0.3), seeded, Options(seed=7)], [[], [], [1, 2], []])
    assert int(np.array(batched.tokens)[2]) == int(np.array(alone.tokens)[0])
    draws = {int(np.array(sample(mx.array(logits[2:3]), np.ones(1, np.float32), mx.random.key(0),
                                 [Options(seed=12345)], [[0] * t]).tokens)[0]) for t in range(30)}
    assert len(draws) > 3  # the key moves with the token index


def test_the_plain_path_draws_from_the_tempered_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.2]], np.float32)).repeat(4000, axis=0)
    out = sample(mx.array(logits), np.ones(4000, np.float32), mx.random.key(3))
    np.testing.assert_allclose(np.bincount(np.array(out.tokens), minlength=3) / 4000, [0.5, 0.3, 0.2], atol=0.03)
    np.testing.assert_allclose(np.array(out.logprobs), np.log([0.5, 0.3, 0.2])[np.array(out.tokens)], atol=1e-6)
