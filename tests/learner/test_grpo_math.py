"""GRPO math against a NumPy reference written independently of the MLX code."""

import mlx.core as mx
import numpy as np
import pytest

from artmlx.learner.grpo import LossSettings, group_advantages, policy_loss, token_logprobs, token_weights


def np_advantages(rewards, scale):
    centered = rewards - rewards.mean(axis=1, keepdims=True)
    std = rewards.std(axis=1, keepdims=True)
    flat = std[:, 0] <= 1e-6
    adv = centered / (std + 1e-6) if scale else centered
    adv[flat] = 0.0
    return adv, flat


@pytest.mark.parametrize("scale", [False, True])
def test_group_advantages_match_numpy(scale):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(6, 8)).astype(np.float32)
    rewards[2] = 0.5  # a group with no variance
    adv, flat = group_advantages(mx.array(rewards), scale_by_std=scale)
    ref_adv, ref_flat = np_advantages(rewards.astype(np.float64), scale)
    np.testing.assert_allclose(np.array(adv), ref_adv, rtol=1e-4, atol=1e-5)
    assert np.array(flat).tolist() == ref_flat.tolist()
    assert np.array(flat).sum() == 1


def test_token_logprobs_is_tempered_log_softmax():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
    targets = rng.integers(0, 11, size=(2, 5))
    for temperature in (1.0, 0.7):
        scaled = logits.astype(np.float64) / temperature
        ref = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
        ref = np.take_along_axis(ref, targets[..., None], -1)[..., 0]
        got = token_logprobs(mx.array(logits), mx.array(targets), temperature)
        np.testing.assert_allclose(np.array(got), ref, rtol=1e-5, atol=1e-5)


def np_weights(mask, normalization, episodes, tokens, constant):
    if normalization == "token_mean":
        return mask / tokens
    if normalization == "seq_mean":
        return mask / np.maximum(mask.sum(1, keepdims=True), 1) / episodes
    return mask / (episodes * constant)


def np_loss(logp, old, adv, mask, weights, objective, eps_low, eps_high):
    log_ratio = (logp - old) * mask
    ratio = np.exp(log_ratio)
    a = adv[:, None]
    if objective == "ppo":
        per = -np.minimum(ratio * a, np.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
    elif objective == "cispo":  # MiniMax-M1: the IS weight truncated above only, gradient through log pi
        per = -np.minimum(ratio, 1 + eps_high) * a * logp
    else:
        seq = np.exp(log_ratio.sum(1, keepdims=True) / np.maximum(mask.sum(1, keepdims=True), 1))
        per = -np.minimum(seq * a, np.clip(seq, 1 - eps_low, 1 + eps_high) * a)
    return (per * weights).sum()


def random_batch(seed):
    rng = np.random.default_rng(seed)
    shape = (4, 9)
    logp = np.log(rng.uniform(0.05, 1.0, size=shape))
    old = logp + rng.normal(scale=0.3, size=shape)  # some ratios land outside the clip range
    mask = (rng.uniform(size=shape) < 0.7).astype(np.float64)
    mask[0] = 0
    mask[0, 3] = 1
    adv = rng.normal(size=4)
    return logp, old, adv, mask


@pytest.mark.parametrize("objective", ["ppo", "cispo", "gspo"])
@pytest.mark.parametrize("normalization", ["token_mean", "seq_mean", "constant"])
def test_policy_loss_matches_numpy(objective, normalization):
    logp, old, adv, mask = random_batch(2)
    weights = np_weights(mask, normalization, 4, mask.sum(), 16)
    got_weights = token_weights(mx.array(mask), normalization, 4, int(mask.sum()), 16)
    np.testing.assert_allclose(np.array(got_weights), weights, rtol=1e-6)
    settings = LossSettings(objective, 0.2, 0.28)
    f32 = lambda x: mx.array(x.astype(np.float32))  # noqa: E731
    loss, metrics = policy_loss(f32(logp), f32(old), f32(adv), f32(mask), f32(weights), settings)
    ref = np_loss(logp, old, adv, mask, weights, objective, 0.2, 0.28)
    np.testing.assert_allclose(loss.item(), ref, rtol=1e-4, atol=1e-6)
    ratio = np.exp((logp - old) * mask)
    assert metrics["tokens"].item() == mask.sum()
    # clip_frac counts the tokens whose gradient the clip changed (PPO paper's clipped branch active).
    a = adv[:, None]
    seen = ratio if objective != "gspo" else np.exp(
        ((logp - old) * mask).sum(1, keepdims=True) / np.maximum(mask.sum(1, keepdims=True), 1)) * np.ones_like(ratio)
    if objective == "cispo":
        changed = seen > 1.28
    else:
        changed = ((a > 0) & (seen > 1.28)) | ((a < 0) & (seen < 0.8))
    assert metrics["clipped_sum"].item() == (changed * mask).sum()
    np.testing.assert_allclose(metrics["ratio_sum"].item() / mask.sum(), (ratio * mask).sum() / mask.sum(), rtol=1e-4)


def test_ppo_gradient_matches_numpy():
    """d loss / d logp is -r A w where the unclipped branch is active, else 0."""
    logp, old, adv, mask = random_batch(3)
    weights = np_weights(mask, "token_mean", 4, mask.sum(), 1)
    settings = LossSettings("ppo", 0.2, 0.28)
    f32 = lambda x: mx.array(x.astype(np.float32))  # noqa: E731

    def loss_of(lp):
        return policy_loss(lp, f32(old), f32(adv), f32(mask), f32(weights), settings)[0]

    grad = np.array(mx.grad(loss_of)(f32(logp)))
    ratio = np.exp(logp - old)
    a = adv[:, None]
    unclipped = ratio * a <= np.clip(ratio, 0.8, 1.28) * a
    active = np.where(a >= 0, ratio < 1.28, ratio > 0.8) & unclipped
    ref = np.where(active, -ratio * a, 0.0) * weights
    np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=1e-7)


def test_kl_penalty_is_k3_and_zero_at_base():
    logp, old, adv, mask = random_batch(4)
    f32 = lambda x: mx.array(x.astype(np.float32))  # noqa: E731
    weights = np_weights(mask, "token_mean", 4, mask.sum(), 1)
    plain = LossSettings("ppo", 0.2, 0.28, kl_coef=0.0)
    with_kl = LossSettings("ppo", 0.2, 0.28, kl_coef=0.5)
    args = (f32(logp), f32(old), f32(adv), f32(mask), f32(weights))
    same, m_same = policy_loss(*args, with_kl, base_logp=f32(logp))
    base, _ = policy_loss(*args, plain)
    np.testing.assert_allclose(same.item(), base.item(), rtol=1e-6)
    assert m_same["kl_base_sum"].item() == pytest.approx(0.0, abs=1e-6)
    shifted = logp + 0.3
    pen, m = policy_loss(*args, with_kl, base_logp=f32(shifted))
    d = 0.3
    k3 = np.exp(d) - d - 1
    np.testing.assert_allclose(pen.item() - base.item(), 0.5 * k3 * (weights * mask).sum(), rtol=1e-4)
    np.testing.assert_allclose(m["kl_base_sum"].item(), k3 * mask.sum(), rtol=1e-4)


def test_unknown_objective_is_a_clear_error():
    logp, old, adv, mask = random_batch(5)
    f32 = lambda x: mx.array(x.astype(np.float32))  # noqa: E731
    with pytest.raises(ValueError, match="objective"):
        policy_loss(f32(logp), f32(old), f32(adv), f32(mask), f32(mask), LossSettings("dpo"))
