"""Token-exact conversations from text-only clients at a real vocabulary: Qwen2.5's 151,936-token byte-level
BPE (small random layers), the real `openai` client resending each reply as text, the real openpipe-art
Trajectory, the learner's recompute."""

import asyncio
import os
import threading

import numpy as np
import openai
import pytest

from artmlx.art import trajectory_episode
from artmlx.chat import ChatFormat
from artmlx.netutil import free_port
from artmlx.serve import run_server
from artmlx.serve.conversations import Conversations
from artmlx.serve.model_server import ModelServer, ServeConfig
from artmlx.trajectory import Group
from tests.helpers import learner_logprobs

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
KEY = "k"


@pytest.fixture(scope="module")
def served(small_synth):
    server = ModelServer(ServeConfig(model=str(small_synth), max_rows=16, max_prompt_tokens=4096, max_tokens=64))
    port = free_port()
    ready = threading.Event()
    http = run_server(server, "127.0.0.1", port, KEY, ready=ready)
    assert ready.wait(60) and http.started
    yield server, f"http://127.0.0.1:{port}/v1"
    http.should_exit = True
    http.thread.join(10)
    server.close()


def test_a_non_canonical_sampled_split_is_resent_as_the_tokens_sampled(served):
    server, base_url = served
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
    encode = server.chat.encode
    space_a, b = encode(" a")[0], encode("b")[0]
    assert encode(" ab") != [space_a, b]  # the tokenizer merges " ab": sampling " a", "b" is not its encoding
    messages = [{"role": "user", "content": "say ab"}]
    first = client.chat.completions.create(model=server.name, messages=messages, max_tokens=6, seed=3,
                                           logit_bias={str(space_a): 100, str(b): 100}).choices[0]
    sampled, prompt = first.model_extra["token_ids"], first.model_extra["prompt_token_ids"]
    assert set(sampled) <= {space_a, b} and first.finish_reason == "length"
    messages += [{"role": "assistant", "content": first.message.content}, {"role": "user", "content": "again"}]
    # Rendering the text again gives other ids than the model saw...
    rendered = server.chat.prompt_ids(messages)
    assert rendered[:len(prompt) + len(sampled)] != prompt + sampled
    # ...the server gives back the ids it sampled, closes the cut reply as the template does, then the new turn.
    second = client.chat.completions.create(model=server.name, messages=messages, max_tokens=4).choices[0]
    again = second.model_extra["prompt_token_ids"]
    assert again[:len(prompt) + len(sampled)] == prompt + sampled
    closing = server.chat.continuation_ids(messages[2:], sampled[-1])
    assert again == prompt + sampled + closing
    assert server.chat.tokenizer.decode(closing).startswith("<|im_end|>")  # no end-of-turn was sampled
    # A reply the client edited matches nothing: the conversation is rendered as text.
    edited = [*messages[:1], {"role": "assistant", "content": first.message.content + "!"}, messages[2]]
    third = client.chat.completions.create(model=server.name, messages=edited, max_tokens=2).choices[0]
    assert third.model_extra["prompt_token_ids"] == server.chat.prompt_ids(edited)


def test_a_multi_turn_agent_group_trains_token_exactly_without_refusals(served):
    """Six agents of three turns each, every reply appended as text (what an ART rollout does): every
    trajectory is one token sequence, its trained tokens are exactly those sampled, and the learner's
    recompute gives the sampler's logprobs back."""
    art = pytest.importorskip("art")
    server, base_url = served
    hits = server.conversations.hits

    async def agent(client, seed: int):
        trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"task {seed}: go"}],
                                    reward=float(seed % 3))
        for turn in range(3):
            response = await client.chat.completions.create(model=server.name, messages=trajectory.messages(),
                                                            max_tokens=10)
            trajectory.messages_and_choices += [response.choices[0],
                                                {"role": "user", "content": f"observation {turn} fine"}]
        return trajectory

    async def group():
        client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=300)
        return await asyncio.gather(*(agent(client, seed) for seed in range(6)))

    scheduler = server.scheduler
    prefilled, prefix_hits = scheduler.prefill_tokens, scheduler.prefix.hits
    trajectories = asyncio.run(group())
    assert server.conversations.hits - hits == 6 * 2
    # turns 2 and 3 prefill only what is new (the closing, the observation, the next generation prompt);
    # first turns may reuse the shared system prompt of earlier sequences too
    assert scheduler.prefix.hits - prefix_hits >= 6 * 2
    first_turns = sum(len(t.messages_and_choices[1].model_extra["prompt_token_ids"]) for t in trajectories)
    new, later = 0, 0
    for t in trajectories:
        choices = t.messages_and_choices[1::2]
        for before, choice in zip(choices, choices[1:]):
            seen = len(before.model_extra["prompt_token_ids"]) + len(before.model_extra["token_ids"])
            new += len(choice.model_extra["prompt_token_ids"]) - seen
            later += len(choice.model_extra["prompt_token_ids"])
    assert scheduler.prefill_tokens - prefilled <= first_turns + new < first_turns + later
    episodes, vocab = [], server.model.args.vocab_size
    for trajectory in trajectories:
        episode = trajectory_episode(trajectory, server.chat, 1.0, vocab)  # raises if any turn is not exact
        choices = [c for c in trajectory.messages_and_choices if not isinstance(c, dict)]
        sampled = [t for c in choices for t in c.model_extra["token_ids"]]
        assert [t for t, m in zip(episode.tokens, episode.policy_mask) if m] == sampled
        assert episode.tokens[-len(choices[-1].model_extra["token_ids"]):] == choices[-1].model_extra["token_ids"]
        episodes.append(episode)
    # The random model's replies mostly run to the token limit: the cut ones were closed exactly too.
    assert any(c.finish_reason == "length" for t in trajectories for c in t.messages_and_choices
               if not isinstance(c, dict))
    learner, sampler = learner_logprobs(server.model, [Group(0, episodes, 0)], 1.0)
    np.testing.assert_allclose(learner, sampler, atol=2e-3)


def test_tool_calls_match_whatever_json_spacing_the_client_resends():
    from artmlx.model.policy import load_base

    _, tokenizer = load_base("tiny")
    chat = ChatFormat(tokenizer)
    conversations = Conversations(chat, capacity=2)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    asked = [{"role": "user", "content": "add 1 and 2"}]
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    prompt = chat.prompt_ids(asked, tools)
    sampled = chat.encode('<tool_call>\n{"name":"add","arguments":{"b":2,"a":1}}\n</tool_call>') + [2]
    conversations.remember(asked, tools, None, reply, prompt + sampled)
    resent = {**reply, "tool_calls": [{"id": "other", "type": "function",
                                       "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}]}
    follow = [*asked, resent, {"role": "tool", "tool_call_id": "other", "content": "3"}]
    ids = conversations.prompt_ids(follow, tools)
    assert ids[:len(prompt) + len(sampled)] == prompt + sampled and conversations.hits == 1
    # other arguments are another reply; and the store keeps only the newest `capacity` replies
    wrong = [*asked, {**reply, "tool_calls": [{**reply["tool_calls"][0], "function": {"name": "add",
                                                                                     "arguments": '{"a": 5}'}}]}]
    assert conversations.prompt_ids(wrong, tools) == chat.prompt_ids(wrong, tools)
    for n in range(2):
        conversations.remember([{"role": "user", "content": str(n)}], None, None, {"content": "x"}, [1, 2])
    assert conversations.prompt_ids(follow, tools) == chat.prompt_ids(follow, tools)
