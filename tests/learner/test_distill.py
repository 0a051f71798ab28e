"""Directive hints (`learner/distill.py`): the OPD token advantage against a NumPy reference written from
OpenClaw-RL's formula, exact token alignment of the teacher pass, and hints through every layer."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.config import TrainConfig, load_config, validate
from artmlx.envs import make_env
from artmlx.hints import HINT_TEMPLATE, MAX_HINT_CHARS, hinted_messages
from artmlx.learner.distill import token_advantages
from artmlx.learner.grpo import LossSettings, policy_loss
from artmlx.learner.trainer import GRPOTrainer
from artmlx.protocol.codec import decode, encode
from artmlx.protocol.convert import group_to_message, message_to_group
from artmlx.rollout.dynamic_sampling import sample_with_signal
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.trajectory import Episode, Group
from tests.helpers import tiny_policy
from tests.learner.hinted import hinted_groups, settings


def np_opd_advantages(a_grpo, mask, behaviour, teacher, w_rl, w_opd):
    """OpenClaw-RL's combine_loss: A_t = w_opd (log pi_T - log pi_old) + w_rl A_grpo, token by token."""
    out = np.zeros(len(mask))
    k = 0
    for t, sampled in enumerate(mask):
        if sampled:
            out[t] = w_rl * a_grpo + (w_opd * (teacher[k] - behaviour[t]) if teacher is not None else 0.0)
            k += 1
    return out


@pytest.mark.parametrize("weights", [(1.0, 1.0), (0.5, 2.0), (0.0, 1.0)])
def test_token_advantages_match_numpy(weights):
    rng = np.random.default_rng(0)
    mask = rng.uniform(size=20) < 0.6
    behaviour = np.where(mask, np.log(rng.uniform(0.05, 1, 20)), 0.0)
    teacher = np.log(rng.uniform(0.05, 1, int(mask.sum())))
    got = token_advantages(0.7, mask, behaviour, teacher, *weights)
    np.testing.assert_allclose(got, np_opd_advantages(0.7, mask, behaviour, teacher, *weights), rtol=1e-5, atol=1e-6)
    plain = token_advantages(0.7, mask, behaviour, None, *weights)
    np.testing.assert_allclose(plain, np.where(mask, weights[0] * 0.7, 0.0), rtol=1e-6)
    with pytest.raises(ValueError, match="teacher logprobs for"):
        token_advantages(0.7, mask, behaviour, teacher[:-1])


def test_the_episode_baseline_removes_a_shift_every_token_shares():
    rng = np.random.default_rng(1)
    mask = rng.uniform(size=16) < 0.7
    behaviour = np.where(mask, np.log(rng.uniform(0.05, 1, 16)), 0.0)
    teacher = np.log(rng.uniform(0.05, 1, int(mask.sum())))
    gap = teacher - behaviour[mask]
    got = token_advantages(0.3, mask, behaviour, teacher, 1.0, 2.0, baseline="episode")
    reference = np.zeros(16)
    reference[mask] = 0.3 + 2.0 * (gap - gap.mean())
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
    # a teacher that lowers every sampled token by the same amount moves none of them
    shifted = token_advantages(0.3, mask, behaviour, behaviour[mask] - 0.25, baseline="episode")
    np.testing.assert_allclose(shifted, np.where(mask, 0.3, 0.0), atol=1e-6)
    with pytest.raises(ValueError, match="hint baseline"):
        token_advantages(0.3, mask, behaviour, teacher, baseline="group")
    with pytest.raises(ValueError, match="hint_baseline"):
        load_config(None, {"hint_baseline": "group"})


def test_policy_loss_takes_per_token_advantages_and_equals_numpy():
    rng = np.random.default_rng(3)
    shape = (3, 7)
    logp = np.log(rng.uniform(0.05, 1.0, size=shape))
    old = logp + rng.normal(scale=0.3, size=shape)
    mask = (rng.uniform(size=shape) < 0.7).astype(np.float64)
    adv = rng.normal(size=shape)
    weights = mask / mask.sum()
    ratio = np.exp((logp - old) * mask)
    ref = (-np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.28) * adv) * weights).sum()
    f32 = lambda x: mx.array(x.astype(np.float32))  # noqa: E731
    loss, _ = policy_loss(f32(logp), f32(old), f32(adv), f32(mask), f32(weights), LossSettings("ppo", 0.2, 0.28))
    np.testing.assert_allclose(loss.item(), ref, rtol=1e-4, atol=1e-6)
    # one advantage per episode, broadcast by hand, is the same loss as the (B,) form
    episode_adv = rng.normal(size=3)
    a, _ = policy_loss(f32(logp), f32(old), f32(episode_adv), f32(mask), f32(weights), LossSettings())
    b, _ = policy_loss(f32(logp), f32(old), f32(np.repeat(episode_adv[:, None], 7, 1)), f32(mask), f32(weights),
                       LossSettings())
    assert a.item() == b.item()


def test_hinted_messages_append_to_the_last_user_message_and_refuse_nonsense():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "5"}, {"role": "user", "content": "Again?"}]
    out = hinted_messages(messages, "The answer is 4.")
    assert out[3]["content"] == "Again?" + HINT_TEMPLATE.format(hint="The answer is 4.")
    assert out[:3] == messages[:3] and messages[3]["content"] == "Again?"  # the original is kept
    assert hinted_messages(messages, "x" * 5000)[3]["content"].endswith("x" * MAX_HINT_CHARS + "")
    for bad in ("", "   ", None, 3):
        with pytest.raises(ValueError, match="non-empty string"):
            hinted_messages(messages, bad)
    with pytest.raises(ValueError, match="user message"):
        hinted_messages([{"role": "system", "content": "s"}], "h")


def test_a_system_hint_goes_into_the_system_message_and_leaves_the_conversation_as_the_student_saw_it():
    conversation = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "5"},
                    {"role": "user", "content": "Again?"}]
    out = hinted_messages(conversation, "The answer is 4.", "system")
    assert out == [{"role": "system", "content": "The answer is 4."}, *conversation]
    with_system = [{"role": "system", "content": "Be brief."}, *conversation]
    out = hinted_messages(with_system, "The answer is 4.", "system")
    assert out == [{"role": "system", "content": "Be brief.\n\nThe answer is 4."}, *conversation]
    assert with_system[0]["content"] == "Be brief."  # the original is kept
    with pytest.raises(ValueError, match="hint form must be one of instruction, system, demonstration"):
        hinted_messages(conversation, "h", "footnote")


def test_a_demonstration_hint_is_the_answer_to_the_last_question_which_is_then_asked_again():
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    out = hinted_messages(opening, "4", "demonstration")
    assert out == [*opening, {"role": "assistant", "content": "4"}, {"role": "user", "content": "What is 2 + 2?"}]
    assert len(opening) == 2
    with pytest.raises(ValueError, match="user message"):
        hinted_messages([{"role": "system", "content": "s"}], "h", "demonstration")


def test_the_configured_hint_form_builds_the_teacher_prompt_of_every_episode():
    model, tokenizer = tiny_policy()
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("math", {"hints": True}),
                             SamplingParams(max_reply_tokens=4, hint_form="system"))
    for group in engine.play([5], 2, mx.random.key(0)):
        opening = make_env("math").reset(group.seed)
        answer = make_env("math").question(group.seed)[1]
        for episode in group.episodes:
            assert episode.teacher_prompt == engine.chat.prompt_ids(
                [{"role": "system", "content": f"The answer is {answer}."}, *opening])
    with pytest.raises(ValueError, match="hint_form"):
        validate(TrainConfig(hint_form="footnote"))


def test_the_teacher_episode_scores_exactly_the_sampled_tokens():
    episode = Episode([1, 2, 3, 10, 11, 4, 12], [False, False, False, True, True, False, True],
                      [0, 0, 0, -0.5, -0.25, 0, -1.0], teacher_prompt=[1, 2, 7, 7, 3])
    teacher = episode.teacher_episode()
    assert teacher.tokens == [1, 2, 7, 7, 3, 10, 11, 4, 12]
    assert [t for t, m in zip(teacher.tokens, teacher.policy_mask) if m] == [10, 11, 12]
    assert [p for p, m in zip(teacher.logprobs, teacher.policy_mask) if m] == [-0.5, -0.25, -1.0]
    with pytest.raises(ValueError, match="no teacher prompt"):
        Episode([1, 2], [False, True], [0, -1]).teacher_episode()


def test_an_environments_hint_becomes_the_teacher_prompt_of_its_episode():
    _, engine, groups = hinted_groups()
    for group in groups:
        opening = make_env("math").reset(group.seed)
        for episode in group.episodes:
            answer = make_env("math").question(group.seed)[1]
            assert episode.teacher_prompt == engine.chat.prompt_ids(hinted_messages(opening, f"The answer is {answer}."))
            assert episode.tokens[: episode.prompt_length] == engine.chat.prompt_ids(opening)
            assert "hint" not in episode.info  # it travels as tokens, not text
    _, _, plain = hinted_groups(env_args={"hints": False})
    assert all(e.teacher_prompt is None for g in plain for e in g.episodes)


def test_hints_cross_the_wire_and_hostile_ones_are_refused():
    from artmlx.protocol.admission import GroupLimits, group_problem

    _, _, groups = hinted_groups(seeds=(5,))
    message = group_to_message(groups[0], "actor-0", "math", "f")
    decoded = decode(encode(message))
    back = message_to_group(decoded)
    assert [e.teacher_prompt for e in back.episodes] == [e.teacher_prompt for e in groups[0].episodes]
    vocab = int(max(decoded.tokens.max(), decoded.teacher_tokens.max())) + 1
    limits = GroupLimits(env="math", group_size=4, vocab_size=vocab, max_tokens=512, max_turns=10, max_reply_tokens=6)
    assert group_problem(decoded, limits, "actor-0") == ""
    short = GroupLimits(env="math", group_size=4, vocab_size=vocab, max_tokens=int(decoded.teacher_lengths.max()) - 1,
                        max_turns=10, max_reply_tokens=6)
    assert "teacher prompt has" in group_problem(decoded, short, "actor-0")
    decoded.teacher_tokens[0] = vocab
    assert f"teacher token id {vocab}" in group_problem(decoded, limits, "actor-0")
    decoded.teacher_lengths[0] += 1
    with pytest.raises(ValueError, match="teacher_lengths"):
        decoded.check()


def test_a_teacher_that_sees_nothing_new_gives_the_grpo_advantage_back():
    """Alignment: with the teacher prompt equal to the prompt and the current policy as teacher, the teacher's
    logprob of every sampled token is the learner's own recompute, so A_opd is only the sampler/learner
    mismatch (~1e-6) at every token of every episode."""
    model, _, groups = hinted_groups()
    for group in groups:
        for episode in group.episodes:
            episode.teacher_prompt = episode.tokens[: episode.prompt_length]
    trainer = GRPOTrainer(model, settings(hint_teacher="policy"))
    episodes = [e for g in groups for e in g.episodes]
    teacher = trainer.teacher_logprobs(episodes, [[0, 1, 2, 3], [4, 5, 6, 7]])
    learner, behaviour = trainer.recompute(groups)
    assert sorted(teacher) == list(range(8))
    np.testing.assert_allclose(np.concatenate([teacher[i] for i in range(8)]), learner, atol=1e-5)
    np.testing.assert_allclose(learner, behaviour, atol=2e-3)


def test_the_base_teacher_scores_with_lora_off_and_a_hinted_prompt_changes_the_scores():
    model, tokenizer = tiny_policy(perturb=0.05)
    engine = EpisodeRollouts(model, tokenizer, lambda: make_env("math", {"hints": True}), SamplingParams(max_reply_tokens=6))
    groups = engine.play([3], 4, mx.random.key(1))
    episodes = groups[0].episodes
    base_teacher = GRPOTrainer(model, settings(hint_teacher="base")).teacher_logprobs(episodes, [[0, 1, 2, 3]])
    policy_teacher = GRPOTrainer(model, settings(hint_teacher="policy")).teacher_logprobs(episodes, [[0, 1, 2, 3]])
    assert not np.allclose(base_teacher[0], policy_teacher[0])  # LoRA off vs on
    for episode in episodes:
        episode.teacher_prompt = episode.tokens[: episode.prompt_length]
    unhinted = GRPOTrainer(model, settings(hint_teacher="policy")).teacher_logprobs(episodes, [[0, 1, 2, 3]])
    assert not np.allclose(unhinted[0], policy_teacher[0])  # the hint text changed the teacher's view


def test_a_flat_group_with_hints_trains_and_one_without_does_not():
    model, _, groups = hinted_groups(seeds=(3,))
    for episode in groups[0].episodes:
        episode.reward = 0.5  # flat: no GRPO signal
    trainer = GRPOTrainer(model, settings())
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    metrics = trainer.train_step(groups)
    assert metrics["groups_zero_variance"] == 1 and metrics["episodes_trained"] == 4
    assert metrics["hinted_token_frac"] == 1.0 and metrics["advantage_reward_abs"] == 0.0
    assert metrics["advantage_hint_abs"] > 0 and np.isfinite(metrics["hint_logratio_mean"])
    assert trainer.policy_version == 1
    changed = [k for k, v in tree_flatten(model.trainable_parameters()) if not np.array_equal(np.array(v), before[k])]
    assert changed
    for episode in groups[0].episodes:
        episode.teacher_prompt = None
    metrics = GRPOTrainer(model, settings()).train_step(groups)
    assert metrics["episodes_trained"] == 0 and "hinted_token_frac" not in metrics


def test_hints_count_only_in_groups_whose_mean_reward_is_below_the_gate():
    """`hint_group_reward_below`: a group the policy mostly gets right trains on its rewards alone (its teacher
    is never run); a group below the gate, and a flat one, trains through its hints as before."""
    model, _, groups = hinted_groups(seeds=(3, 4, 5))
    rewards = ([1.0, 1.0, 1.0, 0.1], [1.0, 0.1, 0.1, 0.0], [0.1, 0.1, 0.1, 0.1])  # means 0.775, 0.3, 0.1 (flat)
    for group, values in zip(groups, rewards):
        for episode, reward in zip(group.episodes, values):
            episode.reward = reward
    trainer = GRPOTrainer(model, settings(hint_group_reward_below=0.5))
    assert [trainer.hints_count(g) for g in groups] == [False, True, True]
    data, stats = trainer.prepare(groups)
    assert data.groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # the flat group stays: it is hinted
    assert sorted(data.token_advantages) == list(range(4, 12))  # no teacher for the first group
    hinted_tokens = sum(e.policy_tokens for g in groups[1:] for e in g.episodes)
    assert stats["hinted_token_frac"] == hinted_tokens / sum(g.policy_tokens for g in groups)
    assert stats["hint_groups_frac"] == 2 / 3
    for episode in groups[2].episodes:
        episode.reward = 1.0  # flat and right: above the gate, nothing to learn
    data, _ = GRPOTrainer(model, settings(hint_group_reward_below=0.5)).prepare(groups)
    assert data.groups == [[0, 1, 2, 3], [4, 5, 6, 7]] and data.skipped_episodes == 4
    assert [GRPOTrainer(model, settings()).hints_count(g) for g in groups] == [True, True, True]  # 0: no gate
    with pytest.raises(ValueError, match="hint_group_reward_below"):
        validate(TrainConfig(hint_group_reward_below=-1.0))


def test_dynamic_sampling_keeps_flat_groups_that_carry_hints():
    hinted = Group(0, [Episode([1, 2], [False, True], [0, -1], reward=0.0, teacher_prompt=[1])] * 2, 0)
    flat = Group(1, [Episode([1, 2], [False, True], [0, -1], reward=0.0)] * 2, 0)
    assert hinted.flat and hinted.has_signal and not flat.has_signal
    groups, counts = sample_with_signal(lambda r, n: [hinted if r == 0 else flat] * n, 2, extra_rounds=2)
    assert groups == [hinted, hinted] and counts["groups_flat_skipped"] == 0
    right = Group(2, [Episode([1, 2], [False, True], [0, -1], reward=1.0, teacher_prompt=[1])] * 2, 0)
    assert right.has_signal and not right.carries_signal(0.5) and hinted.carries_signal(0.5)  # the gate's view
    groups, counts = sample_with_signal(lambda r, n: [right if r == 0 else hinted] * n, 2, extra_rounds=2,
                                        hint_reward_below=0.5)
    assert groups == [hinted, hinted] and counts["groups_flat_skipped"] == 2  # the all-right group is replaced


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "run"])
def test_hints_train_through_train_and_run(tmp_path, command):
    """The whole path: an environment's hints, through the actors' wire (`run`) or in process (`train`), into
    updates whose rows say how much came from them."""
    import subprocess
    import sys

    from artmlx.metrics import read_metrics

    run = tmp_path / "run"
    extra = ["--actors", "1"] if command == "run" else []
    result = subprocess.run(
        [sys.executable, "-m", "artmlx", command, "--env", "math", "--steps", "2", "--out", str(run), *extra,
         "--set", "env_args={hints=true, max_operand=5}", "--set", "groups_per_step=2", "--set", "group_size=3",
         "--set", "eval_every=0", "--set", "max_reply_tokens=4"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in read_metrics(run) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["hinted_token_frac"] == 1.0 and r["advantage_hint_abs"] > 0 for r in rows)
    assert all(r["episodes_trained"] == 6 for r in rows)  # flat groups too: they carry hints
