"""The fused LoRA decode kernel against mlx-lm's LoRALinear: on MLX's CUDA backend only (where it runs),
plus the context rule that keeps it out of every differentiated forward, on any backend."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.tuner.lora import LoRALinear

from artmlx.model import lora_kernel
from artmlx.model.lora_kernel import FusedLoRALinear, inference, lora_product

cuda = pytest.mark.skipif(not lora_kernel.available(), reason="the kernel runs on MLX's CUDA backend only")


def _layer(in_dims: int, out_dims: int, rank: int, seed: int) -> LoRALinear:
    mx.random.seed(seed)
    base = nn.QuantizedLinear(in_dims, out_dims, bias=False)
    base.set_dtype(mx.bfloat16)
    layer = LoRALinear.from_base(base, r=rank, scale=20.0)
    layer.lora_b = mx.random.normal(layer.lora_b.shape) * 0.02  # mlx-lm starts B at zero: make the term count
    layer.eval()
    return layer


@cuda
@pytest.mark.parametrize("rows,in_dims,out_dims,rank", [(1, 896, 896, 16), (7, 896, 128, 8), (32, 896, 4864, 16),
                                                         (32, 4864, 896, 64), (3, 1536, 256, 1)])
def test_kernel_equals_mlx_lm_lora_up_to_bfloat16_rounding(rows, in_dims, out_dims, rank):
    layer = _layer(in_dims, out_dims, rank, seed=rows + rank)
    x = mx.random.normal((rows, 1, in_dims)).astype(mx.bfloat16)
    expected = np.array(layer(x).astype(mx.float32))
    y = layer.linear(x)
    fused = lora_product(x, y, layer.lora_a, layer.lora_b, layer.scale)
    assert fused.shape == (rows, 1, out_dims) and fused.dtype == mx.bfloat16
    got = np.array(fused.astype(mx.float32))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=scale * 2 ** -7, rtol=2 ** -7)
    base_only = np.array(y.astype(mx.float32))
    assert np.abs(expected - base_only).max() > 10 * scale * 2 ** -8  # the LoRA term is not lost in the noise


@cuda
def test_fused_layer_uses_the_kernel_only_inside_inference():
    layer = _layer(896, 896, 16, seed=3)
    layer.__class__ = FusedLoRALinear
    x = mx.random.normal((4, 1, 896)).astype(mx.bfloat16)
    outside = layer(x)
    with inference():
        inside = layer(x)
    np.testing.assert_allclose(np.array(inside.astype(mx.float32)), np.array(outside.astype(mx.float32)),
                               atol=float(mx.abs(outside).max()) * 2 ** -7)
    # a gradient through the layer outside `inference()` works (mlx-lm's products); inside it could not
    grad = mx.grad(lambda b: (layer.linear(x) + 20.0 * ((x @ layer.lora_a) @ b)).astype(mx.float32).sum())(layer.lora_b)
    assert bool(mx.isfinite(grad).all())


def test_inference_context_nests_and_resets():
    assert not getattr(lora_kernel._local, "on", False)
    with inference():
        assert lora_kernel._local.on
        with inference():
            assert lora_kernel._local.on
        assert lora_kernel._local.on
    assert not lora_kernel._local.on


def test_fused_layer_outside_inference_is_mlx_lm_lora_exactly():
    """On any backend: outside the engine's forward a FusedLoRALinear computes what LoRALinear computes
    (and a value_and_grad through it is mlx-lm's)."""
    layer = _layer(128, 64, 4, seed=1)
    layer.set_dtype(mx.float32)
    x = mx.random.normal((5, 128))
    expected = layer(x)
    layer.__class__ = FusedLoRALinear
    np.testing.assert_array_equal(np.array(layer(x)), np.array(expected))
    loss = lambda model: model(x).sum()  # noqa: E731
    _, grads = nn.value_and_grad(layer, loss)(layer)
    assert grads["lora_b"].shape == layer.lora_b.shape


def test_use_fused_lora_swaps_plain_lora_layers_only():
    model = nn.Sequential(_layer(128, 64, 4, seed=2), nn.Linear(64, 64))
    assert lora_kernel.use_fused_lora(model) == 1
    assert type(model.layers[0]) is FusedLoRALinear and type(model.layers[1]) is nn.Linear
