"""Hinted groups from the tiny model and trainer settings, shared by the directive-hint tests."""

import mlx.core as mx

from artmlx.config import load_config
from artmlx.envs import make_env
from artmlx.learner.settings import TrainerSettings
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from tests.helpers import tiny_policy


def hinted_groups(seeds=(3, 4), group_size=4, env_args=None):
    model, tokenizer = tiny_policy()
    args = {"hints": True, **(env_args or {})}
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("math", args), SamplingParams(max_reply_tokens=6))
    return model, engine, engine.play(list(seeds), group_size, mx.random.key(0))


def settings(**overrides):
    return TrainerSettings.of(load_config(None, {"learning_rate": 1e-3, "max_grad_norm": 0.0, **overrides}))
