"""PortableRoPE (used on CUDA, where mx.fast.rope fails for wide decode batches) against mx.fast.rope."""

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from artmlx.model.policy import load_base
from artmlx.model.rope import PortableRoPE, use_portable_rope


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims,head_dim", [(16, 16), (8, 16)])
@pytest.mark.parametrize("offset", [0, 7, "per-row"])
def test_matches_the_fused_kernel(traditional, dims, head_dim, offset):
    x = mx.random.normal((5, 3, 4, head_dim), key=mx.random.key(0))
    if offset == "per-row":
        offset = mx.array([0, 3, 11, 2, 40], dtype=mx.int32)
    reference = nn.RoPE(dims, traditional=traditional, base=10000.0, scale=0.5)(x, offset=offset)
    portable = PortableRoPE(dims, traditional=traditional, base=10000.0, scale=0.5)(x, offset=offset)
    np.testing.assert_allclose(np.array(portable), np.array(reference), atol=2e-5)


def test_swapped_model_gives_the_same_logits():
    model, _ = load_base("tiny")
    tokens = mx.array([[5, 9, 11, 20, 3, 7]] * 3)
    before = model(tokens)
    assert use_portable_rope(model) == len(model.layers)
    assert not any(type(m) is nn.RoPE for _, m in model.named_modules())
    np.testing.assert_allclose(np.array(model(tokens)), np.array(before), atol=1e-4)


@pytest.mark.parametrize("offset", [5, "per-row"])
def test_llama3_frequencies_match_the_fused_kernel(offset):
    from mlx_lm.models.rope_utils import Llama3RoPE

    scaling = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}
    llama = Llama3RoPE(32, max_position_embeddings=131072, base=500000.0, scaling_config=scaling)
    x = mx.random.normal((4, 2, 3, 32), key=mx.random.key(1))
    if offset == "per-row":
        offset = mx.array([0, 9000, 3, 70000], dtype=mx.int32)
    portable = PortableRoPE(32, freqs=llama._freqs)
    np.testing.assert_allclose(np.array(portable(x, offset=offset)), np.array(llama(x, offset=offset)), atol=1e-4)


def test_narrow_inputs_take_the_fused_kernel_and_wide_ones_the_portable_rotation():
    """CUDA keeps mx.fast.rope below `fused_below_rows` rows (host launch cost) and the plain ops above."""
    offset = mx.array([3, 40, 7, 0], dtype=mx.int32)
    x = mx.random.normal((4, 2, 1, 32), key=mx.random.key(2))
    fused = mx.fast.rope(x, 32, traditional=False, base=10000.0, scale=1.0, offset=offset)
    narrow = PortableRoPE(32, fused_below_rows=5)(x, offset=offset)
    wide = PortableRoPE(32, fused_below_rows=4)(x, offset=offset)
    assert np.array_equal(np.array(narrow), np.array(fused))
    np.testing.assert_allclose(np.array(wide), np.array(fused), atol=1e-5)


@pytest.mark.parametrize("offset", [9, "per-row"])
def test_wide_decode_rows_in_fused_pieces_equal_the_fused_kernel_whole(monkeypatch, offset):
    """The A/B switch ARTMLX_ROPE_PIECES=1: rows at or past the limit take mx.fast.rope in pieces below it."""
    from artmlx.model import rope

    monkeypatch.setattr(rope, "PIECES", True)
    x = mx.random.normal((11, 1, 3, 32), key=mx.random.key(3)).transpose(0, 2, 1, 3)  # as mlx-lm's attention
    if offset == "per-row":
        offset = mx.array(np.arange(11, dtype=np.int32) * 13)
    whole = mx.fast.rope(x, 32, traditional=False, base=10000.0, scale=1.0, offset=offset)
    pieces = PortableRoPE(32, fused_below_rows=4)(x, offset=offset)  # pieces of 3, 3, 3 and 2 rows
    assert pieces.shape == x.shape
    assert np.array_equal(np.array(pieces), np.array(whole))
