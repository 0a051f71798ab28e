"""Memory budgets: the sizing rules, and MLX's own peak-memory counter against them on a real vocabulary."""

import os

import mlx.core as mx
import numpy as np
import pytest

from artmlx.engine.generate import Engine
from artmlx.engine.memory import DEVICE_ROWS, GB, MemoryPlan, ModelShape, apply_limits, plan_for, resolve_budget
from artmlx.envs import make_env
from artmlx.learner.settings import trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.model.policy import LoraSpec, load_policy
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from tests.helpers import per_call_dequantizing

QWEN_05B = ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, vocab=151936,
                      activation_bytes=2, weight_bytes=int(0.4 * GB))


def test_kv_cache_rule_for_the_qwen_half_billion_shape():
    assert QWEN_05B.kv_bytes_per_token == 24 * 2 * 2 * 64 * 2  # 12 KB
    plan = MemoryPlan(budget=32 * GB, shape=QWEN_05B, device="gpu")
    assert plan.rows_per_batch(1024) == DEVICE_ROWS["gpu"]  # 12 MB a row: the device cap binds first
    small = MemoryPlan(budget=int(1.2 * GB), shape=QWEN_05B, device="gpu")
    rows = small.rows_per_batch(1024)
    assert 1 <= rows < DEVICE_ROWS["gpu"]
    assert rows * (QWEN_05B.kv_bytes_per_token * 1024 + 40 * QWEN_05B.vocab) <= 0.6 * (small.budget - QWEN_05B.weight_bytes)
    assert MemoryPlan(budget=0, shape=QWEN_05B).rows_per_batch(1024) == 1  # never zero rows
    # Chunks and micro-batches shrink as contexts grow; both stay within the workspace share.
    assert plan.prefill_tokens(256) >= plan.prefill_tokens(4096) >= 16
    assert plan.train_tokens(256, 0.5) > plan.train_tokens(1024, 0.5) > 1024


def test_an_agent_server_holds_its_requests_and_a_finished_turn_of_each_inside_the_budget():
    """Agent rollouts: concurrent requests and the prefix cache (one finished turn per request, what the next
    turn extends) both come out of the budget's KV share; with room to spare, every wanted request runs."""
    slots = 1024
    kept = QWEN_05B.kv_bytes_per_token * slots
    rows, prefix = MemoryPlan(budget=32 * GB, shape=QWEN_05B, device="gpu").agent_sizes(slots, wanted=128)
    assert rows == 128 and prefix == 128 * kept
    small = MemoryPlan(budget=int(1.2 * GB), shape=QWEN_05B, device="gpu")
    rows, prefix = small.agent_sizes(slots, wanted=128)
    assert 1 <= rows < 128 and prefix == rows * kept
    assert rows * (2 * kept + 40 * QWEN_05B.vocab) <= 0.6 * small.free
    assert MemoryPlan(budget=0, shape=QWEN_05B).agent_sizes(slots, wanted=8)[0] == 1  # never zero requests


def test_training_micro_batches_leave_room_for_dequantized_copies():
    """The dense copies that 4-bit layers keep for the backward pass come off the budget before tokens do."""
    from dataclasses import replace
    plan = MemoryPlan(budget=32 * GB, shape=QWEN_05B, device="gpu")
    with_copies = MemoryPlan(budget=32 * GB, shape=replace(QWEN_05B, dense_copy_bytes=16 * GB), device="gpu")
    assert plan.train_tokens(865, 0.6) > with_copies.train_tokens(865, 0.6) > 865
    per_token = QWEN_05B.train_bytes_per_token(865, 0.6, "gpu")
    assert with_copies.train_tokens(865, 0.6) * per_token <= 0.6 * (32 * GB - QWEN_05B.weight_bytes - 16 * GB)
    # Nothing left for activations still trains one sequence at a time rather than none.
    assert MemoryPlan(budget=GB, shape=replace(QWEN_05B, dense_copy_bytes=4 * GB), device="gpu").train_tokens(865) == 865


def test_a_loaded_model_counts_the_copies_of_its_dequantizing_layers(synth_policy):
    model, _ = synth_policy
    shape = plan_for(model, GB).shape
    dequantizing = [m for _, m in model.named_modules() if getattr(m, "dequant_rows", 0)]
    assert dequantizing  # on the CPU the large 4-bit layers dequantize (model/backend.py)
    assert shape.dense_copy_bytes == sum(m["weight"].shape[0] * m["weight"].shape[1] * 32 // m.bits * 4
                                         for m in dequantizing)  # float32 on the CPU


def test_training_processes_choose_mlx_attention_unless_the_user_chose(monkeypatch):
    from artmlx.model.backend import prefer_mlx_attention
    monkeypatch.delenv("MLX_CUDA_USE_CUDNN_SDPA", raising=False)
    prefer_mlx_attention()
    assert os.environ["MLX_CUDA_USE_CUDNN_SDPA"] == "0"
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "1")
    prefer_mlx_attention()
    assert os.environ["MLX_CUDA_USE_CUDNN_SDPA"] == "1"


def test_budget_resolution_and_limits(monkeypatch):
    monkeypatch.setenv("ARTMLX_MEMORY_SHARING", "1")
    alone = resolve_budget(0)
    monkeypatch.setenv("ARTMLX_MEMORY_SHARING", "4")
    assert abs(resolve_budget(0) - alone / 4) <= 1
    assert resolve_budget(2.5) == int(2.5 * GB)
    before = mx.get_memory_limit()
    try:
        apply_limits(3 * GB)
        assert mx.get_memory_limit() == 3 * GB
    finally:
        mx.set_memory_limit(before)


@pytest.fixture(scope="module")
def synth_policy(small_synth):
    mx.random.seed(0)
    with per_call_dequantizing():
        model, tokenizer, _ = load_policy(str(small_synth), LoraSpec(rank=8))
    return model, tokenizer


def test_a_small_base_is_dequantized_once_on_the_cpu_and_computes_the_same(small_synth):
    """Below the dense-base limit the large 4-bit layers become dense ones at load: no per-call dequantize, the
    same logits (the per-call path multiplies the same dequantized weights from 8 rows on)."""
    tokens = mx.array([[5, 900, 17, 40000, 3, 77, 1200, 8]] * 8)
    with per_call_dequantizing():
        per_call, _, _ = load_policy(str(small_synth), LoraSpec(rank=8))
    dense, _, _ = load_policy(str(small_synth), LoraSpec(rank=8))
    kinds = {type(m).__name__ for _, m in dense.named_modules()}
    assert "DequantizingLinear" not in kinds and "DequantizingEmbedding" not in kinds
    assert not any(getattr(m, "dequant_rows", 0) for _, m in dense.named_modules())
    assert plan_for(dense, GB).shape.dense_copy_bytes == 0
    assert mx.allclose(dense(tokens), per_call(tokens), atol=1e-5).item()


def test_decode_memory_does_not_grow_with_steps(synth_policy):
    """Each step's (rows x vocabulary) distribution is freed once its token is drawn."""
    model, _ = synth_policy
    engine = Engine(model)
    rows, vocab_bytes = 8, 8 * model.args.vocab_size * 4
    peaks = []
    for steps in (4, 20):
        cache = engine.new_cache(rows)
        logits = engine.prefill(cache, [[100 + r] * 12 for r in range(rows)])
        mx.eval(logits)
        mx.reset_peak_memory()
        engine.decode(cache, logits, mx.random.key(0), temperature=1.0, max_tokens=steps, stop_tokens={151645})
        peaks.append(mx.get_peak_memory())
    assert peaks[1] < peaks[0] + 4 * vocab_bytes  # 16 more steps, not 16 more distributions


def test_rollouts_and_updates_stay_within_a_small_budget(synth_policy):
    """A 0.25 GB budget on a 151,936-token vocabulary: batches, chunks and micro-batches sized to fit it."""
    model, tokenizer = synth_policy
    budget = GB // 4
    plan = plan_for(model, budget)
    sampling = SamplingParams(temperature=1.0, max_reply_tokens=8, max_turns=2, max_episode_tokens=400)
    rollouts = EpisodeRollouts(model, tokenizer, lambda: make_env("synthetic", {"prompt_tokens": 48, "turns": 2}),
                               sampling, plan)
    assert 8 <= rollouts.max_rows < DEVICE_ROWS["cpu"]
    mx.clear_cache()
    mx.reset_peak_memory()
    groups = rollouts.play(list(range(rollouts.groups_per_batch(8) + 1)), 8, mx.random.key(0))  # two batches
    assert mx.get_peak_memory() <= budget
    assert all(len(e.tokens) > 80 and e.turns == 2 for g in groups for e in g.episodes)
    # Training needs the n x V float32 logits of its policy tokens (2.4 MB each here): give it 0.5 GB.
    budget, groups = GB // 2, groups[:1]
    trainer = GRPOTrainer(model, trainer_settings({"groups_per_step": len(groups)}), plan_for(model, budget))
    assert len(trainer.microbatches(*_flat(groups))) > 1  # the budget forces several micro-batches
    mx.clear_cache()
    mx.reset_peak_memory()
    metrics = trainer.train_step(groups)
    assert metrics["episodes_trained"] > 0 and np.isfinite(metrics["loss"])
    assert mx.get_peak_memory() <= budget


def _flat(groups):
    episodes = [e for g in groups for e in g.episodes]
    members = [list(range(i * len(g.episodes), (i + 1) * len(g.episodes))) for i, g in enumerate(groups)]
    return episodes, np.zeros(len(episodes), np.float32), members


def test_no_micro_batch_makes_a_logits_array_past_two_to_the_31():
    """A huge budget does not make the head's (policy tokens x vocabulary) array unaddressable with int32."""
    plan = MemoryPlan(budget=1000 * GB, shape=QWEN_05B, device="gpu")
    for fraction in (1.0, 0.3):
        assert plan.train_tokens(512, fraction) * fraction * QWEN_05B.vocab < 2**31
