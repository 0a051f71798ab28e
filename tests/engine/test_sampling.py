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


def test_draws_and_logprobs_are_exact_at_a_real_vocabulary():
    """Qwen's 151,936 entries: on the CPU backend the draw is by inverse CDF over a float64 running sum; the
    masses drawn match the distribution, a token of probability 0 is never drawn, and the logprobs are the
    learner's (`picked - mx.logsumexp`, learner/grpo.py) exactly. Both sum float32 in order on the CPU, which here puts
    them 2.1e-3 below a float64 log-softmax: 150 k small terms after a large one each lose a rounding."""
    vocab, rows = 151936, 32
    probs = np.full(vocab, 0.2 / (vocab - 1011), np.float64)
    probs[7] = 0.5
    probs[100_000:101_000] = 0.3 / 1000
    probs[[3, 150_000, vocab - 1]] = 0.0
    logits = np.where(probs > 0, np.log(np.where(probs > 0, probs, 1.0)) + 1.7, -np.inf).astype(np.float32)
    drawn = []
    for step in range(40):
        out = sample(mx.array(np.repeat(logits[None], rows, axis=0)), np.ones(rows, np.float32), mx.random.key(step))
        tokens = np.array(out.tokens)
        learner = np.array(mx.array(logits) - mx.logsumexp(mx.array(logits)))
        np.testing.assert_array_equal(np.array(out.logprobs), learner[tokens])  # bit for bit, as the learner
        exact = logits.astype(np.float64) - np.logaddexp.reduce(logits.astype(np.float64))
        np.testing.assert_allclose(np.array(out.logprobs), exact[tokens], atol=3e-3)
        drawn += tokens.tolist()
    drawn = np.array(drawn)
    assert not np.isin(drawn, [3, 150_000, vocab - 1]).any()
    masses = [(drawn == 7).mean(), ((drawn >= 100_000) & (drawn < 101_000)).mean()]
    np.testing.assert_allclose(masses, [0.5, 0.3], atol=0.05)
    assert len(set(drawn[(drawn != 7) & ((drawn < 100_000) | (drawn >= 101_000))])) > 150  # the tail is drawn too
