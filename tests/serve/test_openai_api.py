"""`artmlx serve` against the real `openai` client library, over real HTTP on loopback."""

import json
import threading
import urllib.request

import numpy as np
import openai
import pytest

from artmlx.netutil import free_port
from artmlx.serve import run_server
from artmlx.serve.model_server import ModelServer, ServeConfig

KEY = "test-key"


@pytest.fixture(scope="module")
def served():
    server = ModelServer(ServeConfig(model="tiny", max_rows=16, max_prompt_tokens=256, max_tokens=64))
    port = free_port()
    ready = threading.Event()
    http = run_server(server, "127.0.0.1", port, KEY, ready=ready)
    assert ready.wait(30) and http.started
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    yield server, client, port
    http.should_exit = True
    http.thread.join(10)
    server.close()


def test_models_are_listed_as_name_and_name_at_step(served):
    server, client, _ = served
    assert [m.id for m in client.models.list().data] == ["tiny", "tiny@0"]


def test_chat_completion_returns_the_exact_sampled_tokens_and_their_logprobs(served):
    server, client, _ = served
    messages = [{"role": "user", "content": "Play tic-tac-toe: your move?"}]
    response = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0.8,
                                              logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    choice = response.choices[0]
    token_ids = choice.model_extra["token_ids"]
    entries = choice.logprobs.content
    # The logprob entries name every sampled token as token_id:N (as ART's LocalBackend asks vLLM).
    assert [int(e.token.removeprefix("token_id:")) for e in entries] == token_ids
    assert response.model_extra["prompt_token_ids"] == server.prompt_ids(messages)
    # The text is those tokens decoded (an end-of-turn token is not part of it).
    reply = token_ids[:-1] if token_ids[-1] in server.chat.eos_token_ids else token_ids
    assert choice.message.content == server.decode(reply)
    assert choice.finish_reason in ("stop", "length") and response.usage.completion_tokens == len(token_ids)
    # The recorded logprobs are the sampler's: the tempered distribution of the full sequence.
    import mlx.core as mx

    full = response.model_extra["prompt_token_ids"] + token_ids
    logits = server.model(mx.array([full]))[0, len(full) - len(token_ids) - 1: -1].astype(mx.float32) / 0.8
    expected = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    expected = np.array(mx.take_along_axis(expected, mx.array(token_ids)[:, None], axis=-1)[:, 0])
    np.testing.assert_allclose([e.logprob for e in entries], expected, atol=2e-3)


def test_streaming_gives_the_same_kind_of_answer_token_by_token(served):
    server, client, _ = served
    stream = client.chat.completions.create(model="tiny@0", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=10, stream=True, logprobs=True)
    pieces, ids, finish = [], [], None
    for chunk in stream:
        choice = chunk.choices[0]
        pieces.append(choice.delta.content or "")
        if choice.logprobs and choice.logprobs.content:
            ids += [entry.model_extra["token_id"] for entry in choice.logprobs.content]
        finish = choice.finish_reason or finish
    reply = ids[:-1] if ids and ids[-1] in server.chat.eos_token_ids else ids
    assert "".join(pieces) == server.decode(reply) and finish in ("stop", "length") and 1 <= len(ids) <= 10


def test_concurrent_requests_share_decode_steps(served):
    server, client, _ = served
    before_forwards, before_tokens = server.scheduler.decode_forwards, server.scheduler.tokens_sampled
    results = []

    def ask(i):
        results.append(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=16, temperature=1.0))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tokens = server.scheduler.tokens_sampled - before_tokens
    forwards = server.scheduler.decode_forwards - before_forwards
    assert len(results) == 12 and tokens == sum(r.usage.completion_tokens for r in results)
    # one at a time would take one forward per token; how many rows share each step depends on arrival times
    assert forwards < tokens and server.scheduler.peak_rows >= 2, (forwards, tokens)


def test_n_choices_and_stop_strings(served):
    server, client, _ = served
    response = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}],
                                              max_tokens=8, n=3)
    assert [c.index for c in response.choices] == [0, 1, 2]
    first = response.choices[0].message.content
    if len(first) >= 2:
        stopped = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}],
                                                 max_tokens=8, n=1, stop=[first[1]], temperature=0.0)
        assert first[1] not in stopped.choices[0].message.content


def test_bad_requests_get_a_clear_4xx_and_the_server_keeps_serving(served):
    server, client, port = served
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="context too long"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 400}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=9)
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       tool_choice={"type": "function", "function": {"name": "g"}},
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\] must be"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"parameters": {}}}])
    with pytest.raises(openai.BadRequestError, match="function.name and function.arguments"):
        client.chat.completions.create(model="tiny", messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
    bad_json = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=b"{not json",
                                      headers={"Authorization": f"Bearer {KEY}"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(bad_json, timeout=30)
    assert error.value.code == 400 and "not valid JSON" in json.loads(error.value.read())["error"]["message"]
    ok = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "still there?"}],
                                        max_tokens=4)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_completions_take_token_ids_and_return_them(served):
    server, client, _ = served
    response = client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=5, temperature=0.0)
    assert response.model_extra["prompt_token_ids"] == [5, 6, 7, 8]
    assert len(response.choices[0].model_extra["token_ids"]) <= 5


def test_tools_go_into_the_prompt_and_tool_turns_are_accepted(served):
    server, client, _ = served
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "4"}]
    big = openai.OpenAI(base_url=client.base_url, api_key=KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError, match="context too long"):  # the tool block is long in characters
        big.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=4)
    server.config.max_prompt_tokens = server.scheduler.max_prompt_tokens = 1024
    try:
        response = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=6,
                                                  temperature=0.0)
    finally:
        server.config.max_prompt_tokens = server.scheduler.max_prompt_tokens = 256
    choice = response.choices[0]
    assert choice.model_extra["prompt_token_ids"] == server.prompt_ids(messages, tools)
    assert "<tools>" in server.decode(choice.model_extra["prompt_token_ids"])
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None  # the tiny model calls no tool


def test_an_adapter_swapped_in_mid_stream_serves_new_requests_while_the_stream_finishes_on_its_own(served):
    import time

    import mlx.core as mx
    from mlx.utils import tree_flatten

    server, client, _ = served
    scheduler = server.scheduler
    old = {k: np.array(v) for k, v in tree_flatten(server.model.trainable_parameters())}
    new = {k: mx.array(np.random.default_rng(1).normal(size=v.shape).astype(np.float32) * 0.05) for k, v in old.items()}
    messages = [{"role": "user", "content": "Play tic-tac-toe: your move?"}]
    version = scheduler.adapter_version + 1
    # Drive the scheduler deterministically: pause it, let the stream's request arrive, then one step
    # admits it and samples its first token under the old adapter, and only then the new one swaps in.
    hold = threading.Event()
    server.call(hold.wait)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=40, temperature=0.0, stream=True)))
    reader.start()
    deadline = time.time() + 60
    while not scheduler.waiting and time.time() < deadline:
        time.sleep(0.01)
    server.call(lambda: (scheduler.step(), scheduler.set_adapter(version, new)))  # one call: nothing runs between
    hold.set()
    reader.join(60)
    fresh = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0.0)
    # (the opening role chunk goes out before admission and names no version)
    assert {c.model_extra.get("adapter_version") for c in chunks[1:]} == {version - 1}
    assert fresh.choices[0].model_extra["adapter_version"] == version
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def greedy(weights):  # a reply computed from scratch, one full forward per token
        full, out = server.prompt_ids(messages), []
        server.model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=False)
        for _ in range(40):
            out.append(int(mx.argmax(server.model(mx.array([full + out]))[0, -1]).item()))
            if out[-1] in server.chat.eos_token_ids:
                break
        return out

    def references():
        replies = greedy(old), greedy({k: np.array(v) for k, v in new.items()})
        scheduler.loaded_version = -1  # the weights were changed behind the scheduler's back
        scheduler.load_current()
        return replies

    old_reply, new_reply = server.call(references).result(timeout=60)
    assert streamed == server.decode([t for t in old_reply if t not in server.chat.eos_token_ids])
    assert fresh.choices[0].model_extra["token_ids"] == new_reply


def test_a_server_decoding_in_chunks_answers_as_single_steps_do(tmp_path):
    """`--decode-chunk 8`: eight decode steps between host reads. Greedy replies of different lengths, cut by
    max_tokens inside a chunk, streamed or not, and second turns that extend the first through the prefix
    cache, are token for token those of a single-step server (a random Qwen3 folder: its replies run long)."""
    from tests.helpers import family_folder

    folder = str(family_folder(tmp_path, "qwen3"))
    answers, servers = [], []
    try:
        for chunk in (1, 8):
            server = ModelServer(ServeConfig(model=folder, max_rows=16, max_prompt_tokens=256, max_tokens=64,
                                             decode_chunk=chunk))
            port, ready = free_port(), threading.Event()
            http = run_server(server, "127.0.0.1", port, KEY, ready=ready)
            servers.append((server, http))
            assert ready.wait(30) and http.started
            api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
            def conversation(i, max_tokens, out):  # two turns; the conversations run side by side
                messages = [{"role": "user", "content": f"move {i}"}]
                first = api.chat.completions.create(model=folder, messages=messages, max_tokens=max_tokens,
                                                    temperature=0.0)
                messages += [{"role": "assistant", "content": first.choices[0].message.content},
                             {"role": "user", "content": "and now?"}]
                second = api.chat.completions.create(model=folder, messages=messages, max_tokens=9, temperature=0.0)
                out[i] = [first.choices[0].model_extra["token_ids"], second.choices[0].model_extra["token_ids"]]

            turns = {}
            threads = [threading.Thread(target=conversation, args=(i, n, turns)) for i, n in enumerate((3, 11, 20))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            out = [ids for i in range(3) for ids in turns[i]]
            stream = api.chat.completions.create(model=folder, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=13, temperature=0.0, stream=True, logprobs=True)
            out.append([e.model_extra["token_id"] for c in stream if c.choices and c.choices[0].logprobs
                        for e in c.choices[0].logprobs.content])
            answers.append(out)
        single, chunks = answers
        assert single == chunks and [len(ids) for ids in single[:6:2]] == [3, 11, 20] and len(single[-1]) == 13
        chunked = servers[1][0].scheduler
        assert chunked.peak_rows >= 2 and chunked.prefix.hits >= 3  # rows shared chunks; second turns hit
        # rows that ended inside a chunk (fed past their end) are remembered cut at their end
        assert all(kv[0].shape[1] == len(entry.tokens) for entry in chunked.prefix.entries.values() for kv in entry.kv)
    finally:
        for server, http in servers:
            http.should_exit = True
            http.thread.join(10)
            server.close()
