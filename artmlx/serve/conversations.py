"""Token-exact prompts for clients that resend a conversation as text.

An agent appends each reply to its messages as text (`{"role": "assistant", "content": ...}`) and
sends the conversation again. Rendering that text through the chat template and tokenizer again is
not the inverse of sampling: a sampled sequence that is not the tokenizer's canonical encoding of
its text, a reply cut at `max_tokens` (no end-of-turn sampled), whitespace or broken UTF-8 at a cut,
tool-call JSON re-serialised, or reasoning the template drops from earlier turns all give other
ids than the model saw, and a trainer cannot line the turns up (vLLM's users pass token ids
instead; ART re-tokenises and trains on tokens the model never sampled).

So the server remembers what it produced: for every choice, the conversation it answered (the
messages, tools and template variables), the reply as the client will resend it, and the exact ids
(the prompt the model was fed, then the sampled tokens). A request whose messages are a remembered
conversation followed by its remembered reply and then new messages gets those exact ids, then the
template's own ids closing that reply (as the template closes it: a reply cut without its
end-of-turn token gets the whole closing) and rendering the new messages and the next generation
prompt (`ChatFormat.continuation_ids`). The last assistant message that matches is used; messages
before it are matched with it, through the ids it was given (themselves built the same way). A reply
the client edited matches nothing and is rendered as text, as is everything after a conversation
this server never produced. Matching is by the text of every message (tool-call ids aside; tool
arguments compared as JSON), so two conversations that read alike share their ids.

Bounded: the `capacity` most recently produced replies are remembered (least recently used first
out); each costs its ids, a few kilobytes.
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading

from ..chat import ChatFormat


def _arguments(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _canonical(message: dict) -> dict:
    """What of a message the template renders: role, text, the calls' names and arguments, tool ids."""
    out = {"role": message.get("role"), "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [[(call.get("function") or {}).get("name"), _arguments((call.get("function") or {})
                                                                                 .get("arguments"))]
                             for call in calls]
    for name in ("name", "tool_call_id"):
        if message.get(name):
            out[name] = message[name]
    return out


class Conversations:
    def __init__(self, chat: ChatFormat, capacity: int = 4096):
        self.chat = chat
        self.capacity = capacity
        self._replies: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._lock = threading.Lock()  # remembered from the event loop, read by request handlers
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(messages: list[dict], tools, template_kwargs, reply: dict) -> str:
        payload = [[_canonical(m) for m in messages], tools or None, template_kwargs or None, _canonical(reply)]
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    def remember(self, messages: list[dict], tools, template_kwargs, reply: dict, ids: list[int]) -> None:
        """`reply` (the assistant message as the client will resend it) answered `messages`; `ids` are the
        prompt the model was fed followed by the sampled tokens."""
        key = self._key(messages, tools, template_kwargs, {**reply, "role": "assistant"})
        with self._lock:
            self._replies[key] = list(ids)
            self._replies.move_to_end(key)
            while len(self._replies) > self.capacity:
                self._replies.popitem(last=False)

    def prompt_ids(self, messages: list[dict], tools=None, template_kwargs=None) -> list[int]:
        """The prompt for `messages`: exact ids through the last remembered reply, the template after it."""
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].get("role") != "assistant":
                continue
            key = self._key(messages[:index], tools, template_kwargs, messages[index])
            with self._lock:
                ids = self._replies.get(key)
                if ids is not None:
                    self._replies.move_to_end(key)
            if ids is None:
                continue
            try:
                tail = self.chat.continuation_ids(messages[index + 1:], ids[-1], tools, template_kwargs)
            except ValueError:  # a template that re-renders earlier turns: text it is
                break
            self.hits += 1
            return ids + tail
        if any(m.get("role") == "assistant" for m in messages):
            self.misses += 1
        return self.chat.prompt_ids(messages, tools, template_kwargs)
