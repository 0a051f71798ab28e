"""Directive hints, the top-K variant (`distill.topk_reverse_kl`): the reverse KL against a NumPy reference
written from OpenClaw-RL's top-K loss, the chunked head's many-target logprobs, and the teacher's top-K pass."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.config import TrainConfig, validate
from artmlx.learner.distill import topk_reverse_kl
from artmlx.learner.head import chunked_logprobs
from artmlx.learner.trainer import GRPOTrainer
from tests.learner.hinted import hinted_groups, settings


def np_topk_reverse_kl(student, teacher):
    """OpenClaw-RL's topk_distillation_loss: K + 1 bins (the teacher's top K and the rest), reverse KL."""
    def with_tail(logp):
        mass = min(np.log(np.exp(logp).sum()), -1e-7)
        return np.append(logp, np.log(1.0 - np.exp(mass)))
    out = []
    for s, t in zip(student, teacher):
        s, t = with_tail(np.asarray(s, np.float64)), with_tail(np.asarray(t, np.float64))
        out.append(float((np.exp(s) * (s - t)).sum()))
    return np.array(out)


def test_topk_reverse_kl_matches_numpy_and_is_zero_only_where_the_distributions_agree():
    rng = np.random.default_rng(0)
    full_s, full_t = rng.normal(size=(6, 40)), rng.normal(size=(6, 40))
    ls = full_s - np.log(np.exp(full_s).sum(-1, keepdims=True))
    lt = full_t - np.log(np.exp(full_t).sum(-1, keepdims=True))
    top = np.argsort(-lt, axis=-1)[:, :5]
    student, teacher = np.take_along_axis(ls, top, -1), np.take_along_axis(lt, top, -1)
    ours = np.array(topk_reverse_kl(mx.array(student, mx.float32), mx.array(teacher, mx.float32)))
    np.testing.assert_allclose(ours, np_topk_reverse_kl(student, teacher), rtol=1e-4, atol=1e-6)
    assert (ours > 0).all()
    same = np.array(topk_reverse_kl(mx.array(teacher, mx.float32), mx.array(teacher, mx.float32)))
    np.testing.assert_allclose(same, 0.0, atol=1e-6)
    # the gradient pushes the student toward the teacher: one step of descent lowers the KL
    grad = mx.grad(lambda s: topk_reverse_kl(s, mx.array(teacher, mx.float32)).sum())(mx.array(student, mx.float32))
    stepped = np.array(topk_reverse_kl(mx.array(student, mx.float32) - 0.05 * grad, mx.array(teacher, mx.float32)))
    assert (stepped < ours).all()


def test_chunked_logprobs_of_many_targets_equal_a_plain_forward_values_and_gradients():
    rng = np.random.default_rng(1)
    weight = mx.array(rng.normal(size=(50, 8)).astype(np.float32))
    head = lambda x: x @ weight.T  # noqa: E731
    hidden = mx.array(rng.normal(size=(7, 8)).astype(np.float32))
    targets = mx.array(np.array([[3, 3, 9], [0, 1, 2], [49, 7, 49], [5, 6, 7], [8, 8, 8], [1, 2, 3], [4, 4, 0]],
                                np.int32))  # repeated ids too
    cotangent = mx.array(rng.normal(size=(7, 3)).astype(np.float32))

    def plain(x):
        logits = head(x) / 0.7
        return mx.take_along_axis(logits, targets, -1) - mx.logsumexp(logits, -1, keepdims=True)

    def chunked(x):
        return chunked_logprobs(head, x, targets, 0.7, rows=3)

    np.testing.assert_allclose(np.array(chunked(hidden)), np.array(plain(hidden)), atol=1e-5)
    grad_plain = mx.vjp(plain, [hidden], [cotangent])[1][0]
    grad_chunked = mx.vjp(chunked, [hidden], [cotangent])[1][0]
    np.testing.assert_allclose(np.array(grad_chunked), np.array(grad_plain), atol=1e-5)


def test_the_topk_teacher_pass_is_the_hinted_contexts_own_top_k_at_every_sampled_token():
    model, engine, groups = hinted_groups(seeds=(3,))
    episodes = groups[0].episodes
    trainer = GRPOTrainer(model, settings(hint_topk=4, hint_teacher="policy"))
    scores = trainer.teacher_pass(episodes, [[0, 1, 2, 3]])
    plain = GRPOTrainer(model, settings(hint_teacher="policy")).teacher_logprobs(episodes, [[0, 1, 2, 3]])
    for i, episode in enumerate(episodes):
        logp, (ids, values) = scores[i]
        np.testing.assert_allclose(logp, plain[i], atol=1e-5)  # the sampled tokens as the token-level pass has them
        teacher = episode.teacher_episode()
        tokens = mx.array(teacher.tokens)[None]
        logits = model(tokens[:, :-1]).astype(mx.float32)[0]
        full = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        sampled = np.flatnonzero(np.asarray(teacher.policy_mask[1:], bool))
        assert ids.shape == values.shape == (len(sampled), 4)
        for row, position in enumerate(sampled):
            expected = np.sort(full[position])[::-1][:4]
            np.testing.assert_allclose(np.sort(values[row])[::-1], expected, atol=1e-4)
            np.testing.assert_allclose(full[position][ids[row]], values[row], atol=1e-4)


@pytest.mark.parametrize("k", [0, 4])
def test_a_sharper_teacher_scores_the_sampled_tokens_from_its_logits_over_hint_temperature(k):
    model, engine, groups = hinted_groups(seeds=(3,))
    episodes = groups[0].episodes
    scores = GRPOTrainer(model, settings(hint_teacher="policy", hint_temperature=0.5, hint_topk=k)).teacher_pass(
        episodes, [[0, 1, 2, 3]])
    for i, episode in enumerate(episodes):
        teacher = episode.teacher_episode()
        logits = model(mx.array(teacher.tokens)[None, :-1]).astype(mx.float32)[0] / 0.5
        full = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        sampled = np.flatnonzero(np.asarray(teacher.policy_mask[1:], bool))
        targets = np.asarray(teacher.tokens[1:])[sampled]
        logp, top = scores[i]
        np.testing.assert_allclose(logp, full[sampled, targets], atol=1e-4)
        if k:
            np.testing.assert_allclose(np.sort(top[1], axis=1)[:, ::-1], -np.sort(-full[sampled], axis=1)[:, :k],
                                       atol=1e-4)
    with pytest.raises(ValueError, match="hint_temperature"):
        validate(TrainConfig(hint_temperature=-1.0))


def test_a_flat_group_with_hints_trains_through_the_topk_term_and_refuses_a_baseline():
    model, _, groups = hinted_groups(seeds=(3,))
    for episode in groups[0].episodes:
        episode.reward = 0.5  # flat: no GRPO signal, only the hint's KL
    trainer = GRPOTrainer(model, settings(hint_topk=8))
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    metrics = trainer.train_step(groups)
    assert metrics["episodes_trained"] == 4 and metrics["hinted_token_frac"] == 1.0
    assert metrics["advantage_reward_abs"] == 0.0 and metrics["advantage_hint_abs"] == 0.0
    assert metrics["hint_topk_kl"] > 0 and trainer.policy_version == 1
    assert any(not np.array_equal(np.array(v), before[k]) for k, v in tree_flatten(model.trainable_parameters()))
    # a second update against the same (base) teacher: the KL it trains down goes down
    assert trainer.train_step(groups)["hint_topk_kl"] < metrics["hint_topk_kl"]
    with pytest.raises(ValueError, match="hint_baseline"):
        settings(hint_topk=4, hint_baseline="episode")
    with pytest.raises(ValueError, match="hint_topk' must be at most 256"):
        settings(hint_topk=257)
    with pytest.raises(ValueError, match="hint_topk = 200 is more than the model's 102 tokens"):
        GRPOTrainer(model, settings(hint_topk=200))
