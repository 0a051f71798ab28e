"""The chunked Gated DeltaNet recurrences (`model/recurrence.py`): the same outputs as mlx-lm's loop and as
the delta rule written from the paper, the same gradients, far less memory, and installed at load."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import gated_delta as mlx_lm_gated_delta

from artmlx.model import recurrence
from artmlx.model.recurrence import chunked_recurrence, parallel_recurrence


def inputs(batch=2, steps=150, key_heads=2, value_heads=4, key_dim=16, value_dim=8, vector_gate=False, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((batch, steps, key_heads, key_dim))
    k = mx.random.normal((batch, steps, key_heads, key_dim))
    # unit keys, as the models' normalize_qk gives them (the delta rule's write is then a projection)
    q, k = q / mx.linalg.norm(q, axis=-1, keepdims=True) / 4, k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((batch, steps, value_heads, value_dim))
    gate_shape = (batch, steps, value_heads) + ((key_dim,) if vector_gate else ())
    g = mx.sigmoid(mx.random.normal(gate_shape) + 2)
    beta = mx.sigmoid(mx.random.normal((batch, steps, value_heads)))
    state = mx.random.normal((batch, value_heads, value_dim, key_dim)) * 0.1
    return q, k, v, g, beta, state


def delta_rule(q, k, v, g, beta, state, mask=None):
    """Gated delta rule (Yang, Kautz, Hatamizadeh 2024, eq. 10), float64: per head,
    S_t = S_{t-1} a_t (I - b_t k_t k_t^T) + b_t v_t k_t^T and o_t = S_t q_t; a padded step keeps S."""
    q, k, v, g, beta, state = (np.array(a, np.float64) for a in (q, k, v, g, beta, state))
    batch, steps, key_heads, _ = q.shape
    repeat = v.shape[2] // key_heads
    q, k = np.repeat(q, repeat, axis=2), np.repeat(k, repeat, axis=2)
    out = np.zeros(v.shape)
    S = state.copy()
    for b in range(batch):
        for t in range(steps):
            for h in range(v.shape[2]):
                new, out[b, t, h] = _step(S[b, h], q[b, t, h], k[b, t, h], v[b, t, h], g[b, t, h], beta[b, t, h])
                if mask is None or mask[b, t]:  # a padded step still reads out, but keeps the state
                    S[b, h] = new
    return out, S


def _step(S, q, k, v, a, b):
    decay = a if np.ndim(a) else a * np.ones_like(k)  # scalar gate, or one per key dimension
    decayed = S * decay[None, :]
    new = decayed - b * np.outer(decayed @ k, k) + b * np.outer(v, k)
    return new, new @ q


@pytest.mark.parametrize("vector_gate", [False, True])
def test_outputs_are_mlx_lm_loop_bit_for_bit_and_the_paper_rule(vector_gate):
    q, k, v, g, beta, state = inputs(vector_gate=vector_gate)
    mask = mx.array(np.random.default_rng(1).random((2, 150)) > 0.2)
    for m in (None, mask):
        ours = chunked_recurrence(q, k, v, g, beta, state, m, chunk=16)
        theirs = mlx_lm_gated_delta.gated_delta_ops(q, k, v, g, beta, state, m)
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape and mx.array_equal(a, b)
        y, S = delta_rule(q, k, v, g, beta, state, None if m is None else np.array(m))
        np.testing.assert_allclose(np.array(ours[0]), y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.array(ours[1]), S, rtol=1e-4, atol=1e-5)


def gradients(fn, mask, weights, compiled=False):
    """Gradients of sum(y * weights) + |final state|^2 through `fn` (a recurrence) w.r.t. all six inputs of
    `inputs()`; `compiled`: through `mx.compile`, as the learner's `compile_step` runs the step."""
    q, k, v, g, beta, state = inputs()

    def f(q, k, v, g, beta, state):
        y, final = fn(q, k, v, g, beta, state, mask)
        return (y * weights).sum() + (final ** 2).sum()

    run = lambda: mx.grad(f, argnums=(0, 1, 2, 3, 4, 5))(q, k, v, g, beta, state)  # noqa: E731
    return (mx.compile(run) if compiled else run)()


@pytest.mark.parametrize("compiled", [False, True])
def test_gradients_equal_those_through_mlx_lm_loop(compiled):
    mask = mx.array(np.random.default_rng(2).random((2, 150)) > 0.2)
    weights = mx.random.normal((2, 150, 4, 8))
    ours = gradients(lambda *a: chunked_recurrence(*a, chunk=16), mask, weights, compiled)
    theirs = gradients(mlx_lm_gated_delta.gated_delta_ops, mask, weights)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk,gates,steps,key_heads", [(16, "mild", 150, 2), (64, "mild", 150, 2),
                                                       (64, "strong", 150, 2), (64, "mild", 5, 4)])
def test_closed_form_equals_mlx_lm_loop_and_the_paper_rule(chunk, gates, steps, key_heads):
    """Also with strong gates (a tenth of them 0 or 1e-12, where a difference of cumulative log decays would
    lose the small ones), a sequence shorter than a chunk, and as many key heads as value heads."""
    q, k, v, g, beta, state = inputs(steps=steps, key_heads=key_heads)
    if gates == "strong":
        strong = np.random.default_rng(3).random(g.shape)
        g = mx.array(np.where(strong < 0.05, 0.0, np.where(strong < 0.1, 1e-12, np.array(g))).astype(np.float32))
    mask = np.random.default_rng(1).random((2, steps)) > 0.2
    for m in (None, mask):
        y, S = parallel_recurrence(q, k, v, g, beta, state, None if m is None else mx.array(m), chunk=chunk)
        y_ref, S_ref = delta_rule(q, k, v, g, beta, state, m)
        real = slice(None) if m is None else m  # a padded step's output is read by nothing
        np.testing.assert_allclose(np.array(y)[real], y_ref[real], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.array(S), S_ref, rtol=1e-4, atol=1e-6)
        theirs = mlx_lm_gated_delta.gated_delta_ops(q, k, v, g, beta, state, None if m is None else mx.array(m))
        np.testing.assert_allclose(np.array(y)[real], np.array(theirs[0])[real], rtol=1e-4, atol=1e-6)
        assert y.shape == theirs[0].shape


def test_closed_form_keeps_the_models_dtype_and_a_float32_state():
    q, k, v, g, beta, state = inputs()
    y, S = parallel_recurrence(*(a.astype(mx.bfloat16) for a in (q, k, v)), g, beta, state)
    y_ref, _ = mlx_lm_gated_delta.gated_delta_ops(*(a.astype(mx.bfloat16) for a in (q, k, v)), g, beta, state)
    assert (y.dtype, S.dtype) == (y_ref.dtype, mx.float32) == (mx.bfloat16, mx.float32)
    np.testing.assert_allclose(np.array(y.astype(mx.float32)), np.array(y_ref.astype(mx.float32)), atol=2e-2)


@pytest.mark.parametrize("compiled", [False, True])
def test_closed_form_gradients_equal_those_through_mlx_lm_loop(compiled):
    mask = mx.array(np.random.default_rng(2).random((2, 150)) > 0.2)
    weights = mx.random.normal((2, 150, 4, 8)) * mask[..., None, None]  # only real steps' outputs count
    ours = gradients(lambda *a: parallel_recurrence(*a, chunk=32), mask, weights, compiled)
    theirs = gradients(mlx_lm_gated_delta.gated_delta_ops, mask, weights)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-5)


def test_training_takes_the_closed_form_for_head_gates_and_the_chunked_loop_for_key_gates():
    q, k, v, g, beta, state = inputs()
    a, b = mx.random.normal(g.shape), mx.random.normal(g.shape)
    A_log, dt_bias = mx.zeros((4,)), mx.zeros((4,))
    trained = recurrence.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, use_kernel=False)
    g_ = mlx_lm_gated_delta.compute_g(A_log, a, dt_bias)
    closed = parallel_recurrence(q, k, v, g_, mx.sigmoid(b), state)
    assert all(mx.array_equal(x, y) for x, y in zip(trained, closed))
    inferred = recurrence.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, use_kernel=True)
    exact = mlx_lm_gated_delta.gated_delta_ops(q, k, v, g_, mx.sigmoid(b), state)
    assert all(mx.array_equal(x, y) for x, y in zip(inferred, exact))  # off Metal: mlx-lm's steps, chunked
    # one gate per key dimension (mlx-lm's vectorised gating): the chunked steps in training, bit for bit
    key_gates = mx.sigmoid(mx.random.normal(g.shape + (16,)) + 2)
    trained = recurrence.gated_delta_update(q, k, v, mx.log(key_gates), b, mx.zeros((4, 16)), mx.zeros((4, 16)),
                                            state, use_kernel=False, lower_bound=None)
    g_keys = mlx_lm_gated_delta.compute_g(mx.zeros((4, 16)), mx.log(key_gates), mx.zeros((4, 16)))
    exact = mlx_lm_gated_delta.gated_delta_ops(q, k, v, g_keys, mx.sigmoid(b), state)
    assert g_keys.ndim == 4 and all(mx.array_equal(x, y) for x, y in zip(trained, exact))


def test_backward_memory_does_not_hold_a_state_per_step():
    q, k, v, g, beta, state = inputs(batch=1, steps=512, key_heads=4, value_heads=4, key_dim=64, value_dim=64)
    mx.eval(q, k, v, g, beta, state)

    def peak(fn):
        def f(q, k, v, g, beta):
            return (fn(q, k, v, g, beta, state)[0] ** 2).sum()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        mx.eval(mx.grad(f, argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta))
        return mx.get_peak_memory() - before

    state_bytes = 4 * 64 * 64 * 4
    ops = peak(mlx_lm_gated_delta.gated_delta_ops)
    assert ops > 2 * 512 * state_bytes  # mlx-lm's loop: several states a step
    assert peak(chunked_recurrence) < ops / 4
    assert peak(parallel_recurrence) < ops / 4


def test_installed_at_load_and_training_gradients_unchanged(folders):
    import mlx.nn as nn
    from mlx_lm.models import qwen3_5

    from artmlx.model.policy import LoraSpec, load_policy

    model, _, _ = load_policy(str(folders["qwen3_5"]), LoraSpec(rank=4))
    assert qwen3_5.gated_delta_update is recurrence.gated_delta_update
    tokens = mx.array(np.random.default_rng(0).integers(0, 100, (2, 150)))
    model.train()

    def grads():
        def loss(params):
            model.update(params)
            return nn.losses.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).mean()
        return mx.grad(loss)(model.trainable_parameters())

    ours = grads()
    qwen3_5.gated_delta_update = recurrence._ORIGINAL
    try:
        theirs = grads()
    finally:
        recurrence.install(model)
    from mlx.utils import tree_flatten
    for (name, a), (_, b) in zip(tree_flatten(ours), tree_flatten(theirs)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_memory_plan_covers_a_hybrid_training_step(tmp_path):
    """A Gated DeltaNet layer of real width (16 value heads, 128 x 128 states) in a tiny Qwen3-Next: one
    training step's peak per token stays within the plan's estimate; through mlx-lm's own loop it would be
    several times over it (what ran an H200 out of memory)."""
    import mlx.nn as nn
    from mlx_lm.models import qwen3_next

    from artmlx.engine.memory import ModelShape
    from artmlx.model.policy import LoraSpec, load_policy
    from tests.helpers import family_folder

    folder = family_folder(tmp_path, "qwen3_next", "wide", linear_num_value_heads=16, linear_num_key_heads=16,
                           linear_key_head_dim=128, linear_value_head_dim=128)
    model, _, _ = load_policy(str(folder), LoraSpec(rank=4))
    rows, length = 2, 320
    ids = mx.array(np.random.default_rng(0).integers(0, 100, (rows, length + 1)))
    model.train()

    def peak_per_token():
        def loss(params):
            model.update(params)
            return nn.losses.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).mean()
        mx.eval(mx.value_and_grad(loss)(model.trainable_parameters()))  # warm-up
        mx.synchronize()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        mx.eval(mx.value_and_grad(loss)(model.trainable_parameters()))
        return (mx.get_peak_memory() - before) / (rows * length)

    planned = ModelShape.of(model).train_bytes_per_token(length, device="cpu")
    assert peak_per_token() <= planned
    qwen3_next.gated_delta_update = recurrence._ORIGINAL
    try:
        assert peak_per_token() > 3 * planned
    finally:
        recurrence.install(model)
    assert qwen3_next.gated_delta_update is recurrence.gated_delta_update
