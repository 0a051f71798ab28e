"""Sibling LoRA projections (q/k/v, gate/up) computed as one product while decoding: the same logits as each
projection run alone, a new adapter used at once, a copied module tree (`share_base`) never served the group's
adapter, and the base's 4-bit weights held once."""

import mlx.core as mx
import pytest
from mlx_lm.tuner.lora import LoRALinear

from artmlx.config import TrainConfig
from artmlx.model import lora_groups, lora_kernel
from artmlx.model.policy import LoraSpec, adapter_weights, load_policy, set_adapter_weights, share_base


def random_adapter(model, seed: int) -> dict:
    return {name: 0.05 * mx.random.normal(value.shape, key=mx.random.key(seed + i))
            for i, (name, value) in enumerate(sorted(adapter_weights(model).items()))}


@pytest.fixture()
def grouped():
    """The embedded model with a nonzero adapter; its sibling projections given the kernel's class and grouped
    (on this CPU the group multiplies its factors with MLX's products instead of the CUDA kernel)."""
    if lora_kernel.available():
        pytest.skip("on CUDA the fused kernel serves the members alone: test_groups_on_cuda")
    model, _, _ = load_policy("tiny", LoraSpec.from_config(TrainConfig()))
    set_adapter_weights(model, random_adapter(model, 0))
    for _, module in model.named_modules():
        for names in lora_groups.SIBLINGS:
            for name in names:
                if type(getattr(module, name, None)) is LoRALinear:
                    getattr(module, name).__class__ = lora_kernel.FusedLoRALinear
    return model


def forward(model, tokens, grouped: bool):
    if not grouped:  # outside the engine's inference(): every projection is mlx-lm's own
        return model(tokens)
    with lora_kernel.inference():
        return model(tokens)


def test_groups_compute_what_the_projections_compute_alone(grouped, monkeypatch):
    model = grouped
    tokens = mx.array([[3, 17, 42, 5], [9, 9, 1, 60]])
    weights_before = [mx.array(m.linear.weight) for _, m in model.named_modules()
                      if isinstance(m, lora_kernel.FusedLoRALinear)]
    alone = forward(model, tokens, grouped=False)
    assert lora_groups.group_siblings(model, use_kernel=False) == 2 * len(model.layers)
    computed = []
    original = lora_groups.LoRAGroup._compute
    monkeypatch.setattr(lora_groups.LoRAGroup, "_compute", lambda self, x: computed.append(self) or original(self, x))
    together = forward(model, tokens, grouped=True)
    assert len(computed) == 2 * len(model.layers)  # once per group: q/k/v and gate/up of every layer
    assert mx.allclose(alone, together, atol=1e-4).item()
    # the members' own weights are views of the group's one copy, with their values unchanged
    after = [m.linear.weight for _, m in model.named_modules() if isinstance(m, lora_kernel.FusedLoRALinear)]
    assert all(mx.array_equal(a, b).item() for a, b in zip(weights_before, after))

    # a new adapter (what the scheduler's load and the optimizer do: new arrays) is used by the next forward
    set_adapter_weights(model, random_adapter(model, 100))
    assert mx.allclose(forward(model, tokens, grouped=False), forward(model, tokens, grouped=True), atol=1e-4).item()
    assert not mx.allclose(alone, forward(model, tokens, grouped=True), atol=1e-2).item()


def test_a_copied_tree_with_its_own_adapter_is_not_served_the_groups(grouped):
    model = grouped
    lora_groups.group_siblings(model, use_kernel=False)
    twin = share_base(model)  # the colocated actor's tree: same base arrays, its own adapter
    set_adapter_weights(twin, random_adapter(twin, 7))
    tokens = mx.array([[4, 8, 15, 16, 23]])
    expected = forward(twin, tokens, grouped=False)
    assert mx.allclose(expected, forward(twin, tokens, grouped=True), atol=1e-4).item()
    assert mx.allclose(forward(model, tokens, grouped=False), forward(model, tokens, grouped=True), atol=1e-4).item()


def test_rows_past_the_kernels_are_grouped_and_a_dequantizing_prefill_runs_alone(grouped, monkeypatch):
    model = grouped
    lora_groups.group_siblings(model, use_kernel=False)
    tokens = mx.random.randint(0, 100, (2, lora_kernel.FUSED_ROWS), key=mx.random.key(5))  # 64 rows: no kernel
    alone = forward(model, tokens, grouped=False)
    assert mx.allclose(alone, forward(model, tokens, grouped=True), atol=1e-4).item()
    for _, module in model.named_modules():  # as `use_dequantizing_layers` marks large 4-bit layers
        if isinstance(module, lora_kernel.FusedLoRALinear):
            module.linear.dequant_rows = 64
    calls = []
    monkeypatch.setattr(lora_groups.LoRAGroup, "_compute", lambda self, x: calls.append(x) or None)
    assert mx.allclose(alone, forward(model, tokens, grouped=True), atol=1e-4).item() and not calls


@pytest.mark.skipif(not lora_kernel.available(), reason="the fused kernel runs on MLX's CUDA backend only")
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_groups_on_cuda(dtype, monkeypatch):
    """On CUDA: grouped with the fused kernel (the block-diagonal factor at the summed rank) up to its rows."""
    model, _, _ = load_policy("tiny", LoraSpec.from_config(TrainConfig()))
    model.set_dtype(dtype)  # before grouping: a cast replaces the arrays a group is built from
    set_adapter_weights(model, {k: v.astype(dtype) for k, v in random_adapter(model, 3).items()})
    assert lora_groups.group_siblings(model) == 2 * len(model.layers)
    computed = []
    original = lora_groups.LoRAGroup._compute
    monkeypatch.setattr(lora_groups.LoRAGroup, "_compute", lambda self, x: computed.append(self) or original(self, x))
    for rows in (1, 8, 32, 64):  # 64: past the kernel, the factors multiplied for the group
        tokens = mx.random.randint(0, 100, (rows, 1), key=mx.random.key(rows))
        alone, together = forward(model, tokens, grouped=False), forward(model, tokens, grouped=True)
        alone, together = alone.astype(mx.float32), together.astype(mx.float32)
        # rounding in different orders: on the H200 float32 differed by 1.5e-3 of the scale at 8 rows (TF32 products?)
        scale = mx.abs(alone).max().item()
        tolerance = scale * (2 ** -8 if dtype == mx.float32 else 2 ** -5)
        assert mx.abs(alone - together).max().item() < tolerance, rows
    assert len(computed) == 4 * 2 * len(model.layers)
