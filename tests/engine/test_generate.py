import mlx.core as mx
import numpy as np
import pytest

from artmlx.engine.cache import make_ragged_cache
from artmlx.engine.generate import Engine, sample_tokens
from artmlx.engine.memory import MemoryPlan, ModelShape
from artmlx.model.parts import model_parts
from tests.helpers import tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(perturb=0.02)


def _chunks(rng, sizes):
    return [[int(t) for t in rng.integers(6, 100, size=n)] for n in sizes]


def test_ragged_cache_matches_full_forward(policy):
    """Ragged chunks with holes give each row the logits of its own contiguous sequence."""
    model, _ = policy
    rng = np.random.default_rng(0)
    rows, later = _chunks(rng, (5, 9, 2)), _chunks(rng, (3, 1, 6))
    cache = make_ragged_cache(model, 3, block=4)  # a small block makes the buffers grow several times
    for chunks in (rows, later):
        width = max(map(len, chunks))
        padded = np.zeros((3, width), np.int32)
        for i, c in enumerate(chunks):
            padded[i, : len(c)] = c
        out = cache.forward(lambda x, c: model(x, cache=c), mx.array(padded), mx.array([len(c) for c in chunks]))
    for i in range(3):
        full = rows[i] + later[i]
        expected = model(mx.array([full]))[0, -len(later[i]):]
        np.testing.assert_allclose(np.array(out[i, : len(later[i])]), np.array(expected), atol=2e-4, rtol=1e-4)
    assert cache.offset.tolist() == [8, 10, 8] and cache.used == 15
    # Reordering/repeating rows keeps each row's state, in every layer.
    cache.select(mx.array([2, 2, 0]))
    assert cache.offset.tolist() == [8, 8, 8]
    assert all(layer.keys.shape[0] == 3 for layer in cache.layers)


def test_prefill_returns_last_position_logits_in_any_chunking(policy):
    """Logits only at each row's last token, equal to the full model's, whether prefill is chunked or not."""
    model, _ = policy
    rng = np.random.default_rng(1)
    prompts = _chunks(rng, (7, 3, 12, 1))
    expected = np.stack([np.array(model(mx.array([p]))[0, -1]) for p in prompts])
    whole = Engine(model)
    tiny_budget = MemoryPlan(budget=0, shape=ModelShape.of(model))  # no room: 16-token chunks, 4 columns each
    assert tiny_budget.prefill_tokens(64) == 16
    for engine in (whole, Engine(model, tiny_budget)):
        cache = engine.new_cache(len(prompts))
        logits = engine.prefill(cache, prompts)
        assert logits.shape == (len(prompts), model.args.vocab_size)
        np.testing.assert_allclose(np.array(logits), expected, atol=2e-4, rtol=1e-4)
        assert cache.offset.tolist() == [7, 3, 12, 1]


def test_decode_stops_rows_at_their_stop_token(policy):
    model, _ = policy
    engine = Engine(model)
    cache = engine.new_cache(3)
    logits = engine.prefill(cache, [[1, 5, 6], [1, 7], [1, 8, 9, 10]])
    # Greedy decoding is deterministic: whatever each row's first token is, making it a stop token ends that row.
    first = np.array(mx.argmax(logits, axis=-1)).tolist()
    tokens, logprobs, valid = engine.decode(cache, logits, mx.random.key(0), temperature=0.0, max_tokens=5,
                                            stop_tokens={first[0]})
    assert tokens[0, 0] == first[0] and valid[0].tolist() == [True, False, False, False, False][: valid.shape[1]]
    assert (logprobs <= 0).all() and tokens.shape == valid.shape == logprobs.shape


def test_sampled_logprobs_are_tempered_log_softmax():
    logits = mx.array([[0.0, 1.0, 2.0], [2.0, 0.0, -1.0]])
    for temperature in (1.0, 0.5):
        tokens, logprobs = sample_tokens(logits, temperature, mx.random.key(3))
        scaled = np.array(logits) / temperature
        ref = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
        np.testing.assert_allclose(np.array(logprobs), ref[np.arange(2), np.array(tokens)], rtol=1e-5)
    greedy, _ = sample_tokens(logits, 0.0, mx.random.key(0))
    assert greedy.tolist() == [2, 0]


def test_model_parts_split_is_exact(policy):
    model, _ = policy
    parts = model_parts(model)
    tokens = mx.array([[1, 4, 6, 24, 21, 7]])
    assert parts.split
    assert mx.array_equal(parts.head(parts.trunk(tokens)), model(tokens))


def test_chunked_prefill_with_the_portable_rope(policy):
    """The CUDA path (PortableRoPE with per-row offsets), chunked: still each row's own logits."""
    from artmlx.model.rope import use_portable_rope

    model, _ = tiny_policy(perturb=0.02)
    rng = np.random.default_rng(3)
    prompts = _chunks(rng, (9, 2, 14))
    expected = np.stack([np.array(model(mx.array([p]))[0, -1]) for p in prompts])
    assert use_portable_rope(model) == len(model.layers)
    engine = Engine(model, MemoryPlan(budget=0, shape=ModelShape.of(model)))
    logits = engine.prefill(engine.new_cache(len(prompts)), prompts)
    np.testing.assert_allclose(np.array(logits), expected, atol=2e-4, rtol=1e-4)


def _decode_logits(model, cache, sequence, steps, array_masks):
    """Prefill `sequence` in one row and feed `steps` more tokens, with or without the dense shortcut."""
    from artmlx.engine import cache as cache_module

    original = cache_module.LayerKV.make_mask
    if array_masks:
        cache_module.LayerKV.make_mask = lambda self, N, return_array=False, **kw: original(self, N, True, **kw)
    try:
        out = [Engine(model).prefill(cache, [sequence])]
        for token in steps:
            h = cache.forward(lambda x, c: model(x, cache=c), mx.array([[token]]), np.ones((1,), np.int32))
            out.append(h[:, -1])
        return np.array(mx.concatenate(out))
    finally:
        cache_module.LayerKV.make_mask = original


def test_a_dense_cache_gives_attention_no_mask_array_and_the_same_logits(policy):
    """One sequence (no holes): attention gets None / "causal", as from mlx-lm's KVCache, with the
    logits of the array-masked path exactly; holes (ragged rows, a join) bring the array mask back."""
    from artmlx.engine.cache_rows import join_caches

    model, _ = policy
    rng = np.random.default_rng(3)
    sequence, steps = _chunks(rng, (11,))[0], [7, 42, 9]
    dense = make_ragged_cache(model, 1)
    fast = _decode_logits(model, dense, sequence, steps, array_masks=False)
    assert dense.state.dense and dense.layers[0].make_mask(1) is None and dense.layers[0].make_mask(4) == "causal"
    exact = _decode_logits(model, make_ragged_cache(model, 1), sequence, steps, array_masks=True)
    assert np.array_equal(fast, exact)

    ragged = make_ragged_cache(model, 2)
    Engine(model).prefill(ragged, _chunks(rng, (3, 5)))
    assert not ragged.state.dense and isinstance(ragged.layers[0].make_mask(1), mx.array)
    other = make_ragged_cache(model, 1)
    Engine(model).prefill(other, _chunks(rng, (4,)))
    assert other.state.dense
    assert not join_caches(dense, other).state.dense  # the shorter row is padded with holes
