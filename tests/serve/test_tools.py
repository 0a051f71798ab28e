"""Tool calls: parsing Hermes/Qwen-style calls out of reply text, and tools through the chat API."""

import json

import pytest

from artmlx.chat import ChatFormat
from artmlx.model.policy import load_base
from artmlx.serve.tools import ToolCallParser

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_base("tiny")[1]


def test_the_tiny_template_calls_tools_the_hermes_way_and_mlx_lm_finds_its_parser(tokenizer):
    chat = ChatFormat(tokenizer)
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "4"}]
    text = tokenizer.decode(chat.prompt_ids(messages, TOOLS))
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "</tools>" in text
    # arguments given as JSON text are rendered as the object (as vLLM does), not quoted twice
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    # without tools the rendering is the plain ChatML the runs were trained on
    assert tokenizer.decode(chat.prompt_ids([{"role": "user", "content": "hi"}])) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ToolCallParser(tokenizer).available


def test_calls_are_parsed_and_unreadable_ones_stay_text(tokenizer):
    parser = ToolCallParser(tokenizer)
    reply = parser.parse('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
                         '<tool_call>\n{"name": "add", "arguments": {"a": 5}}\n</tool_call>', TOOLS)
    assert reply.content == "Let me add."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls] == \
        [("add", {"a": 1}), ("add", {"a": 5})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in reply.tool_calls)
    broken = 'x <tool_call>\n{"name": "add", "arguments": \n</tool_call>'
    assert parser.parse(broken, TOOLS).tool_calls == [] and parser.parse(broken, TOOLS).content == broken
    cut = 'x <tool_call>\n{"name": "add"'
    assert parser.parse(cut, TOOLS).content == cut
    assert parser.parse("no call here", TOOLS).content == "no call here"


def test_streaming_holds_back_what_may_start_a_call(tokenizer):
    parser = ToolCallParser(tokenizer)
    assert parser.visible_prefix("Sure <tool") == "Sure "
    assert parser.visible_prefix("Sure <tool_call>\n{") == "Sure "
    assert parser.visible_prefix("a < b") == "a < b"
