"""Per-layer gradient checkpointing: the same update as without it, in less memory."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.config import load_config
from artmlx.engine.memory import MemoryPlan, ModelShape
from artmlx.envs import make_env
from artmlx.learner.settings import trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from tests.helpers import tiny_policy


def _groups(model, tokenizer):
    groups = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"),
                             SamplingParams(temperature=1.0)).play([3, 4, 5], 4, mx.random.key(2))
    for group in groups:
        for index, episode in enumerate(group.episodes):
            episode.reward = float(index % 2) + 0.1 * index
    return groups


def _update(setting: str, **settings):
    """Adapters after one GRPO update from the same start, with `grad_checkpoint` = setting."""
    model, tokenizer = tiny_policy(perturb=0.02, seed=1)
    groups = _groups(model, tokenizer)
    trainer = GRPOTrainer(model, trainer_settings({"temperature": 1.0, "grad_checkpoint": setting, **settings}))
    metrics = trainer.train_step(groups)
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}, metrics


@pytest.mark.parametrize("settings", [{}, {"kl_coef": 0.1, "max_batch_tokens": 64}, {"compile_step": True}])
def test_a_checkpointed_update_equals_the_plain_one(settings):
    """Shared prompts (the prefix pass and the rows attending to it), several micro-batches, a KL term:
    the adapters after the update agree with the unchecked update's to float rounding."""
    plain, plain_metrics = _update("off", **settings)
    checked, metrics = _update("on", **settings)
    assert metrics["grad_checkpointed"] and not plain_metrics["grad_checkpointed"]
    assert metrics["grad_norm"] > 0
    np.testing.assert_allclose(metrics["grad_norm"], plain_metrics["grad_norm"], rtol=1e-5)
    for name in plain:
        np.testing.assert_allclose(checked[name], plain[name], rtol=1e-5, atol=1e-7)


def test_auto_checkpoints_only_when_one_episode_would_not_fit():
    """The 0.5B shape at 4,096 tokens: a budget that holds one checkpointed episode but not a plain one."""
    shape = ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, vocab=151936,
                       activation_bytes=2, weight_bytes=300 << 20)
    plain, checked = (shape.train_bytes_per_token(4096, 0.5, "gpu", c) for c in (False, True))
    assert checked < plain / 4
    workspace = int(checked * 4096 * 2.2)  # two checkpointed episodes, a fraction of one plain one
    plan = MemoryPlan(budget=shape.weight_bytes + int(workspace / 0.6), shape=shape, device="gpu")
    assert plan.needs_checkpointing(4096, 0.5)
    assert plan.train_tokens(4096, 0.5, checkpointed=True) >= 2 * 4096
    roomy = MemoryPlan(budget=200 << 30, shape=shape, device="gpu")
    assert not roomy.needs_checkpointing(4096, 0.5)
    with pytest.raises(ValueError, match="lora_dropout"):
        load_config(None, {"grad_checkpoint": "on", "lora_dropout": 0.1})
