"""Tool calling over the chat API: validating `tools` and tool messages, and parsing calls out of text.

The prompt side is the chat template's (`ChatFormat.prompt_ids(messages, tools)`). The reply side:
a model whose template calls tools writes each call between markers, Hermes / Qwen style
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; mlx-lm infers the markers and a parser
from the template (`TokenizerWrapper.tool_call_start/end/tool_parser`, which also covers Qwen3-coder's
XML form and others), and this module turns the text between them into OpenAI `tool_calls`.

A call the parser cannot read, or one cut off before its end marker, stays in the content as the
text the model wrote (vLLM's Hermes parser does the same), so the agent sees it and a reward can
punish it. The sampled tokens are never changed: parsing only decides what the message shows.

Forcing a call (`tool_choice` "required" or a named function): `call_opening` is the text the chat
template writes before a call's arguments (Hermes: `<tool_call>\n{"name": "X", "arguments": {`),
found by rendering a call with two different arguments and keeping what they share. The server
puts its tokens at the end of the prompt, so the model continues a call it cannot avoid; they are
prompt tokens, not sampled ones. This prompts the call; it does not constrain the arguments (no
grammar), so a reply that then breaks the call's syntax stays text, as above.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field


class ToolError(ValueError):
    """A request's tools or tool messages are malformed (the API answers 400 with this text)."""


def check_tools(tools) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise ToolError("'tools' must be a non-empty list")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str) and function["name"]):
            raise ToolError(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
    return tools


def check_tool_calls(calls, index: int) -> list[dict]:
    """An assistant message's `tool_calls` (OpenAI form), checked; arguments may be JSON text or an object."""
    if not isinstance(calls, list):
        raise ToolError(f"messages[{index}].tool_calls must be a list")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments", "{}"), (str, dict))):
            raise ToolError(f"messages[{index}].tool_calls: each needs function.name and function.arguments")
    return calls


_NAME = "\u2063ARTMLX-NAME\u2063"


def call_opening(tokenizer, start: str, name: str | None) -> str | None:
    """What a reply that calls `name` starts with, as the template writes calls: from the start marker to
    where the arguments begin (name None: to where the name begins). None if the template's calls do not
    take that shape (the name before the arguments)."""
    def render(function: str, arguments: dict) -> str:
        call = {"id": "call_0", "type": "function", "function": {"name": function, "arguments": arguments}}
        return tokenizer.apply_chat_template([{"role": "user", "content": "?"},
                                              {"role": "assistant", "content": "", "tool_calls": [call]}],
                                             tokenize=False)

    empty, some = render(name or _NAME, {}), render(name or _NAME, {"a": 0})
    at = empty.find(name or _NAME)
    begin = empty.rfind(start, 0, at)
    if at < 0 or begin < 0:
        return None
    if name is None:
        return empty[begin:at]
    shared = next((i for i, (a, b) in enumerate(zip(empty, some)) if a != b), min(len(empty), len(some)))
    return empty[begin:shared] if shared > at + len(name) else None


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


class ToolCallParser:
    """Finds tool calls in a reply's text with the markers and parser mlx-lm inferred for the tokenizer."""

    def __init__(self, tokenizer):
        self.start = getattr(tokenizer, "tool_call_start", None)
        self.end = getattr(tokenizer, "tool_call_end", None)
        self.parse_one = getattr(tokenizer, "tool_parser", None)

    @property
    def available(self) -> bool:
        return bool(self.start and self.end and self.parse_one)

    def parse(self, text: str, tools: list[dict] | None, parallel: bool = True) -> Reply:
        """The calls in `text`; `parallel` False keeps the first call only (the text of later calls, and
        anything after them, is dropped from the message; the sampled tokens keep them)."""
        if not self.available or self.start not in text:
            return Reply(text)
        pieces, calls, rest = [], [], text
        while (at := rest.find(self.start)) >= 0:
            close = rest.find(self.end, at + len(self.start))
            if close < 0:  # cut off before its end marker: text
                break
            pieces.append(rest[:at])
            found = self._calls(rest[at + len(self.start): close], tools)
            if found is None:
                pieces.append(rest[at: close + len(self.end)])
            calls += found or []
            rest = rest[close + len(self.end):]
            if calls and not parallel:
                calls, rest = calls[:1], ""
                break
        pieces.append(rest)
        content = "".join(pieces)
        if not calls:
            return Reply(text)
        return Reply(content.strip() or None, calls)

    def _calls(self, body: str, tools) -> list[dict] | None:
        try:
            parsed = self.parse_one(body, tools)
        except Exception:  # the model's text through mlx-lm's parser: anything unreadable stays text
            return None
        calls = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
                return None
            arguments = call.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                          "function": {"name": call["name"], "arguments": arguments}})
        return calls

    def visible_prefix(self, text: str) -> str:
        """For streaming: the text that cannot belong to a tool call (before any start marker, and not
        ending with the beginning of one)."""
        if not self.available:
            return text
        at = text.find(self.start)
        if at >= 0:
            return text[:at]
        for keep in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-keep:]):
                return text[:-keep]
        return text
