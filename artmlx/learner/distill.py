"""On-policy distillation from directive hints: a per-token advantage from a hinted teacher.

After an episode the environment (or an agent) may know what should have been different: the right
answer, the error of a failed tool call, the rule that was broken. That text is a *hint*. The teacher
is a model that sees the hint; the student is the policy that sampled the episode without it. For each
token a_t the student sampled in state s_t (OpenClaw-RL, Wang et al. 2026, "Hindsight-Guided On-Policy
Distillation", `openclaw-opd/` and `openclaw-combine/combine_loss.py`):

    A_opd(t) = log pi_teacher(a_t | s_t + hint) - log pi_old(a_t | s_t)

positive where the hint makes the sampled token more likely (keep doing that), negative where the hint
makes it less likely (this is what the hint says to change). It is combined with GRPO's episode
advantage A_i (`grpo.group_advantages`) token by token:

    A(t) = reward_weight * A_i + hint_weight * A_opd(t)        on a hinted episode's sampled tokens
    A(t) = reward_weight * A_i                                  elsewhere

(both weights 1 in OpenClaw-RL) and used in place of A_i in the same clipped objective
(`grpo.policy_loss`). A group whose rewards are all equal has A_i = 0 and still trains through its
hinted tokens.

artmlx's choices, where the paper leaves room:
- the teacher context is the episode's opening messages with the hint appended to the last user
  message (`artmlx/hints.py`, OpenClaw-RL's form), then exactly the tokens the episode has after its
  prompt; the teacher scores every sampled token of every turn at its own place;
- the teacher is the frozen base (LoRA off, `hint_teacher = "base"`, as OpenClaw-RL) or the current
  policy (`"policy"`, as SDPO's self-teacher), in the learner, once per update, without gradient;
- log pi_old is the behaviour logprob recorded at sampling (the ratio's reference too), tempered by the
  sampling temperature; the teacher's logits are divided by `hint_temperature` (0: the same temperature).
  A sharper teacher (below the sampling temperature) weighs its likeliest reply more: SmolLM2-135M given the
  answer in OpenClaw-RL's form answers right 26 % of the time sampled at temperature 1, 62 % at 0.5;
- `hint_baseline = "episode"` subtracts the episode's mean log-ratio from each of its tokens' (not in
  OpenClaw-RL): a small teacher that reads a hint often lowers every sampled token a little (SmolLM2-135M:
  mean -0.12 to -0.29 nats), which the plain form turns into a push down on every token; centred, only the
  tokens the hint singles out move.

The top-K variant (`hint_topk = K`, OpenClaw-RL's `openclaw-opd/topk_distillation_loss.py`, after SDFT and
SDPO) compares whole distributions instead of the one sampled token: at each sampled position the teacher's K
likeliest tokens (their ids and logprobs, from the same teacher pass) and one more bin for the rest of the
vocabulary; the policy's logprobs of those K ids, with gradient, and its own rest. The loss added at the token is
the reverse KL over the K + 1 bins

    KL(pi_theta || pi_teacher) = sum_k p_k (log p_k - log q_k),   log p_rest = log(1 - sum_k p_k)

(p the policy's, q the teacher's), times `hint_weight`, in place of the token-level advantage; GRPO's episode
advantage stays. It pulls the policy toward everything the hinted teacher would say at that point, not only up or
down on the token it happened to sample.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

TAIL_CLAMP = -1e-7  # log of the top-K mass is kept below 0, so that the rest's log(1 - mass) stays finite

def token_advantages(episode_advantage: float, policy_mask: np.ndarray, behaviour: np.ndarray,
                     teacher: np.ndarray | None, reward_weight: float = 1.0,
                     hint_weight: float = 1.0, baseline: str = "none") -> np.ndarray:
    """Per-token advantages over one episode's tokens (0 where the policy did not sample).

    `behaviour` is the episode's behaviour logprobs (0 off-policy), `teacher` the teacher's logprobs of the
    episode's sampled tokens in order (one per sampled token), or None for an episode without a hint.
    `baseline = "episode"` subtracts the mean teacher-student log-ratio over the episode's sampled tokens."""
    if baseline not in ("none", "episode"):
        raise ValueError(f"hint baseline must be 'none' or 'episode', got {baseline!r}")
    mask = np.asarray(policy_mask, bool)
    out = np.where(mask, np.float32(reward_weight * episode_advantage), np.float32(0.0)).astype(np.float32)
    if teacher is not None:
        teacher = np.asarray(teacher, np.float32)
        if len(teacher) != int(mask.sum()):
            raise ValueError(f"teacher logprobs for {len(teacher)} tokens, the episode sampled {int(mask.sum())}")
        gap = teacher - np.asarray(behaviour, np.float32)[mask]
        if baseline == "episode" and len(gap):
            gap = gap - gap.mean()
        out[mask] += np.float32(hint_weight) * gap
    return out


def tail_logprob(topk_logprobs: mx.array) -> mx.array:
    """log(1 - sum_k exp(l_k)) over the last axis, the mass outside the K tokens (clamped finite)."""
    mass = mx.minimum(mx.logsumexp(topk_logprobs, axis=-1, keepdims=True), TAIL_CLAMP)
    return mx.log(-mx.expm1(mass))


def topk_reverse_kl(student: mx.array, teacher: mx.array) -> mx.array:
    """KL(student || teacher) over K + 1 bins per position: the K given tokens and the rest.

    `student`, `teacher`: (..., K) logprobs of the same K token ids (the teacher's top K) under each model.
    Returns (...). Differentiable in `student`; the teacher is a constant."""
    student = mx.concatenate([student, tail_logprob(student)], axis=-1)
    teacher = mx.stop_gradient(mx.concatenate([teacher, tail_logprob(teacher)], axis=-1))
    return (mx.exp(student) * (student - teacher)).sum(axis=-1)
