"""What a chat or completions request asks for: every field is implemented, or refused by name.

Each route accepts exactly its fields (`CHAT_FIELDS`, `COMPLETION_FIELDS`); any other key is a 400
whose `param` names it, with the reason for those in `REFUSED`. A field set to null counts as absent.
`FIELD_NOTES` says what each accepted field does and whether a choice that uses it can be trained (the
learner recomputes logprobs under temperature only); `BOUNDS` holds the numeric fields' default and
range, which `parse_sampling` checks. The documentation's `reference/serve.md` is generated from
these tables.

`nvext.extra_fields: ["engine_data"]` asks NVIDIA Dynamo to return its engine's token data (prompt
and completion ids, logprobs) in a response-level `nvext`. artmlx returns the same data in vLLM's
fields (`prompt_token_ids`, each choice's `token_ids` and logprobs), which ART reads first, and sends
no `nvext`; any other `nvext` content is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.responses import JSONResponse

from ..engine.sampling import Options
from .tools import ToolError, call_opening, check_tool_calls, check_tools

COMMON_FIELDS = {"model", "max_tokens", "temperature", "n", "stop", "stream", "stream_options", "logprobs", "user",
                 "seed", "top_p", "logit_bias", "presence_penalty", "frequency_penalty", "return_token_ids",
                 "return_tokens_as_token_ids", "nvext"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                               "parallel_tool_calls", "response_format", "chat_template_kwargs"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt"}
REFUSED = {
    "functions": "'functions' is the deprecated form: send 'tools'",
    "function_call": "'function_call' is the deprecated form: send 'tool_choice'",
    "echo": "'echo' is not supported: the response carries prompt_token_ids; prepend the prompt yourself",
    "suffix": "'suffix' is not supported (no fill-in-the-middle)",
    "best_of": "'best_of' is not supported: ask for n choices and pick",
}
NVEXT_EXTRA_FIELDS = {"engine_data"}
# field -> (what artmlx serve does with it, whether a choice that uses it can be trained)
FIELD_NOTES = {
    "model": ("`NAME` (the newest adapter) or `NAME@STEP`; under `MLXBackend` also the base model's name (LoRA "
              "off)", "yes"),
    "messages": ("chat messages (system, user, assistant, tool); text content parts only", "yes"),
    "prompt": ("a string or a list of token ids", "yes"),
    "max_tokens": ("up to the server's `--max-tokens` (also the default); above it, a 400 that says to raise it",
                   "yes"),
    "max_completion_tokens": ("as `max_tokens`", "yes"),
    "temperature": ("0 is greedy", "at the learner's temperature"),
    "n": ("choices per request; identical prompts are prefilled once", "yes"),
    "stop": ("a string or at most 4 non-empty strings", "yes"),
    "stream": ("server-sent events, a chunk per token per choice", "yes"),
    "stream_options": ("`include_usage` only: a last chunk with the usage and no choices", "yes"),
    "logprobs": ("chat: true/false, entries in `logprobs.content`; completions: 0-5 top tokens in OpenAI's "
                 "legacy object", "yes"),
    "top_logprobs": ("chat: the most likely tokens of the same distribution; needs `logprobs: true`", "yes"),
    "user": ("accepted, not used", "yes"),
    "seed": ("each choice draws from keys of its own per token, whatever else is batched", "yes"),
    "top_p": ("applied per row in the batched forward", "no"),
    "logit_bias": ("token ids (checked against the vocabulary) to -100..100", "no"),
    "presence_penalty": ("OpenAI's formula", "no"),
    "frequency_penalty": ("OpenAI's formula", "no"),
    "tools": ("rendered by the chat template; calls parsed into `message.tool_calls`", "yes"),
    "tool_choice": ("`auto`, `none`, `required` or a named function (a forced call is prompted, not "
                    "constrained)", "yes"),
    "parallel_tool_calls": ("false keeps the first call", "yes"),
    "response_format": ("`text`; `json_object` and `json_schema` are refused: no constrained decoding", "-"),
    "return_token_ids": ("vLLM's: ids are returned unless it is false", "yes"),
    "return_tokens_as_token_ids": ("vLLM's: logprob entries named `token_id:N`", "yes"),
    "chat_template_kwargs": ("vLLM's: variables passed to the chat template (not its own arguments)", "yes"),
    "nvext": ('Dynamo\'s `{"extra_fields": ["engine_data"]}` only: the token data is in vLLM\'s fields, no `nvext` '
              "comes back", "yes"),
}
# field -> (default, low, high); ints where the field takes whole numbers. `logprobs` here is /v1/completions'.
BOUNDS = {
    "temperature": (1.0, 0.0, 2.0),
    "top_p": (1.0, 0.0, 1.0),
    "presence_penalty": (0.0, -2.0, 2.0),
    "frequency_penalty": (0.0, -2.0, 2.0),
    "n": (1, 1, 64),
    "top_logprobs": (0, 0, 20),
    "logprobs": (0, 0, 5),
}
# apply_chat_template's own arguments: chat_template_kwargs may not set them.
TEMPLATE_ARGUMENTS = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                      "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                      "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": None}}, status_code=self.status)


@dataclass
class Sampling:
    """One request's generation settings, checked."""

    max_tokens: int
    temperature: float
    n: int
    stop: list[str]
    stream: bool
    options: Options
    """The engine's sampling options (each choice gets its own seed stream)."""
    logprobs: bool = False
    """Chat: logprob entries in `logprobs.content`."""
    legacy_logprobs: int | None = None
    """Completions: OpenAI's legacy logprobs object with this many top tokens (0-5); None: no object."""
    token_ids_as_tokens: bool = False
    """vLLM's return_tokens_as_token_ids: logprob entries name tokens as token_id:N."""
    return_token_ids: bool = True
    """vLLM's return_token_ids; artmlx returns ids unless it is false."""
    include_usage: bool = False
    tools: list | None = None
    parse_tools: bool = False
    forced_ids: list[int] = field(default_factory=list)
    """A forced tool call's opening: prompt-side tokens the reply continues from (not sampled)."""
    forced_text: str = ""
    parallel_tool_calls: bool = True
    template_kwargs: dict = field(default_factory=dict)
    version: int | None = None
    """The adapter version the model name asks for (None: the newest)."""
    conversation: tuple | None = None
    """(messages, tools, template variables) of a chat request: what its replies answer (Conversations)."""


def check_fields(body: dict, chat: bool) -> dict:
    """The body without null fields; a 400 naming the first field this route does not take."""
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for key in body:
        if key in allowed:
            continue
        if key in REFUSED:
            raise ApiError(400, REFUSED[key], key)
        route = "/v1/chat/completions" if chat else "/v1/completions"
        raise ApiError(400, f"'{key}' is not supported by artmlx serve's {route}; it takes {sorted(allowed)}", key)
    return {key: value for key, value in body.items() if value is not None}


def _number(body: dict, name: str, default, low, high, kind=float):
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ApiError(400, f"'{name}' must be a {'whole ' if kind is int else ''}number", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low} and {high}, got {value}", name)
    return kind(value)


def _bounded(body: dict, name: str):
    default, low, high = BOUNDS[name]
    return _number(body, name, default, low, high, int if isinstance(default, int) else float)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", name)
    return value


def _logit_bias(body: dict, vocab: int) -> dict[int, float]:
    bias = body.get("logit_bias", {})
    if not isinstance(bias, dict):
        raise ApiError(400, "'logit_bias' must map token ids to numbers from -100 to 100", "logit_bias")
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise ApiError(400, f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab:
            raise ApiError(400, f"logit_bias token id {token} is outside the vocabulary [0, {vocab})", "logit_bias")
        out[token] = _number({"logit_bias": value}, "logit_bias", 0, -100, 100)
    return out


def _max_tokens(body: dict, limit: int) -> int:
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    value = _number(body, name, limit, 1, 1 << 62, int)
    if value > limit:
        raise ApiError(400, f"'{name}' is {value}, more than this server's limit of {limit}; start artmlx serve "
                            f"with a larger --max-tokens", name)
    return value


def _stream_options(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):
        raise ApiError(400, "'stream_options' is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError(400, "'stream_options' takes only include_usage (true or false)", "stream_options")
    return _flag(options, "include_usage", False) if "include_usage" in options else False


def _nvext(body: dict) -> None:
    nvext = body.get("nvext")
    if nvext is None:
        return
    fields = nvext.get("extra_fields", []) if isinstance(nvext, dict) and set(nvext) <= {"extra_fields"} else None
    if not isinstance(fields, list) or not set(fields) <= NVEXT_EXTRA_FIELDS:
        raise ApiError(400, f"'nvext' is accepted only as {{'extra_fields': {sorted(NVEXT_EXTRA_FIELDS)}}} (Dynamo's "
                            "engine_data: artmlx returns token ids and logprobs in vLLM's fields instead)", "nvext")


def _response_format(body: dict) -> None:
    kind = body.get("response_format", {"type": "text"})
    kind = kind.get("type") if isinstance(kind, dict) else None
    if kind == "text":
        return
    if kind in ("json_object", "json_schema"):
        raise ApiError(400, f"response_format {kind!r}: JSON mode is not supported (artmlx serve does not constrain "
                            "decoding); ask for JSON in the prompt and parse the text", "response_format")
    raise ApiError(400, "'response_format' must be {'type': 'text'}", "response_format")


def _template_kwargs(body: dict) -> dict:
    kwargs = body.get("chat_template_kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ApiError(400, "'chat_template_kwargs' must be an object of template variables", "chat_template_kwargs")
    taken = sorted(set(kwargs) & TEMPLATE_ARGUMENTS)
    if taken:
        raise ApiError(400, f"chat_template_kwargs may not set {taken}: those are the request's own fields or the "
                            "server's", "chat_template_kwargs")
    return kwargs


def parse_sampling(body: dict, chat: bool, max_tokens: int, vocab: int) -> Sampling:
    """`body` as `check_fields` returned it; the route's sampling fields checked."""
    stop = body.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    seed = body.get("seed")
    if seed is not None:
        seed = _number(body, "seed", 0, -(1 << 63), (1 << 63) - 1, int)
    if not isinstance(body.get("user", ""), str):
        raise ApiError(400, "'user' must be a string", "user")
    _nvext(body)
    logprobs, legacy, top = False, None, 0
    if chat:
        logprobs = _flag(body, "logprobs", False)
        top = _bounded(body, "top_logprobs")
        if top and not logprobs:
            raise ApiError(400, "'top_logprobs' needs logprobs: true", "top_logprobs")
        _response_format(body)
    elif "logprobs" in body:
        if isinstance(body["logprobs"], bool):
            raise ApiError(400, "'logprobs' on /v1/completions is the number of top tokens to return (0 to 5)",
                           "logprobs")
        legacy = top = _bounded(body, "logprobs")
    options = Options(top_p=_bounded(body, "top_p"), seed=seed, logit_bias=_logit_bias(body, vocab),
                      presence_penalty=_bounded(body, "presence_penalty"),
                      frequency_penalty=_bounded(body, "frequency_penalty"), top_logprobs=top)
    return Sampling(max_tokens=_max_tokens(body, max_tokens), temperature=_bounded(body, "temperature"),
                    n=_bounded(body, "n"), stop=stop, stream=_flag(body, "stream", False),
                    options=options, logprobs=logprobs, legacy_logprobs=legacy,
                    token_ids_as_tokens=_flag(body, "return_tokens_as_token_ids", False),
                    return_token_ids=_flag(body, "return_token_ids", True), include_usage=_stream_options(body),
                    parallel_tool_calls=_flag(body, "parallel_tool_calls", True),
                    template_kwargs=_template_kwargs(body) if chat else {})


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise ApiError(400, f"messages[{index}] needs a role of system, user, assistant or tool", "messages")
        content = message.get("content") or ""
        if isinstance(content, list):  # the content-parts form: text parts only
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ApiError(400, f"messages[{index}]: a content part of type {kind!r}: only text parts are "
                                   "supported (image, audio and file inputs are not: artmlx serves a model's text "
                                   "tower, also for multimodal checkpoints)", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{index}].content must be text", "messages")
        kept = {"role": message["role"], "content": content}
        try:
            if message["role"] == "assistant" and message.get("tool_calls"):
                kept["tool_calls"] = check_tool_calls(message["tool_calls"], index)
        except ToolError as error:
            raise ApiError(400, str(error), "messages") from None
        for name in ("tool_call_id", "name"):
            if message["role"] == "tool" and isinstance(message.get(name), str):
                kept[name] = message[name]
        out.append(kept)
    return out


def parse_tools(body: dict, sampling: Sampling, server) -> None:
    """`tools` and `tool_choice` into `sampling`; a forced call becomes the opening the reply continues from."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return
    parser = server.tool_parser
    if not parser.available:
        raise ApiError(400, f"model {server.name!r} has no tool calling in its chat template", "tools")
    try:
        sampling.tools = check_tools(tools)
    except ToolError as error:
        raise ApiError(400, str(error), "tools") from None
    sampling.parse_tools = choice != "none"
    if choice in (None, "auto", "none"):
        return
    names = [tool["function"]["name"] for tool in tools]
    if choice == "required":
        name = names[0] if len(set(names)) == 1 else None  # several: the model names one
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and isinstance(choice["function"].get("name"), str)):
        name = choice["function"]["name"]
        if name not in names:
            raise ApiError(400, f"tool_choice names {name!r}, which is not among the tools {names}", "tool_choice")
    else:
        raise ApiError(400, "'tool_choice' must be 'auto', 'none', 'required' or "
                            "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
    opening = call_opening(server.tokenizer, parser.start, name)
    if opening is None:
        raise ApiError(400, f"model {server.name!r}: its chat template does not write a call's name before its "
                            "arguments, so artmlx cannot force a call; use tool_choice 'auto'", "tool_choice")
    sampling.forced_ids = server.chat.encode(opening)
    sampling.forced_text = server.decode(sampling.forced_ids)
