"""ART on MLX with the real `openpipe-art` and `openai` packages: token-exact trajectories and training."""

import asyncio
import os
import threading

import numpy as np
import openai
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch when art imports litellm
art = pytest.importorskip("art")

from artmlx.art import MLXBackend, TrajectoryRefused, trajectory_episode  # noqa: E402
from artmlx.netutil import free_port  # noqa: E402
from artmlx.serve import run_server  # noqa: E402
from artmlx.serve.model_server import ModelServer, ServeConfig  # noqa: E402
from artmlx.trajectory import Group  # noqa: E402
from tests.helpers import learner_logprobs  # noqa: E402

KEY = "k"


@pytest.fixture(scope="module")
def served():
    server = ModelServer(ServeConfig(model="tiny", max_rows=16, max_prompt_tokens=2048, max_tokens=32))
    port = free_port()
    http = run_server(server, "127.0.0.1", port, KEY, ready=threading.Event())
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    yield server, client
    http.should_exit = True
    http.thread.join(10)
    server.close()


def ask(client, messages, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=kw.pop("max_tokens", 8), **kw)


def test_a_multi_turn_tool_trajectory_trains_on_exactly_the_sampled_tokens(served):
    server, client = served
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "Your move?"}], tools=tools,
                                reward=1.0)
    prompts, sampled = [], []
    for turn in range(3):
        response = ask(client, trajectory.messages(), tools=tools)
        choice = response.choices[0]
        trajectory.messages_and_choices.append(choice)
        prompts.append(choice.model_extra["prompt_token_ids"])
        sampled.append(choice.model_extra["token_ids"])
        # the program answers with a tool result and a user turn before the next call
        trajectory.messages_and_choices += [{"role": "tool", "tool_call_id": "x", "content": f"result {turn}"},
                                            {"role": "user", "content": "and now?"}]
    episode = trajectory_episode(trajectory, server.chat, 1.0, server.model.args.vocab_size)
    # The sequence is the last prompt the server built, followed by the last choice's tokens: every
    # earlier choice appears inside it as the very tokens that were sampled.
    assert episode.tokens == prompts[-1] + sampled[-1]
    trained = [t for t, m in zip(episode.tokens, episode.policy_mask) if m]
    assert trained == [t for s in sampled for t in s]
    logprobs = [lp for lp, m in zip(episode.logprobs, episode.policy_mask) if m]
    expected = [lp for r in [c for c in trajectory.messages_and_choices if not isinstance(c, dict)]
                for lp in r.model_extra["token_logprobs"]]
    assert logprobs == expected
    # The learner's recompute of those tokens gives the sampler's logprobs back (same weights).
    learner, behaviour = learner_logprobs(server.model, [Group(0, [episode, episode], 0)], 1.0)
    np.testing.assert_allclose(learner, behaviour, atol=2e-3)


def test_trajectories_that_cannot_be_token_exact_are_refused_with_the_reason(served):
    server, client = served
    vocab = server.model.args.vocab_size
    messages = [{"role": "user", "content": "hi"}]
    choice = ask(client, messages).choices[0]
    bare = type(choice).model_validate({**choice.model_dump(), "token_ids": None, "token_logprobs": None,
                                        "logprobs": None})
    with pytest.raises(TrajectoryRefused, match="no token ids"):
        trajectory_episode(art.Trajectory(messages_and_choices=[*messages, bare]), server.chat, 1.0, vocab)
    cold = ask(client, messages, temperature=0.5).choices[0]
    with pytest.raises(TrajectoryRefused, match="temperature 0.5"):
        trajectory_episode(art.Trajectory(messages_and_choices=[*messages, cold]), server.chat, 1.0, vocab)
    # a second choice sampled for another conversation does not continue this one
    other = ask(client, [{"role": "user", "content": "something else"}]).choices[0]
    with pytest.raises(TrajectoryRefused, match="does not continue the conversation"):
        trajectory_episode(art.Trajectory(messages_and_choices=[*messages, choice, {"role": "user", "content": "?"},
                                                                other]), server.chat, 1.0, vocab)
    with pytest.raises(TrajectoryRefused, match="no chat completion choice"):
        trajectory_episode(art.Trajectory(messages_and_choices=messages), server.chat, 1.0, vocab)
    # vLLM's form (token_id:N logprob entries, no artmlx extras) is accepted with the rebuilt prompt
    response = ask(client, messages, logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    plain = response.choices[0]
    vllm_like = type(plain).model_validate({**plain.model_dump(), "token_ids": None, "token_logprobs": None,
                                            "prompt_token_ids": None})
    episode = trajectory_episode(art.Trajectory(messages_and_choices=[*messages, vllm_like]), server.chat, 1.0, vocab)
    assert episode.tokens == server.prompt_ids(messages) + plain.model_extra["token_ids"]


def trainable(name: str, **kw):
    """art.TrainableModel on either openpipe-art: 0.5.23 requires run_name (the checkpoint folder)."""
    if "run_name" in art.TrainableModel.model_fields:
        kw.setdefault("run_name", f"{name}-run")
    return art.TrainableModel(name=name, project="demo", base_model="tiny", **kw)


def test_art_trainable_model_gather_and_mlx_backend_train_end_to_end(tmp_path):
    from art.utils.get_model_step import get_model_step

    async def main():
        backend = MLXBackend(path=str(tmp_path), config={"lora_rank": 4, "seed": 1})
        model = trainable("agent")
        await model.register(backend)
        assert model.inference_base_url.startswith("http://127.0.0.1:") and model.get_inference_name() == "agent@0"
        client = model.openai_client()

        async def rollout() -> art.Trajectory:
            messages = [{"role": "user", "content": "Your move?"}]
            response = await client.chat.completions.create(model=model.get_inference_name(), messages=messages,
                                                            max_tokens=4)
            choice = response.choices[0]
            return art.Trajectory(messages_and_choices=[*messages, choice],
                                  reward=float(choice.model_extra["token_ids"][0] % 3))

        before = dict(backend.server.scheduler.adapters[0])
        results = []
        for _ in range(2):
            groups = await art.gather_trajectory_groups(
                [art.TrajectoryGroup(rollout() for _ in range(6)) for _ in range(3)], pbar_desc=None)
            # what ART's PipelineTrainer and 2048 pass: memory and disk knobs, accepted
            results.append(await backend.train(model, groups, learning_rate=1e-3, optimizer_save_interval=5,
                                               final_training_step=10, grad_accumulation_sequences=4,
                                               logprob_calculation_chunk_size=8, loss_fn_config=None,
                                               adam_params=None))
        assert [r.step for r in results] == [1, 2] and await model.get_step() == 2
        assert model.get_inference_name() == "agent@2"
        assert results[-1].metrics["trajectories_refused"] == 0 and results[-1].metrics["grad_norm"] > 0
        after = backend.server.scheduler.adapters[2]
        assert any(not np.array_equal(np.array(before[k]), np.array(after[k])) for k in before)
        # ART's layout: models/RUN_NAME (0.5.23) or NAME (0.5.18), checkpoints/NNNN with a step 0
        folder = backend._model_dir(model) / "checkpoints"
        assert folder.parent.name == getattr(model, "run_name", "agent")
        assert sorted(p.name for p in folder.iterdir()) == ["0000", "0001", "0002"]
        assert get_model_step(model, str(tmp_path)) == 2 and results[-1].checkpoint_path == str(folder / "0002")
        # ART's own logging (parquet) and pruning (polars over history.jsonl): the latest step stays
        await model.log(groups, split="train")
        await model.delete_checkpoints()
        assert sorted(p.name for p in folder.iterdir()) == ["0002"]
        with pytest.raises(ValueError, match="does not implement.*truncated_importance_sampling"):
            await backend.train(model, groups, truncated_importance_sampling=2.0)
        with pytest.raises(ValueError, match="kl_penalty_source"):
            await backend.train(model, groups, kl_penalty_coef=0.1, kl_penalty_source="sample")
        await backend.close()
        # A new backend on the same folder resumes at the last checkpoint; `async with` closes it.
        async with MLXBackend(path=str(tmp_path), config={"lora_rank": 4, "seed": 1}) as again:
            resumed = trainable("agent")
            await resumed.register(again)
            assert await resumed.get_step() == 2 and resumed.get_inference_name() == "agent@2"
            np.testing.assert_array_equal(np.array(again.server.scheduler.adapters[2][next(iter(after))]),
                                          np.array(after[next(iter(after))]))
        assert again.server is None

    asyncio.run(main())
