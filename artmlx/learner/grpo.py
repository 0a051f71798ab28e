"""GRPO, as artmlx implements it: pure functions over arrays.

Algorithm (Shao et al. 2024, "DeepSeekMath", GRPO), per update:
  1. For each task, G episodes were sampled by a behaviour policy mu (the actor's copy of the
     policy, possibly a few versions old). Each episode i has a reward r_i.
  2. Advantage A_i = r_i - mean_group(r), optionally divided by std_group(r) (`scale_by_std`).
     Groups whose rewards are all equal carry no signal; they are skipped and counted.
  3. Every policy token t of episode i gets A_i. With r_t = pi(y_t) / mu(y_t) (current over
     behaviour probability, the behaviour logprob recorded at sampling time), the token loss is
       ppo   : -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)        (DAPO's clip-higher)
       cispo : -sg(min(r_t, 1 + eps_high)) A log pi(y_t)                   (MiniMax-M1; every token
               keeps a gradient, the importance weight is truncated above and stopped; the paper's
               lower bound is set so large that it never binds, so `eps_low` does not apply here)
       gspo  : the ppo form with the sequence ratio s_i = exp(mean_t log r_t) in place of r_t,
               as s_i,t = sg(s_i) pi(y_t) / sg(pi(y_t)) (Zheng et al. 2025; use small eps, ~3e-4)
  4. Normalisation (`normalization`), as per-token weights so micro-batches add up exactly:
       token_mean : sum over all policy tokens of the update / their count      (DAPO)
       seq_mean   : mean over tokens within an episode, then over episodes      (original GRPO)
       constant   : sum / (episodes x `constant_length`)                         (Dr. GRPO)
     For seq_mean and constant, "episodes" counts every episode of the update, including those of
     groups skipped for zero reward variance (their gradient is zero, not absent), so the step size
     does not grow when many groups are flat.
  5. Optional KL to the frozen base, k3 estimator exp(q - p) - (q - p) - 1 per token, weight
     `kl_coef` (base logprobs q come from the same model with LoRA switched off).

Deviations from the paper: no KL term by default (DAPO, Dr. GRPO, nanochat drop it); the
reference for the ratio is the recorded behaviour logprob, not a re-computed "old policy", so
asynchronous staleness and sampler/learner numeric mismatch are corrected by the same ratio;
logprobs are of the tempered distribution (logits / temperature) that was actually sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

OBJECTIVES = ("ppo", "cispo", "gspo")
NORMALIZATIONS = ("token_mean", "seq_mean", "constant")


@dataclass(frozen=True)
class LossSettings:
    objective: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.0


def group_advantages(rewards: mx.array, scale_by_std: bool = False, eps: float = 1e-6):
    """Advantages for rewards of shape (groups, G); returns (advantages, zero_variance[groups])."""
    mean = rewards.mean(axis=1, keepdims=True)
    centered = rewards - mean
    std = mx.sqrt((centered * centered).mean(axis=1, keepdims=True))
    zero_variance = std[:, 0] <= eps
    advantages = centered / (std + eps) if scale_by_std else centered
    return mx.where(zero_variance[:, None], 0.0, advantages), zero_variance


def token_logprobs(logits: mx.array, targets: mx.array, temperature: float = 1.0) -> mx.array:
    """log softmax(logits / temperature) at `targets`; logits (B, T, V), targets (B, T)."""
    logits = logits.astype(mx.float32)
    if temperature not in (0, 1):
        logits = logits / temperature
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - mx.logsumexp(logits, axis=-1)


def token_weights(mask: mx.array, normalization: str, episodes_in_update: float,
                  tokens_in_update: int, constant_length: int = 1) -> mx.array:
    """Per-token loss weights (B, T) for one micro-batch, normalised over the whole update."""
    mask = mask.astype(mx.float32)
    if normalization == "token_mean":
        return mask / max(tokens_in_update, 1)
    if normalization == "seq_mean":
        lengths = mx.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        return mask / lengths / max(episodes_in_update, 1)
    if normalization == "constant":
        return mask / (max(episodes_in_update, 1) * constant_length)
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")


def policy_loss(logp: mx.array, behaviour_logp: mx.array, advantages: mx.array, mask: mx.array,
                weights: mx.array, settings: LossSettings, base_logp: mx.array | None = None,
                extra_per_token: mx.array | None = None):
    """Weighted loss sum for one micro-batch, and metric sums over its policy tokens.

    logp, behaviour_logp, mask, weights, base_logp: (B, T); advantages: (B,) one per episode, or (B, T) one
    per token (`distill.py`: a directive hint's teacher gives each token its own).
    Returns (loss, metrics) where metrics hold sums (divide by `tokens`) and a max.
    """
    mask = mask.astype(mx.float32)
    adv = advantages if advantages.ndim == 2 else advantages[:, None]
    log_ratio = (logp - behaviour_logp) * mask
    ratio = mx.exp(log_ratio)
    low, high = 1.0 - settings.eps_low, 1.0 + settings.eps_high

    if settings.objective == "ppo":
        clipped = mx.clip(ratio, low, high)
        per_token = -mx.minimum(ratio * adv, clipped * adv)
        clip_ratio = ratio
    elif settings.objective == "cispo":
        weight = mx.stop_gradient(mx.minimum(ratio, high))
        per_token = -weight * adv * logp
        clip_ratio = ratio
    elif settings.objective == "gspo":
        lengths = mx.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        seq_ratio = mx.exp(log_ratio.sum(axis=1, keepdims=True) / lengths)
        token_ratio = mx.stop_gradient(seq_ratio) * mx.exp(logp - mx.stop_gradient(logp))
        clipped = mx.clip(token_ratio, low, high)
        per_token = -mx.minimum(token_ratio * adv, clipped * adv)
        clip_ratio = mx.broadcast_to(seq_ratio, ratio.shape)
    else:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {settings.objective!r}")

    kl_sum = mask.sum() * 0.0  # an op, not a constant: compiled outputs need a primitive
    if base_logp is not None:
        delta = (base_logp - logp) * mask
        kl = mx.exp(delta) - delta - 1.0
        kl_sum = (kl * mask).sum()
        if settings.kl_coef:
            per_token = per_token + settings.kl_coef * kl

    if extra_per_token is not None:  # a per-token loss beside the policy's (a hint's top-K KL, `distill.py`)
        per_token = per_token + extra_per_token
    loss = (per_token * weights).sum()
    # Tokens whose gradient the clip changed: for ppo/gspo where the clipped branch is the minimum
    # (A > 0 above 1 + eps_high, A < 0 below 1 - eps_low), for cispo where the weight was truncated.
    if settings.objective == "cispo":
        outside = (clip_ratio > high).astype(mx.float32) * mask
    else:
        outside = (((adv > 0) & (clip_ratio > high)) | ((adv < 0) & (clip_ratio < low))).astype(mx.float32) * mask
    plain_ratio = mx.stop_gradient(ratio)
    metrics = {
        "tokens": mask.sum(),
        "ratio_sum": (plain_ratio * mask).sum(),
        "ratio_max": mx.max(mx.where(mask > 0, plain_ratio, 0.0)),
        "clipped_sum": outside.sum(),
        # k3 estimate of KL(behaviour || current): the sampler/learner mismatch plus staleness.
        "mismatch_kl_sum": mx.stop_gradient((plain_ratio - 1.0 - log_ratio) * mask).sum(),
        "abs_logratio_sum": mx.stop_gradient(mx.abs(log_ratio)).sum(),
        "kl_base_sum": mx.stop_gradient(kl_sum),
    }
    return loss, metrics
