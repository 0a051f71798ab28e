"""Token-level chat transcripts: the prompt, then policy replies and environment turns as ids.

A multi-turn episode is built by appending ids and never by re-tokenising decoded text: the
policy's sampled ids are kept exactly, and each environment turn is appended as the ids of the
chat-template text that follows the assistant's reply. That text is found once per tokenizer by
rendering a probe conversation with and without the new messages (the rendered prefix must not
change, which holds for ChatML-style templates such as Qwen's).

`prompt_ids(messages, tools)` is the one place a chat prompt becomes ids: the server builds every
request's prompt with it and the ART trainer rebuilds prompts with it. As vLLM does, an assistant
message's tool-call `arguments` (a JSON string in the OpenAI format) are parsed into an object
before rendering, so templates that write them as JSON (`tojson`) do not quote them twice.
"""

from __future__ import annotations

import json

_MARK = "\u2063ARTMLX-REPLY\u2063"
_PROBE = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]


class ChatFormat:
    """Turns chat messages into token ids for a tokenizer with a chat template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
        rendered = self._render(_PROBE, add_generation_prompt=False)
        if _MARK not in rendered:
            raise ValueError("the chat template drops assistant content; artmlx needs it to build transcripts")
        self._probe_text = rendered
        self._reply_tail = rendered[rendered.rindex(_MARK) + len(_MARK) :]
        self._eos_text = {i: tokenizer.decode([i]) for i in self.eos_token_ids}
        self._probes: dict[str, tuple[str, str]] = {}  # (tools, template variables) -> probe text, reply tail

    def _render(self, messages: list[dict], add_generation_prompt: bool, tools: list | None = None,
                template_kwargs: dict | None = None) -> str:
        extra = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra, **(template_kwargs or {})
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict], tools: list | None = None,
                   template_kwargs: dict | None = None) -> list[int]:
        """Ids of the messages (and the tools' descriptions, if any) followed by the assistant generation
        prompt; `template_kwargs` are extra variables for the template (vLLM's chat_template_kwargs, such
        as enable_thinking; a template that does not read one renders as without it)."""
        return self.encode(self._render([_template_message(m) for m in messages], True, tools, template_kwargs))

    def continuation_ids(self, new_messages: list[dict], last_reply_token: int | None, tools: list | None = None,
                         template_kwargs: dict | None = None) -> list[int]:
        """Ids that close the assistant's reply and open the next assistant turn after `new_messages`
        (rendered with the same tools and template variables as the conversation).

        If the reply ended with an end-of-turn token, the part of the template's closing text that
        token already wrote is not repeated; a reply cut off at the token limit gets it all.
        """
        probe_text, reply_tail = self._probe(tools, template_kwargs)
        rendered = self._render(_PROBE + [_template_message(m) for m in new_messages], True, tools, template_kwargs)
        if not rendered.startswith(probe_text):
            raise ValueError(
                "the chat template re-renders earlier turns when a message is added; "
                "artmlx cannot extend such transcripts token by token"
            )
        tail = reply_tail
        eos_text = self._eos_text.get(last_reply_token) if last_reply_token is not None else None
        if eos_text and tail.startswith(eos_text):
            tail = tail[len(eos_text) :]
        return self.encode(tail + rendered[len(probe_text) :])

    def _probe(self, tools: list | None, template_kwargs: dict | None) -> tuple[str, str]:
        """The probe conversation rendered with these tools and variables, and the text after its reply."""
        if not tools and not template_kwargs:
            return self._probe_text, self._reply_tail
        key = json.dumps([tools, template_kwargs], sort_keys=True, default=str)
        if key not in self._probes:
            rendered = self._render(_PROBE, False, tools, template_kwargs)
            if _MARK not in rendered:
                raise ValueError("the chat template drops assistant content with these tools or variables")
            self._probes[key] = (rendered, rendered[rendered.rindex(_MARK) + len(_MARK):])
        return self._probes[key]

    def reply_text(self, reply_ids: list[int]) -> str:
        """The reply as text for the environment, without a trailing end-of-turn token."""
        if reply_ids and reply_ids[-1] in self.eos_token_ids:
            reply_ids = reply_ids[:-1]
        return self.tokenizer.decode(reply_ids)


def _template_message(message: dict) -> dict:
    """The message as chat templates take it: tool-call arguments as objects, not JSON text."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # rendered as the text it is
        parsed.append({**call, "function": function})
    return {**message, "tool_calls": parsed}
