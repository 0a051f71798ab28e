import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.config import load_config
from artmlx.envs import make_env
from artmlx.learner.settings import TrainerSettings, trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.model.policy import LoraSpec, save_adapters
from artmlx.model.tiny import tiny_model_path
from tests.helpers import tiny_policy


def test_gradients_reach_only_lora_parameters():
    model, tokenizer = tiny_policy(perturb=0.01)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    groups = engine.play(list(range(6)), 6, mx.random.key(0))
    config = load_config(None, {"learning_rate": 1e-3, "max_grad_norm": 0.0})
    trainer = GRPOTrainer(model, TrainerSettings.of(config))
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    metrics = trainer.train_step(groups)
    assert metrics["episodes_trained"] > 0, "all groups had equal rewards; pick other seeds"
    after = dict(tree_flatten(model.parameters()))
    changed = {k for k, v in after.items() if not np.array_equal(np.array(v), before[k])}
    trainable = {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert changed and changed <= trainable
    assert all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in trainable)
    assert any(k.endswith("lora_b") for k in changed)
    assert trainer.policy_version == 1 and metrics["grad_norm"] > 0
    # On-policy first update: the ratio is 1 up to float error.
    assert abs(metrics["ratio_mean"] - 1) < 1e-4 and metrics["clip_frac"] == 0.0


def test_zero_variance_groups_are_skipped_and_counted():
    model, tokenizer = tiny_policy()
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    groups = engine.play([1, 2], 4, mx.random.key(0))
    for group in groups:
        for episode in group.episodes:
            episode.reward = 0.5
    trainer = GRPOTrainer(model, trainer_settings())
    metrics = trainer.train_step(groups)
    assert metrics["groups_zero_variance"] == 2 and metrics["episodes_trained"] == 0
    assert trainer.policy_version == 0


def test_saved_adapters_load_in_mlx_lm(tmp_path):
    import mlx_lm

    model, _ = tiny_policy(rank=4, perturb=0.05)
    spec = LoraSpec(rank=4, scale=20.0)
    save_adapters(model, tmp_path / "adapters", spec, "tiny")
    loaded, _ = mlx_lm.load(str(tiny_model_path()), adapter_path=str(tmp_path / "adapters"))
    tokens = mx.array([[1, 4, 6, 24, 21, 7, 25, 21, 2, 6, 1, 5, 6]])
    np.testing.assert_allclose(np.array(loaded(tokens)), np.array(model(tokens)), atol=1e-5)

    generated = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "generate", "--model", str(tiny_model_path()), "--adapter-path",
         str(tmp_path / "adapters"), "--prompt", "1. 2. 3.", "--max-tokens", "4"],
        capture_output=True, text=True, timeout=300,
    )
    assert generated.returncode == 0, generated.stderr
    fused = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "fuse", "--model", str(tiny_model_path()), "--adapter-path",
         str(tmp_path / "adapters"), "--save-path", str(tmp_path / "fused"), "--dequantize"],
        capture_output=True, text=True, timeout=300,
    )
    assert fused.returncode == 0, fused.stderr
    fused_model, _ = mlx_lm.load(str(tmp_path / "fused"))
    np.testing.assert_allclose(np.array(fused_model(tokens)), np.array(model(tokens)), atol=1e-3)


@pytest.mark.slow
def test_resume_gives_the_same_next_step(tmp_path):
    """Also with a learning-rate schedule: it is a function of the update's number, so the resumed run's third
    update takes the straight run's rate."""
    from artmlx.apps.train import train

    common = {"steps": 3, "groups_per_step": 4, "group_size": 4, "eval_every": 0, "checkpoint_every": 2,
              "learning_rate": 1e-3, "seed": 3, "lr_schedule": "cosine", "warmup_steps": 1}
    straight = train(load_config(None, {**common, "out": str(tmp_path / "straight")}), echo=False)
    partial = train(load_config(None, {**common, "steps": 2, "out": str(tmp_path / "resumed")}), echo=False)
    resumed = train(load_config(None, {**common, "out": str(partial)}), resume=True, echo=False)
    a = mx.load(str(straight / "adapters" / "adapters.safetensors"))
    b = mx.load(str(resumed / "adapters" / "adapters.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.array(a[key]), np.array(b[key]))
    from artmlx.metrics import read_metrics

    steps = [r["step"] for r in read_metrics(resumed) if "reward_mean" in r]
    assert steps == [1, 2, 3]
    rewards = lambda d: [r["reward_mean"] for r in read_metrics(d) if "reward_mean" in r]  # noqa: E731
    assert rewards(straight) == rewards(resumed)
    rates = [r["learning_rate"] for r in read_metrics(resumed) if "reward_mean" in r]
    assert rates == pytest.approx([5e-4, 1e-3, 5e-4])  # half the peak warming up, the peak, cosine's midpoint


@pytest.mark.parametrize(
    "overrides",
    [
        {"dora": True},
        {"kl_coef": 0.1},
        {"objective": "cispo"},
        {"objective": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, "normalization": "seq_mean"},
        {"normalization": "constant", "scale_advantages": True},
        {"minibatches": 2, "max_batch_tokens": 512, "lora_keys": ["self_attn.q_proj", "self_attn.v_proj"]},
    ],
)
def test_every_variant_updates_the_adapters(overrides):
    from artmlx.model.policy import LoraSpec, load_policy

    config = load_config(None, {"learning_rate": 1e-3, "groups_per_step": 4, **overrides})
    mx.random.seed(0)
    model, tokenizer, trainable = load_policy("tiny", LoraSpec.from_config(config))
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    groups = engine.play(list(range(4)), 8, mx.random.key(0))
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    trainer = GRPOTrainer(model, TrainerSettings.of(config))
    metrics = trainer.train_step(groups)
    assert metrics["episodes_trained"] > 0 and np.isfinite(metrics["loss"])
    after = dict(tree_flatten(model.trainable_parameters()))
    assert any(not np.array_equal(np.array(after[k]), before[k]) for k in before)
    if overrides.get("minibatches") == 2:
        # The second optimizer step sees the first one's update: ratios move away from 1.
        assert metrics["ratio_max"] > 1.0 + 1e-6 and trainable < 32768
    if overrides.get("kl_coef"):
        assert metrics["kl_base"] >= 0.0


def test_a_non_finite_update_is_skipped_and_the_adapters_kept():
    """A behaviour logprob of -1e30 (finite, absurd) makes the ratio overflow: nothing of it reaches the adapters."""
    model, tokenizer = tiny_policy(perturb=0.01)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    groups = engine.play(list(range(4)), 6, mx.random.key(0))
    poisoned = groups[0].episodes[0]
    poisoned.logprobs[poisoned.policy_mask.index(True)] = -1e30
    for group in groups:
        group.episodes[0].reward, group.episodes[1].reward = 1.0, 0.0  # every group carries signal
    trainer = GRPOTrainer(model, trainer_settings({"learning_rate": 1e-3}))
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    metrics = trainer.train_step(groups)
    assert metrics["updates_skipped_nonfinite"] == 1 and trainer.policy_version == 0
    after = dict(tree_flatten(model.trainable_parameters()))
    assert all(np.array_equal(np.array(after[k]), before[k]) for k in before)
    # The next, clean batch trains as usual.
    poisoned.logprobs[poisoned.policy_mask.index(True)] = -1.0
    metrics = trainer.train_step(groups)
    assert metrics["updates_skipped_nonfinite"] == 0 and trainer.policy_version == 1
    assert all(np.isfinite(np.array(v)).all() for _, v in tree_flatten(model.trainable_parameters()))


def test_sampling_never_drops_out_and_training_does():
    """lora_dropout applies to the learner's forward only: rollouts and evaluation sample deterministically."""
    from artmlx.model.policy import load_policy

    model, tokenizer, _ = load_policy("tiny", LoraSpec(rank=8, scale=20.0, dropout=0.5))
    noisy = [(k, mx.random.normal(v.shape) * 0.05) for k, v in tree_flatten(model.trainable_parameters())]
    model.load_weights(noisy, strict=False)
    tokens = mx.array([[1, 2, 3, 4, 5, 6]])
    assert np.array_equal(np.array(model(tokens)), np.array(model(tokens)))  # eval mode after loading
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    groups = engine.play(list(range(4)), 6, mx.random.key(0))
    for group in groups:
        group.episodes[0].reward, group.episodes[1].reward = 1.0, 0.0
    trainer = GRPOTrainer(model, trainer_settings({"lora_dropout": 0.5, "learning_rate": 1e-3}))
    model.train(True)
    assert not np.array_equal(np.array(model(tokens)), np.array(model(tokens)))  # dropout when training
    model.eval()
    trainer.train_step(groups)
    assert not model.training and np.array_equal(np.array(model(tokens)), np.array(model(tokens)))


def test_flat_groups_count_in_the_sequence_denominators():
    """Dr. GRPO's constant and GRPO's seq-mean normalisers count every episode of the update."""
    model, tokenizer = tiny_policy(perturb=0.01)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    signal, flat = engine.play([3, 4], 4, mx.random.key(0))
    for index, episode in enumerate(signal.episodes):
        episode.reward = float(index % 2)
    for episode in flat.episodes:
        episode.reward = 0.5
    for normalization in ("constant", "seq_mean"):
        norms = []
        for groups in ([signal], [signal, flat]):
            fresh, _ = tiny_policy(perturb=0.01)  # the same weights each time: the norms compare exactly
            trainer = GRPOTrainer(fresh, trainer_settings({"normalization": normalization}))
            norms.append(trainer.train_step(groups)["grad_norm"])
        np.testing.assert_allclose(norms[1], norms[0] / 2, rtol=1e-4)  # 8 episodes in the update, not 4


def test_apply_changes_the_loss_and_the_learning_rate_together_and_keeps_the_optimizer_state():
    from dataclasses import replace

    model, _ = tiny_policy()
    trainer = GRPOTrainer(model, trainer_settings({"learning_rate": 1e-4}))
    state_before = trainer.optimizer.state
    trainer.apply(replace(trainer.config, objective="cispo", eps_high=0.4, kl_coef=0.1, learning_rate=3e-5))
    assert (trainer.settings.objective, trainer.settings.eps_high, trainer.settings.kl_coef) == ("cispo", 0.4, 0.1)
    assert abs(trainer.optimizer.learning_rate.item() - 3e-5) < 1e-12 and trainer.optimizer.state is state_before
    with pytest.raises(TypeError, match="TrainerSettings"):
        trainer.apply({"learning_rate": 1.0})


def test_a_compiled_step_follows_apply():
    """A compiled grad step fixes the loss's settings when it traces a shape: after `apply`, the same groups
    (the same shapes) must train with the new settings, as the uncompiled step does."""
    from dataclasses import replace

    from artmlx.bench.learner import make_groups

    losses = {}
    for compiled in (False, True):
        model, _ = tiny_policy(perturb=0.02)
        groups = make_groups(2, 4, 12, 10, 100, seed=1)
        for group in groups:
            for index, episode in enumerate(group.episodes):
                episode.reward = float(index % 2)
        trainer = GRPOTrainer(model, trainer_settings({"compile_step": compiled, "learning_rate": 1e-3}))
        first = trainer.train_step(groups)["loss"]
        trainer.apply(replace(trainer.config, temperature=0.5))  # changes every logprob the loss sees
        losses[compiled] = (first, trainer.train_step(groups)["loss"])
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4, atol=1e-6)
