"""Real rollouts and real adapters through the codec."""

import mlx.core as mx
import numpy as np

from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.config import TrainConfig, load_config
from artmlx.envs import make_env
from artmlx.model.policy import adapter_weights, set_adapter_weights
from artmlx.protocol.codec import decode, encode, to_mlx
from artmlx.protocol.convert import group_to_message, message_to_group
from artmlx.protocol.messages import AdapterUpdate, Welcome
from tests.helpers import tiny_policy


def test_rollout_groups_survive_the_wire():
    model, tokenizer = tiny_policy(perturb=0.02)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    for group in engine.play([3, 4], 4, mx.random.key(0), policy_version=2):
        group.group_id = f"g{group.seed}"
        back = message_to_group(decode(encode(group_to_message(group, "actor-1", "tictactoe", "fp"))))
        assert (back.seed, back.policy_version, back.group_id) == (group.seed, 2, group.group_id)
        for a, b in zip(group.episodes, back.episodes):
            assert a.tokens == b.tokens and a.policy_mask == b.policy_mask
            np.testing.assert_array_equal(np.float32(a.logprobs), np.float32(b.logprobs))
            assert a.reward == b.reward and a.info["outcome"] == b.info["outcome"] and a.turns == b.turns


def test_adapters_travel_and_apply_in_place():
    sender, _ = tiny_policy(perturb=0.05, seed=1)
    receiver, _ = tiny_policy(seed=2)
    tokens = mx.array([[1, 4, 6, 24, 21, 7, 25, 21, 2]])
    assert not np.allclose(np.array(sender(tokens)), np.array(receiver(tokens)))
    update = decode(encode(AdapterUpdate(4, adapter_weights(sender))))
    set_adapter_weights(receiver, {name: to_mlx(array) for name, array in update.tensors.items()})
    np.testing.assert_array_equal(np.array(sender(tokens)), np.array(receiver(tokens)))


def test_the_whole_run_config_fits_in_a_welcome():
    import dataclasses

    config = dataclasses.asdict(load_config(None, {"env_args": {"opponent": "perfect"}, "lora_keys": ["a.b"]}))
    welcome = decode(encode(Welcome("s", config, "fp", 0, 4, 0)))
    assert TrainConfig(**welcome.run_config) == TrainConfig(**config)
