"""The OpenAI-compatible HTTP API over a `ModelServer` (Starlette; run by uvicorn in `artmlx serve`).

Routes: GET /v1/models; POST /v1/chat/completions and /v1/completions (non-streaming and SSE
streaming). Each route takes exactly its fields, each implemented or refused with a 400 whose `param`
names it (`params.py` has the table). A bad request gets a 4xx with an OpenAI-style error body and the
server keeps serving.

Exact tokens: every choice carries `token_ids` (the sampled ids, end-of-turn included) and
`token_logprobs`, and the response and each choice `prompt_token_ids` (the prompt as built by
`ChatFormat.prompt_ids`, plus a forced call's opening), unless `return_token_ids` is false. With
`logprobs: true` each token's logprob comes in the OpenAI shape (`top_logprobs` of them: the most
likely tokens of the same distribution), and with vLLM's `return_tokens_as_token_ids: true` each
entry's `token` is `token_id:N`; /v1/completions answers an integer `logprobs` with OpenAI's legacy
object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`: each token's offset in the
concatenation of the tokens' texts).

What a trainer needs to check a choice: `adapter_version` (the adapter it was sampled with: a new
adapter swaps in between decode steps and running requests finish on theirs), `sampling_temperature`
and `sampling_modified`: which of top_p, logit_bias, presence_penalty, frequency_penalty changed the
distribution its tokens were drawn from. The logprobs are under that distribution, which a learner
recomputing under temperature alone cannot reproduce, so artmlx's ART adapter refuses such choices;
the choice's logprob entries carry `sampling_modified` and `sampling_temperature` too, so the marks survive stream assemblers
that keep only logprob entries and token ids (ART's `consume_chat_completion_stream`).

Tools (`tools`, `tool_choice`): rendered by the chat template, calls parsed from the reply
(`tools.py`) into `message.tool_calls` with `finish_reason` "tool_calls". `tool_choice` "required" or
a named function puts the template's call opening at the end of the prompt (`tools.call_opening`: for
Hermes/Qwen `<tool_call>\\n{"name": "X", "arguments": {`; "required" with several tools stops before
the name); those ids are in `prompt_token_ids`, `token_ids` are the sampled continuation, and the
message is parsed from opening + continuation. `parallel_tool_calls: false` keeps the first call.

Streaming: a chunk per sampled token per choice, its choice carrying that token's `token_ids` and
`token_logprobs` (and logprob entry, when asked); the first chunk carries `prompt_token_ids`, the last
chunk of each choice `adapter_version`, `sampling_temperature` and `sampling_modified`. Text that may
begin a stop string or a tool call is held back until it cannot; tool calls come in the last chunk.
With `stream_options.include_usage` every chunk has `usage: null` and a last chunk with no choices
carries the usage.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..model.families import vocab_size
from .model_server import ModelServer
from .params import ApiError, Sampling, check_fields, parse_messages, parse_sampling, parse_tools


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

    async def _body(self, request: HttpRequest, chat: bool) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        body = check_fields(body, chat)
        model = body.get("model")
        try:
            self.server.version_of(model)
        except (KeyError, TypeError):
            raise ApiError(404, f"model {model!r} not found; this server has {self.server.model_names}", "model",
                           kind="not_found_error") from None
        return body

    def _sampling(self, body: dict, chat: bool) -> Sampling:
        sampling = parse_sampling(body, chat, self.server.config.max_tokens, vocab_size(self.server.model))
        sampling.version = self.server.version_of(body["model"])
        return sampling

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
            body = await self._body(request, chat=True)
            messages = parse_messages(body)
            sampling = self._sampling(body, chat=True)
            parse_tools(body, sampling, self.server)
            try:
                prompt = self.server.prompt_ids(messages, sampling.tools, sampling.template_kwargs)
                sampling.conversation = (messages, sampling.tools, sampling.template_kwargs)
            except TemplateError as error:
                raise ApiError(400, f"the chat template refused these messages: {error}", "messages") from None
            return await self._generate(body["model"], prompt + sampling.forced_ids, sampling, chat=True)
        except ApiError as error:
            return error.response()

    async def completions(self, request: HttpRequest):
        try:
            self._check(request)
            body = await self._body(request, chat=False)
            sampling = self._sampling(body, chat=False)
            prompt = body.get("prompt")
            if isinstance(prompt, str) and prompt:
                prompt = list(self.server.tokenizer.encode(prompt))
            elif not (isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                                  for t in prompt)):
                raise ApiError(400, "'prompt' must be a non-empty string or list of token ids", "prompt")
            vocab = vocab_size(self.server.model)
            if any(not 0 <= t < vocab for t in prompt):
                raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
            return await self._generate(body["model"], prompt, sampling, chat=False)
        except ApiError as error:
            return error.response()

    def _submit(self, prompt: list[int], sampling: Sampling, index: int, on_token):
        limit = self.server.config.max_prompt_tokens
        if len(prompt) > limit:
            raise ApiError(400, f"context too long: the prompt has {len(prompt)} tokens, this server takes at most "
                                f"{limit}", "messages", kind="invalid_request_error")
        try:  # each choice draws from its own stream of the request's seed
            return self.server.submit(prompt, sampling.max_tokens, sampling.temperature, on_token, sampling.version,
                                      replace(sampling.options, seed_stream=index), stream=sampling.stream)
        except ValueError as error:  # the scheduler's own checks
            raise ApiError(400, str(error)) from None

    async def _generate(self, model: str, prompt: list[int], sampling: Sampling, chat: bool):
        if sampling.stream:
            return self._stream(model, prompt, sampling, chat)
        # Each request resolves its own future from the scheduler's thread when it ends: no thread waits
        # per request (a thread pool's few workers would hold back answers from hundreds of agents).
        loop = asyncio.get_running_loop()
        requests, endings = [], []
        for index in range(sampling.n):
            ended, stop_check = loop.create_future(), self._stopper(sampling)

            def on_token(request, ended=ended, stop_check=stop_check):
                stop_check(request)
                if request.finish_reason and not loop.is_closed():  # closed: the server is shutting down
                    loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))

            requests.append(self._submit(prompt, sampling, index, on_token))
            endings.append(ended)
        await asyncio.gather(*endings)
        failed = [r.error for r in requests if r.error]
        if failed:
            raise ApiError(500, f"generation failed: {failed[0]}", kind="server_error")
        choices = [self._choice(index, r, sampling, chat, prompt) for index, r in enumerate(requests)]
        response = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                    "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                    "model": model, "choices": choices, "usage": _usage(prompt, requests),
                    "adapter_version": _version(requests[0])}
        if sampling.return_token_ids:
            response["prompt_token_ids"] = prompt
        return JSONResponse(response)

    def _reply(self, tokens: list[int], sampling: Sampling) -> tuple[str, bool]:
        """The reply's text (a forced opening, then the sampled tokens without a final end-of-turn token)
        cut before the first stop string in its sampled part, and whether one was found."""
        if tokens and tokens[-1] in self.server.chat.eos_token_ids:
            tokens = tokens[:-1]
        text = self.server.decode(sampling.forced_ids + tokens)
        start = len(sampling.forced_text)
        cut = min((at for at in (text.find(stop, start) for stop in sampling.stop) if at >= 0), default=-1)
        return (text[:cut], True) if cut >= 0 else (text, False)

    def _stopper(self, sampling: Sampling):
        """An on_token check that ends a request once its text contains a stop string."""
        def check(request):
            if sampling.stop and self._reply(request.tokens, sampling)[1]:
                request.finish_reason = "stop"
        return check

    def _name(self, token: int, sampling: Sampling) -> str:
        return f"token_id:{token}" if sampling.token_ids_as_tokens else self.server.token_text(token)

    def _entry(self, token: int, logprob: float, sampling: Sampling) -> dict:
        text = self.server.token_text(token)
        return {"token": self._name(token, sampling), "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _logprobs(self, request, sampling: Sampling, chat: bool, start: int = 0, end: int | None = None):
        """The logprobs of tokens [start, end) in the route's shape; None when not asked for."""
        end = len(request.tokens) if end is None else end
        top = request.top_logprobs[start:end] or [[]] * (end - start)
        pairs = list(zip(request.tokens[start:end], request.logprobs[start:end], top))
        modified = request.options.modified
        if chat and sampling.logprobs:
            return {"content": [{**self._entry(token, logprob, sampling), "token_id": token,
                                 "top_logprobs": [self._entry(i, v, sampling) for i, v in most if v > float("-inf")],
                                 "sampling_temperature": request.temperature,
                                 **({"sampling_modified": modified} if modified else {})}
                                for token, logprob, most in pairs]}
        if chat or sampling.legacy_logprobs is None:
            return None
        offset = sum(len(self.server.token_text(t)) for t in request.tokens[:start])
        offsets = []
        for token in request.tokens[start:end]:
            offsets.append(offset)
            offset += len(self.server.token_text(token))
        return {"tokens": [self._name(t, sampling) for t, _, _ in pairs],
                "token_logprobs": [logprob for _, logprob, _ in pairs],
                "top_logprobs": [{**{self._name(i, sampling): v for i, v in most if v > float("-inf")},
                                  self._name(token, sampling): logprob} for token, logprob, most in pairs],
                "text_offset": offsets}

    def _marks(self, request) -> dict:
        """What a trainer checks a choice by: its adapter version, temperature, and which options changed
        the distribution it was sampled from; and the version again as openpipe-art 0.5.23's policy spans
        (the prompt's positions 1.. and the completion's, as ART writes them for a step's LoRA), which its
        PipelineTrainer requires of eval replies. The base model alone has no policy version: no spans."""
        version = _version(request)
        marks = {"adapter_version": version, "sampling_temperature": request.temperature,
                 "sampling_modified": request.options.modified}
        if version is not None and request.tokens:
            slot = f"{self.server.name}@{version}"

            def span(start: int, end: int) -> dict:
                return {"start_token": start, "end_token": end, "generation_id": slot, "policy_version": version,
                        "lora_slot": slot, "update_seq": version}
            prompt = len(request.prompt)
            marks["prompt_policy_token_spans"] = [span(1, prompt)] if prompt > 1 else []
            marks["policy_token_spans"] = [span(0, len(request.tokens))]
        return marks

    def _choice(self, index: int, request, sampling: Sampling, chat: bool, prompt: list[int]) -> dict:
        text, _ = self._reply(request.tokens, sampling)
        choice = {"index": index, "finish_reason": request.finish_reason,
                  "logprobs": self._logprobs(request, sampling, chat)}
        if sampling.return_token_ids:
            choice.update(token_ids=list(request.tokens), token_logprobs=list(request.logprobs),
                          prompt_token_ids=prompt)
        choice.update(self._marks(request))
        if not chat:
            choice["text"] = text
            return choice
        reply = self.server.tool_parser.parse(text, sampling.tools, sampling.parallel_tool_calls) \
            if sampling.parse_tools else None
        if reply is not None and reply.tool_calls:
            choice["message"] = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
            if request.finish_reason == "stop":
                choice["finish_reason"] = "tool_calls"
        else:
            choice["message"] = {"role": "assistant", "content": text}
        self._remember(sampling, choice["message"], prompt, request)
        return choice

    def _remember(self, sampling: Sampling, message: dict, prompt: list[int], request) -> None:
        """The reply as the client will resend it, with the ids the model saw, for its next turn."""
        if sampling.conversation is not None and request.finish_reason in ("stop", "length"):
            messages, tools, template_kwargs = sampling.conversation
            self.server.remember(messages, tools, template_kwargs, message, prompt + request.tokens)

    def _visible(self, request, count: int, finish, sampling: Sampling, chat: bool):
        """The text of the first `count` tokens that may be sent now, and the tool calls once it ends."""
        text, stopped = self._reply(request.tokens[:count], sampling)
        if chat and sampling.parse_tools:
            if finish:
                reply = self.server.tool_parser.parse(text, sampling.tools, sampling.parallel_tool_calls)
                if reply.tool_calls:
                    return reply.content or "", reply.tool_calls
                return text, None
            text = self.server.tool_parser.visible_prefix(text)
        if not (finish or stopped):  # hold back what may begin a stop string
            start = len(sampling.forced_text)
            held = max((k for stop in sampling.stop for k in range(1, len(stop))
                        if len(text) - k >= start and text.endswith(stop[:k])), default=0)
            text = text[:len(text) - held]
        return text, None

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
            request = self._submit(prompt, sampling, index, on_token)
            index_of[id(request)] = index
            requests.append(request)
        ident, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        first = [sampling.return_token_ids]

        def event(choices: list[dict], **extra) -> str:
            data = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                    "model": model, "choices": choices, **extra}
            if first[0]:  # vLLM's place for the prompt: the first chunk
                data["prompt_token_ids"], first[0] = prompt, False
            if sampling.include_usage and "usage" not in data:
                data["usage"] = None
            return f"data: {json.dumps(data)}\n\n"

        def choice(request, index: int, start: int, count: int, piece: str, finish, calls) -> dict:
            if chat:
                delta = {"content": piece} if piece else {}
                if calls:
                    delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
                out = {"index": index, "delta": delta}
            else:
                out = {"index": index, "text": piece}
            out.update(finish_reason=finish, logprobs=self._logprobs(request, sampling, chat, start, count))
            if sampling.return_token_ids:
                out.update(token_ids=request.tokens[start:count], token_logprobs=request.logprobs[start:count])
            return {**out, **(self._marks(request) if finish else {})}

        async def events():
            sent_text, sent_tokens = [""] * len(requests), [0] * len(requests)
            open_rows = len(requests)
            try:
                if chat:
                    for index in range(len(requests)):
                        yield event([{"index": index, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": None, "logprobs": None}])
                while open_rows:
                    request, count, finish = await queue.get()
                    index = index_of[id(request)]
                    if finish == "error":
                        yield f"data: {json.dumps({'error': {'message': request.error, 'type': 'server_error'}})}\n\n"
                        open_rows -= 1
                        continue
                    text, calls = self._visible(request, count, finish, sampling, chat)
                    piece = text[len(sent_text[index]):] if text.startswith(sent_text[index]) else ""
                    sent_text[index] = text if piece else sent_text[index]
                    start, sent_tokens[index] = sent_tokens[index], count
                    if chat and finish:
                        self._remember(sampling, {"content": text, "tool_calls": calls}, prompt, request)
                    if calls and finish == "stop":
                        finish = "tool_calls"
                    extra = {"adapter_version": request.adapter_version} if request.adapter_version >= 0 else {}
                    yield event([choice(request, index, start, count, piece, finish, calls)], **extra)
                    if finish:
                        open_rows -= 1
                if sampling.include_usage:
                    yield event([], usage=_usage(prompt, requests))
                yield "data: [DONE]\n\n"
            finally:
                abandoned[0] = True  # a client that went away stops its requests at their next token

        return StreamingResponse(events(), media_type="text/event-stream")


def _usage(prompt: list[int], requests) -> dict:
    completion = sum(len(r.tokens) for r in requests)
    return {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + completion}
