"""The OpenAI-compatible HTTP API over a `ModelServer` (Starlette; run by uvicorn in `artmlx serve`).

Routes: GET /v1/models; POST /v1/chat/completions and /v1/completions (non-streaming and SSE
streaming). Exact tokens: every choice carries `token_ids` (the sampled ids, end-of-turn included),
the response `prompt_token_ids` and `adapter_version`; with `logprobs: true` each token's sampler
logprob comes in the OpenAI shape, and with vLLM's `return_tokens_as_token_ids: true` (what ART's
LocalBackend asks for) each logprob entry's `token` is `token_id:N`. A bad request gets a 4xx with an
OpenAI-style error body and the server keeps serving.

Each choice also carries what a trainer needs to check it: `prompt_token_ids` (the prompt as built
by `ChatFormat.prompt_ids`), `adapter_version` (the adapter it was sampled with: a new adapter swaps
in between decode steps and running requests finish on theirs) and `sampling_temperature`.

Tools (`tools`, `tool_choice` "auto" or "none"): rendered by the chat template, calls parsed from
the reply (`tools.py`) into `message.tool_calls` with `finish_reason` "tool_calls". When streaming
with tools, text that may start a call is held back and the calls come in the last chunk.

Not supported, refused with a 400 that says so: `top_logprobs` > 0, `tool_choice` "required" or a
named function.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .model_server import ModelServer
from .tools import ToolError, check_tool_calls, check_tools


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": None}}, status_code=self.status)


@dataclass
class Sampling:
    max_tokens: int
    temperature: float
    n: int
    stop: list[str]
    logprobs: bool
    token_ids_as_tokens: bool
    stream: bool
    tools: list | None = None
    parse_tools: bool = False
    version: int | None = None  # the adapter version the model name asks for (None: the newest)


def _number(body: dict, name: str, default, low, high, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ApiError(400, f"'{name}' must be a {'whole ' if kind is int else ''}number", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low} and {high}, got {value}", name)
    return kind(value)


def parse_sampling(body: dict, server: ModelServer) -> Sampling:
    limit = server.config.max_tokens
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", limit, 1, limit, int)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    if body.get("functions"):
        raise ApiError(400, "'functions' is the deprecated form: send 'tools'", "functions")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise ApiError(400, "top_logprobs is not supported (the sampled token's logprob is)", "top_logprobs")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise ApiError(400, "'logprobs' must be true or false", "logprobs")
    return Sampling(max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                    n=_number(body, "n", 1, 1, 64, int), stop=stop, logprobs=bool(logprobs),
                    token_ids_as_tokens=bool(body.get("return_tokens_as_token_ids", False)),
                    stream=bool(body.get("stream", False)))


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
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{index}]: only text content parts are supported", "messages")
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


def parse_tools(body: dict, sampling: Sampling, server: ModelServer) -> None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return
    if not server.tool_parser.available:
        raise ApiError(400, f"model {server.name!r} has no tool calling in its chat template", "tools")
    if choice not in (None, "auto", "none"):
        raise ApiError(400, "tool_choice must be 'auto' or 'none' (forcing a call is not supported)", "tool_choice")
    try:
        sampling.tools = check_tools(tools)
    except ToolError as error:
        raise ApiError(400, str(error), "tools") from None
    sampling.parse_tools = choice != "none"


def _version(request) -> int | None:
    """The adapter version a request was sampled with; None for the base model alone."""
    return request.adapter_version if request.adapter_version >= 0 else None


class Api:
    def __init__(self, server: ModelServer, api_key: str = ""):
        self.server, self.api_key = server, api_key

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ])

    def _check(self, request: HttpRequest) -> None:
        if self.api_key and request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", kind="authentication_error")

    async def _body(self, request: HttpRequest) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = body.get("model")
        try:
            self.server.version_of(model)
        except (KeyError, TypeError):
            raise ApiError(404, f"model {model!r} not found; this server has {self.server.model_names}", "model",
                           kind="not_found_error") from None
        return body

    async def models(self, request: HttpRequest):
        try:
            self._check(request)
        except ApiError as error:
            return error.response()
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                         "owned_by": "artmlx"} for name in self.server.model_names]})

    async def chat_completions(self, request: HttpRequest):
        try:
            self._check(request)
            body = await self._body(request)
            messages = parse_messages(body)
            sampling = parse_sampling(body, self.server)
            sampling.version = self.server.version_of(body["model"])
            parse_tools(body, sampling, self.server)
            prompt = self.server.prompt_ids(messages, sampling.tools)
            return await self._generate(body["model"], prompt, sampling, chat=True)
        except ApiError as error:
            return error.response()

    async def completions(self, request: HttpRequest):
        try:
            self._check(request)
            body = await self._body(request)
            sampling = parse_sampling(body, self.server)
            sampling.version = self.server.version_of(body["model"])
            prompt = body.get("prompt")
            if isinstance(prompt, str) and prompt:
                prompt = list(self.server.tokenizer.encode(prompt))
            elif not (isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                                  for t in prompt)):
                raise ApiError(400, "'prompt' must be a non-empty string or list of token ids", "prompt")
            vocab = self.server.model.args.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
            return await self._generate(body["model"], prompt, sampling, chat=False)
        except ApiError as error:
            return error.response()

    def _submit(self, prompt: list[int], sampling: Sampling, on_token=None):
        limit = self.server.config.max_prompt_tokens
        if len(prompt) > limit:
            raise ApiError(400, f"context too long: the prompt has {len(prompt)} tokens, this server takes at most "
                                f"{limit}", "messages", kind="invalid_request_error")
        try:
            return [self.server.submit(prompt, sampling.max_tokens, sampling.temperature, on_token, sampling.version)
                    for _ in range(sampling.n)]
        except ValueError as error:  # the scheduler's own checks
            raise ApiError(400, str(error)) from None

    async def _generate(self, model: str, prompt: list[int], sampling: Sampling, chat: bool):
        if sampling.stream:
            return self._stream(model, prompt, sampling, chat)
        # Each request resolves its own future from the scheduler's thread when it ends: no thread waits
        # per request (a thread pool's few workers would hold back answers from hundreds of agents).
        loop = asyncio.get_running_loop()
        one = Sampling(**{**sampling.__dict__, "n": 1})
        requests, endings = [], []
        for _ in range(sampling.n):
            ended, stop_check = loop.create_future(), self._stopper(sampling)

            def on_token(request, ended=ended, stop_check=stop_check):
                stop_check(request)
                if request.finish_reason and not loop.is_closed():  # closed: the server is shutting down
                    loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))

            requests += self._submit(prompt, one, on_token)
            endings.append(ended)
        await asyncio.gather(*endings)
        failed = [r.error for r in requests if r.error]
        if failed:
            raise ApiError(500, f"generation failed: {failed[0]}", kind="server_error")
        choices = [self._choice(index, r, sampling, chat, prompt) for index, r in enumerate(requests)]
        completion = sum(len(r.tokens) for r in requests)
        return JSONResponse({
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "object": "chat.completion" if chat
            else "text_completion", "created": int(time.time()), "model": model, "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                      "total_tokens": len(prompt) + completion},
            "prompt_token_ids": prompt, "adapter_version": _version(requests[0])})

    def _text(self, tokens: list[int]) -> str:
        if tokens and tokens[-1] in self.server.chat.eos_token_ids:
            tokens = tokens[:-1]
        return self.server.decode(tokens)

    def _stopper(self, sampling: Sampling):
        """An on_token check that ends a request once its text contains a stop string."""
        def check(request):
            if sampling.stop and any(s in self._text(request.tokens) for s in sampling.stop):
                request.finish_reason = "stop"
        return check

    def _logprob_entry(self, token: int, logprob: float, sampling: Sampling) -> dict:
        text = self.server.token_text(token)
        return {"token": f"token_id:{token}" if sampling.token_ids_as_tokens else text, "logprob": logprob,
                "bytes": list(text.encode("utf-8")), "top_logprobs": []}

    def _stopped_text(self, request, sampling: Sampling) -> str:
        text = self._text(request.tokens)
        for stop in sampling.stop:
            if stop in text:
                text = text[: text.index(stop)]
        return text

    def _choice(self, index: int, request, sampling: Sampling, chat: bool, prompt: list[int]) -> dict:
        text = self._stopped_text(request, sampling)
        logprobs = None
        if sampling.logprobs:
            logprobs = {"content": [self._logprob_entry(t, lp, sampling)
                                    for t, lp in zip(request.tokens, request.logprobs)]}
        choice = {"index": index, "finish_reason": request.finish_reason, "logprobs": logprobs,
                  "token_ids": list(request.tokens), "token_logprobs": list(request.logprobs), "prompt_token_ids": prompt,
                  "adapter_version": _version(request), "sampling_temperature": request.temperature}
        if not chat:
            choice["text"] = text
            return choice
        reply = self.server.tool_parser.parse(text, sampling.tools) if sampling.parse_tools else None
        if reply is not None and reply.tool_calls:
            choice["message"] = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
            if request.finish_reason == "stop":
                choice["finish_reason"] = "tool_calls"
        else:
            choice["message"] = {"role": "assistant", "content": text}
        return choice

    def _stream(self, model: str, prompt: list[int], sampling: Sampling, chat: bool) -> StreamingResponse:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stoppers = [self._stopper(sampling) for _ in range(sampling.n)]
        abandoned = [False]
        index_of: dict[int, int] = {}

        def on_token(request):
            stoppers[index_of[id(request)]](request)
            if abandoned[0]:
                request.finish_reason = "abandoned"
            loop.call_soon_threadsafe(queue.put_nowait, (request, len(request.tokens), request.finish_reason))

        requests = []
        for index in range(sampling.n):
            request = self._submit(prompt, Sampling(**{**sampling.__dict__, "n": 1}), on_token)[0]
            index_of[id(request)] = index
            requests.append(request)
        ident, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())

        def chunk(index: int, delta: str | None, finish, logprobs=None, first=False, calls=None) -> str:
            if chat:
                content = {"role": "assistant", "content": ""} if first else ({"content": delta} if delta else {})
                if calls:
                    content["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
                choice = {"index": index, "delta": content, "finish_reason": finish, "logprobs": logprobs}
            else:
                choice = {"index": index, "text": delta or "", "finish_reason": finish, "logprobs": logprobs}
            data = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                    "model": model, "choices": [choice]}
            if requests[index].adapter_version >= 0:  # known once the request is admitted
                data["adapter_version"] = requests[index].adapter_version
            return f"data: {json.dumps(data)}\n\n"

        async def events():
            sent_text = [""] * len(requests)
            open_rows = len(requests)
            try:
                if chat:
                    for index in range(len(requests)):
                        yield chunk(index, None, None, first=True)
                while open_rows:
                    request, count, finish = await queue.get()
                    index = index_of[id(request)]
                    if finish == "error":
                        yield f"data: {json.dumps({'error': {'message': request.error, 'type': 'server_error'}})}\n\n"
                        open_rows -= 1
                        continue
                    text = self._text(request.tokens[:count])
                    calls = None
                    if chat and sampling.parse_tools:  # hold back what may be a tool call until the end
                        if finish:
                            reply = self.server.tool_parser.parse(text, sampling.tools)
                            calls = reply.tool_calls
                            if calls:
                                text = reply.content or ""
                                finish = "tool_calls" if finish == "stop" else finish
                        else:
                            text = self.server.tool_parser.visible_prefix(text)
                    piece = text[len(sent_text[index]):] if text.startswith(sent_text[index]) else ""
                    sent_text[index] = text if piece else sent_text[index]
                    token, logprob = request.tokens[count - 1], request.logprobs[count - 1]
                    logprobs = ({"content": [{**self._logprob_entry(token, logprob, sampling), "token_id": token}]}
                                if sampling.logprobs else None)
                    yield chunk(index, piece, finish, logprobs, calls=calls)
                    if finish:
                        open_rows -= 1
                yield "data: [DONE]\n\n"
            finally:
                abandoned[0] = True  # a client that went away stops its requests at their next token

        return StreamingResponse(events(), media_type="text/event-stream")
