"""Every request field of `artmlx serve` is implemented or refused by name: the real `openai` client
over loopback HTTP, the embedded tiny model (a character-level vocabulary: one token per character)."""

import asyncio
import json
import os
import threading
from importlib.metadata import version

import mlx.core as mx
import numpy as np
import openai
import pytest
from packaging.version import Version

from artmlx.netutil import free_port
from artmlx.serve import run_server
from artmlx.serve.model_server import ModelServer, ServeConfig
from artmlx.serve.tools import call_opening

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch when art imports litellm
KEY = "test-key"
EOS = 2  # <|im_end|>
STORY = [{"role": "user", "content": "Tell me a story"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def served():
    server = ModelServer(ServeConfig(model="tiny", max_rows=16, max_prompt_tokens=1024, max_tokens=64))
    port = free_port()
    ready = threading.Event()
    http = run_server(server, "127.0.0.1", port, KEY, ready=ready)
    assert ready.wait(30) and http.started
    base_url = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
    yield server, client, base_url
    http.should_exit = True
    http.thread.join(10)
    server.close()


def chat(client, messages=STORY, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=kw.pop("max_tokens", 16), **kw)


def step_logits(server, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The model's logits before each sampled token, from one forward of prompt + reply alone."""
    full = prompt + tokens
    return np.array(server.model(mx.array([full]))[0, len(prompt) - 1: len(full) - 1].astype(mx.float32))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("route, body, param", [
    ("chat", {"skip_special_tokens": True}, "skip_special_tokens"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ("chat", {"max_tokens": 65}, "max_tokens"),
    ("chat", {"max_completion_tokens": 1000}, "max_completion_tokens"),
    ("chat", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logit_bias": {"100000": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("chat", {"top_p": 1.5}, "top_p"),
    ("chat", {"presence_penalty": 3}, "presence_penalty"),
    ("chat", {"frequency_penalty": -2.5}, "frequency_penalty"),
    ("chat", {"seed": "7"}, "seed"),
    ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("chat", {"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ("chat", {"nvext": {"extra_fields": ["worker_id"]}}, "nvext"),
    ("chat", {"nvext": {"annotations": []}}, "nvext"),
    ("chat", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ("chat", {"tool_choice": "required"}, "tool_choice"),
    ("chat", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "tool_choice"),
    ("chat", {"tools": TOOLS, "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ("chat", {"return_token_ids": "yes"}, "return_token_ids"),
    ("chat", {"parallel_tool_calls": 0}, "parallel_tool_calls"),
    ("chat", {"user": 5}, "user"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"top_logprobs": 2}, "top_logprobs"),
    ("completions", {"chat_template_kwargs": {}}, "chat_template_kwargs"),
    ("completions", {"tools": TOOLS}, "tools"),
])
def test_a_field_that_is_not_implemented_is_a_400_naming_it(served, route, body, param):
    server, client, _ = served
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            client.chat.completions.create(model="tiny", messages=STORY, max_tokens=4, extra_body=body)
        else:
            client.completions.create(model="tiny", prompt="hi", max_tokens=4, extra_body=body)
    assert refused.value.param == param, refused.value.message
    if param in ("max_tokens", "max_completion_tokens"):
        assert "--max-tokens" in refused.value.message  # it says how to raise the limit


def test_what_art_clients_send_is_accepted(served):
    server, client, _ = served
    # openpipe-art 0.5.23's model.openai_client() sends these with every request
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True, "nvext": {"extra_fields": ["engine_data"]},
             "chat_template_kwargs": {"preserve_thinking": True}}
    response = chat(client, logprobs=True, temperature=1.0, user="agent-1", extra_body=extra)
    choice = response.choices[0]
    # the tiny template reads no preserve_thinking: the prompt is as without it
    assert choice.model_extra["prompt_token_ids"] == server.prompt_ids(STORY)
    assert [e.token for e in choice.logprobs.content] == [f"token_id:{t}" for t in choice.model_extra["token_ids"]]
    assert choice.model_extra["sampling_modified"] == [] and choice.model_extra["sampling_temperature"] == 1.0
    bare = chat(client, extra_body={"return_token_ids": False})
    assert "token_ids" not in bare.choices[0].model_extra and "prompt_token_ids" not in bare.model_extra


def test_chat_template_kwargs_reach_the_template(served):
    server, _, _ = served
    template = server.tokenizer.chat_template
    server.tokenizer.chat_template = "{% if shout %}!!{% endif %}" + template
    try:
        loud, plain = server.prompt_ids(STORY, None, {"shout": True}), server.prompt_ids(STORY)
    finally:
        server.tokenizer.chat_template = template
    assert loud == server.chat.encode("!!") + plain


def test_a_seeded_request_is_reproducible_whatever_else_is_in_the_batch(served):
    server, client, _ = served
    results = {}

    def ask(name, **kw):  # eos banned so that every reply is 24 tokens long
        results[name] = chat(client, max_tokens=24, temperature=1.0, logit_bias={str(EOS): -100}, **kw)

    threads = [threading.Thread(target=ask, args=(f"seed7-{i}",), kwargs={"seed": 7}) for i in range(2)]
    threads += [threading.Thread(target=ask, args=(f"seed8",), kwargs={"seed": 8})]
    threads += [threading.Thread(target=ask, args=(f"other-{i}",)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = {name: r.choices[0].model_extra["token_ids"] for name, r in results.items()}
    assert ids["seed7-0"] == ids["seed7-1"] and len(ids["seed7-0"]) == 24
    assert ids["seed8"] != ids["seed7-0"]
    assert len({tuple(ids[f"other-{i}"]) for i in range(5)}) > 1  # unseeded rows draw from the step's key
    alone = chat(client, max_tokens=24, temperature=1.0, logit_bias={str(EOS): -100}, seed=7)  # a batch of one
    assert alone.choices[0].model_extra["token_ids"] == ids["seed7-0"]
    two = chat(client, max_tokens=24, temperature=1.0, logit_bias={str(EOS): -100}, seed=7, n=2)
    assert two.choices[0].model_extra["token_ids"] == ids["seed7-0"]  # choice i draws from stream i
    assert two.choices[1].model_extra["token_ids"] != ids["seed7-0"]


def test_logit_bias_steers_every_token(served):
    server, client, _ = served
    x = server.chat.encode("x")[0]
    response = chat(client, max_tokens=12, temperature=1.0, logit_bias={str(x): 100}, logprobs=True)
    choice = response.choices[0]
    assert choice.model_extra["token_ids"] == [x] * 12 and choice.message.content == "x" * 12
    assert all(-1e-3 < e.logprob <= 0 for e in choice.logprobs.content)  # its logprob under the biased distribution
    assert choice.model_extra["sampling_modified"] == ["logit_bias"]
    assert all(e.model_extra["sampling_modified"] == ["logit_bias"] for e in choice.logprobs.content)


def test_a_tiny_top_p_keeps_only_the_most_likely_token(served):
    server, client, _ = served
    nucleus = chat(client, max_tokens=10, temperature=1.0, top_p=1e-6, logit_bias={str(EOS): -100}, n=3)
    greedy = chat(client, max_tokens=10, temperature=0.0, logit_bias={str(EOS): -100})
    expected = greedy.choices[0].model_extra["token_ids"]
    for choice in nucleus.choices:
        assert choice.model_extra["token_ids"] == expected
        assert choice.model_extra["token_logprobs"] == [0.0] * 10  # the renormalised nucleus has one token
        assert choice.model_extra["sampling_modified"] == ["top_p", "logit_bias"]
    wide = chat(client, max_tokens=10, temperature=1.0, top_p=0.999, logit_bias={str(EOS): -100}, seed=3)
    assert wide.choices[0].model_extra["token_logprobs"] != [0.0] * 10


def test_penalties_follow_openais_formula(served):
    server, client, _ = served
    presence, frequency, temperature = 1.5, 0.7, 0.9
    response = chat(client, max_tokens=24, temperature=temperature, presence_penalty=presence, logprobs=True,
                    frequency_penalty=frequency, logit_bias={str(EOS): -100}, seed=5)
    choice = response.choices[0]
    tokens, recorded = choice.model_extra["token_ids"], choice.model_extra["token_logprobs"]
    logits = step_logits(server, choice.model_extra["prompt_token_ids"], tokens)
    expected, plain = [], []
    for t, row in enumerate(logits):
        counts = np.bincount(tokens[:t], minlength=row.shape[0])[: row.shape[0]].astype(np.float32)
        row = row.copy()
        row[EOS] -= 100
        plain.append(log_softmax(row / temperature)[tokens[t]])
        row = row - counts * frequency - (counts > 0) * presence  # mu[j] - c[j]*a_freq - (c[j]>0)*a_pres
        expected.append(log_softmax(row / temperature)[tokens[t]])
    np.testing.assert_allclose(recorded, expected, atol=2e-3)
    assert len(set(tokens)) < len(tokens) and np.abs(np.array(plain) - expected).max() > 0.1  # penalties mattered
    assert choice.model_extra["sampling_modified"] == ["logit_bias", "presence_penalty", "frequency_penalty"]


def test_a_forced_tool_call_is_prompt_tokens_the_model_continues(served):
    server, client, _ = served
    messages = [{"role": "user", "content": "2+2?"}]
    opening = call_opening(server.tokenizer, server.tool_parser.start, "add")
    assert opening == '<tool_call>\n{"name": "add", "arguments": {'
    for tool_choice in ({"type": "function", "function": {"name": "add"}}, "required"):
        tools = TOOLS if tool_choice != "required" else TOOLS[:1]  # required with one tool: that one
        response = chat(client, messages, tools=tools, tool_choice=tool_choice, temperature=0.0, max_tokens=24)
        choice = response.choices[0]
        sampled = choice.model_extra["token_ids"]
        assert choice.model_extra["prompt_token_ids"] == server.prompt_ids(messages, tools) + server.chat.encode(opening)
        reply = server.decode(server.chat.encode(opening) + [t for t in sampled if t != EOS])
        parsed = server.tool_parser.parse(reply, tools)
        # The message is the opening + the sampled continuation, read as a call where it is one.
        if parsed.tool_calls:
            assert [c.function.name for c in choice.message.tool_calls] == ["add"]
            assert choice.finish_reason == "tool_calls"
        else:  # the tiny model writes a digit and ends its turn: the broken call stays text
            assert choice.message.tool_calls is None and choice.message.content == reply
            assert reply.startswith(opening) and len(reply) > len(opening)
    several = chat(client, messages, tools=TOOLS, tool_choice="required", temperature=0.0, max_tokens=4)
    forced = server.decode(several.choices[0].model_extra["prompt_token_ids"])
    assert forced.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')  # the model names the tool


def test_include_usage_ends_the_stream_with_a_usage_chunk(served):
    server, client, _ = served
    chunks = list(chat(client, max_tokens=8, n=2, stream=True, stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    ids = [t for c in chunks[:-1] for choice in c.choices for t in choice.model_extra.get("token_ids", [])]
    usage = chunks[-1].usage
    assert usage.completion_tokens == len(ids) and usage.prompt_tokens == len(server.prompt_ids(STORY))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    plain = list(chat(client, max_tokens=4, stream=True))
    assert all(c.choices for c in plain) and all(c.usage is None for c in plain)


def test_streamed_text_stops_like_the_whole_reply(served):
    server, client, _ = served
    whole = chat(client, max_tokens=20, temperature=0.0, logit_bias={str(EOS): -100})
    text = whole.choices[0].message.content
    stop = text[5:7]
    stopped = chat(client, max_tokens=20, temperature=0.0, logit_bias={str(EOS): -100}, stop=[stop])
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(
        client, max_tokens=20, temperature=0.0, logit_bias={str(EOS): -100}, stop=[stop], stream=True))
    assert stopped.choices[0].message.content == text[: text.index(stop)] == streamed


def test_legacy_completion_logprobs(served):
    server, client, _ = served
    response = client.completions.create(model="tiny", prompt="2+2=", max_tokens=8, logprobs=3, temperature=1.0,
                                         logit_bias={str(EOS): -100})
    choice = response.choices[0]
    ids, recorded = choice.model_extra["token_ids"], choice.model_extra["token_logprobs"]
    legacy = choice.logprobs
    assert legacy.tokens == [server.token_text(t) for t in ids] and legacy.token_logprobs == recorded
    assert legacy.text_offset == list(np.cumsum([0] + [len(server.token_text(t)) for t in ids[:-1]]))
    for token, logprob, top in zip(legacy.tokens, legacy.token_logprobs, legacy.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == logprob  # the 3 most likely, and the sampled token
        best = sorted(top.values(), reverse=True)[:3]
        assert best[0] >= logprob and np.logaddexp.reduce(best) <= 1e-5
    zero = client.completions.create(model="tiny", prompt="2+2=", max_tokens=4, logprobs=0)
    assert all(list(top) == [token] for token, top in zip(zero.choices[0].logprobs.tokens,
                                                           zero.choices[0].logprobs.top_logprobs))


def test_chat_top_logprobs_are_the_most_likely_tokens_of_the_distribution(served):
    server, client, _ = served
    response = chat(client, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=3, logit_bias={str(EOS): -100})
    choice = response.choices[0]
    logits = step_logits(server, choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"])
    logits[:, EOS] -= 100
    for entry, row in zip(choice.logprobs.content, log_softmax(logits)):
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is the most likely
        np.testing.assert_allclose([t.logprob for t in entry.top_logprobs], np.sort(row)[::-1][:3], atol=2e-3)


def test_a_streamed_choice_assembled_by_art_is_a_trainable_choice(served):
    art = pytest.importorskip("art")
    from art.openai import consume_chat_completion_stream

    from artmlx.art import TrajectoryRefused, trajectory_episode
    from artmlx.rollout.choices import choice_tokens

    server, _, base_url = served
    ask = dict(model="tiny", messages=STORY, max_tokens=16, temperature=1.0, seed=11, logprobs=True,
               extra_body={"return_tokens_as_token_ids": True})

    async def both(**extra):  # a client per event loop
        client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
        request = {**ask, **extra}
        stream = await client.chat.completions.create(stream=True, **request)
        return await consume_chat_completion_stream(stream), await client.chat.completions.create(**request)

    streamed, whole = asyncio.run(both())
    choice = streamed.choices[0]
    tokens, logprobs = choice_tokens(choice, "streamed")
    assert tokens == whole.choices[0].model_extra["token_ids"]
    np.testing.assert_allclose(logprobs, whole.choices[0].model_extra["token_logprobs"], atol=1e-6)
    if Version(version("openpipe-art")) >= Version("0.5.23"):  # it keeps vLLM's token fields
        assert choice.model_extra["token_ids"] == tokens
        assert choice.model_extra["prompt_token_ids"] == server.prompt_ids(STORY)
    trajectory = art.Trajectory(messages_and_choices=[*STORY, choice], reward=1.0)
    episode = trajectory_episode(trajectory, server.chat, 1.0, server.model.args.vocab_size)
    assert episode.tokens[-len(tokens):] == tokens
    # Sampled at another temperature than the learner's: refused, streamed (the mark survives on the logprob
    # entries, where ART's stream assembler keeps it) or not.
    streamed, whole = asyncio.run(both(temperature=0.7))
    for choice in (streamed.choices[0], whole.choices[0]):
        with pytest.raises(TrajectoryRefused, match="temperature 0.7"):
            trajectory_episode(art.Trajectory(messages_and_choices=[*STORY, choice], reward=1.0), server.chat, 1.0,
                               server.model.args.vocab_size)
    # A choice drawn with top_p is refused for training, streamed (the mark is on its logprob entries) or not.
    streamed, whole = asyncio.run(both(top_p=0.9))
    for choice in (streamed.choices[0], whole.choices[0]):
        with pytest.raises(TrajectoryRefused, match="top_p"):
            trajectory_episode(art.Trajectory(messages_and_choices=[*STORY, choice], reward=1.0), server.chat, 1.0,
                               server.model.args.vocab_size)


def test_serve_has_a_max_tokens_flag():
    from click.testing import CliRunner

    from artmlx.cli import cli

    assert "--max-tokens" in CliRunner().invoke(cli, ["serve", "--help"]).output


def test_the_refusal_body_is_openais(served):
    import urllib.request

    _, _, base_url = served
    request = urllib.request.Request(f"{base_url}/chat/completions", method="POST",
                                     data=json.dumps({"model": "tiny", "messages": STORY, "best_of": 2}).encode(),
                                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=30)
    body = json.loads(error.value.read())["error"]
    assert error.value.code == 400 and body["param"] == "best_of" and body["type"] == "invalid_request_error"
