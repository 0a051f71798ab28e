"""Continuous batching on the engine: requests join and leave a running batch between decode steps.

What a server needs from the engine that environment rollouts (which start a batch together) do not:
- `submit(request)` from any thread; the scheduler's own thread calls `step()` in a loop;
- each `step()` first admits waiting requests (up to `max_rows` in the batch): their prompts are
  prefilled together in a cache of their own and joined to the running cache (`cache.join_caches`),
  then samples one token for every running request and feeds them all back in **one forward**, so a
  request that arrives while others decode joins the batch at the next step;
- a request ends at one of its stop tokens or at its `max_tokens` (`finish_reason` "stop" or
  "length") and its row leaves the cache; holes left behind are compacted away once they outnumber
  the real slots;
- every sampled token is recorded with its logprob under the tempered distribution it was drawn
  from (the same rule as `generate.sample_tokens`), per request temperature (0: greedy);
- `on_token(request)` (optional) is called on the scheduler's thread after each new token, for
  streaming; `done` (a threading.Event) is set when the request ends.
- `adapter_version`: what the caller swapped in last (`set_adapter_version`); each request records
  the version it was admitted under. Swapping weights is the caller's (between steps).

Deviation from a vLLM-style scheduler: no preemption or paged memory; a request waits until a row
is free, and its prompt must fit `max_prompt_tokens`.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import numpy as np

from .cache import RaggedCache, compact, join_caches
from .generate import Engine


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    stop_tokens: frozenset = frozenset()
    on_token: Callable[["Request"], None] | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    adapter_version: int = -1
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Scheduler:
    def __init__(self, engine: Engine, max_rows: int = 32, max_prompt_tokens: int = 8192, seed: int = 0):
        self.engine = engine
        self.max_rows = max_rows
        self.max_prompt_tokens = max_prompt_tokens
        self.key = mx.random.key(seed)
        mx.eval(self.key)  # MLX streams are per thread: nothing lazy may cross to the scheduler's thread
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.cache: RaggedCache | None = None
        self.logits: mx.array | None = None  # (rows, V): the next token's distribution per running row
        self.lock = threading.Lock()
        self.wakeup = threading.Event()
        self.adapter_version = 0
        self.decode_forwards = 0  # one per step that had running requests: what batching saves
        self.tokens_sampled = 0

    def submit(self, request: Request) -> Request:
        if not request.prompt:
            raise ValueError("empty prompt")
        if len(request.prompt) > self.max_prompt_tokens:
            raise ValueError(f"the prompt has {len(request.prompt)} tokens, more than {self.max_prompt_tokens}")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        with self.lock:
            self.waiting.append(request)
        self.wakeup.set()
        return request

    def set_adapter_version(self, version: int) -> None:
        self.adapter_version = version

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self) -> list[Request]:
        """Admit, sample one token for every running request, retire the finished, one forward. Returns
        the requests that finished in this step."""
        self._admit()
        if not self.running:
            return []
        self.key, step_key = mx.random.split(self.key)
        temperatures = np.array([r.temperature for r in self.running], np.float32)
        tokens, logprobs = _sample(self.logits, temperatures, step_key)
        tokens, logprobs = np.array(tokens), np.array(logprobs)
        finished, keep = [], []
        for row, request in enumerate(self.running):
            token = int(tokens[row])
            request.tokens.append(token)
            request.logprobs.append(float(logprobs[row]))
            self.tokens_sampled += 1
            if token in request.stop_tokens:
                request.finish_reason = "stop"
            elif len(request.tokens) >= request.max_tokens:
                request.finish_reason = "length"
            if request.on_token is not None:
                request.on_token(request)
            (finished if request.finish_reason else keep).append(row)
        for row in finished:
            self.running[row].done.set()
        done = [self.running[row] for row in finished]
        if not keep:
            self.running, self.cache, self.logits = [], None, None
            return done
        if finished:
            rows = mx.array(keep)
            self.cache.select(rows)
            self.running = [self.running[row] for row in keep]
            tokens = tokens[keep]
            if self.cache.used > 2 * int(self.cache.offset.max().item()) + 64:
                compact(self.cache)
        h = self.cache.forward(self.engine.parts.trunk, mx.array(tokens)[:, None],
                               mx.ones((len(self.running),), mx.int32))
        self.logits = self.engine.parts.head(h[:, -1, :])
        mx.eval(self.logits)
        self.decode_forwards += 1
        return done

    def _admit(self) -> None:
        with self.lock:
            free = self.max_rows - len(self.running)
            admitted = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        if not admitted:
            return
        try:
            side = self.engine.new_cache(len(admitted))
            logits = self.engine.prefill(side, [r.prompt for r in admitted])
            mx.eval(logits)
        except Exception as error:  # release the newcomers; the running batch is untouched
            self._release(admitted, f"{type(error).__name__}: {error}")
            return
        for request in admitted:
            request.adapter_version = self.adapter_version
        if self.cache is None:
            self.cache, self.logits = side, logits
        else:
            self.cache = join_caches(self.cache, side)
            self.logits = mx.concatenate([self.logits, logits], axis=0)
        mx.eval(self.logits)
        self.running.extend(admitted)

    def run_forever(self, stop: threading.Event) -> None:
        """The scheduler's thread: step while there is work, sleep until a request arrives. A step that
        raises fails the requests in the batch (each gets the error and is released), not the thread."""
        with mx.stream(mx.new_thread_local_stream(mx.default_device())):  # MLX streams belong to threads
            while not stop.is_set():
                if not self.busy:
                    self.wakeup.wait(0.1)
                    self.wakeup.clear()
                    continue
                try:
                    self.step()
                except Exception as error:  # the thread's edge: every waiting caller must hear of it
                    self.fail(f"{type(error).__name__}: {error}")

    def fail(self, reason: str) -> None:
        """End every running request with `reason` (finish_reason "error") and start a fresh batch."""
        running, self.running, self.cache, self.logits = self.running, [], None, None
        self._release(running, reason)

    @staticmethod
    def _release(requests: list[Request], reason: str) -> None:
        for request in requests:
            request.error, request.finish_reason = reason, "error"
            if request.on_token is not None:
                request.on_token(request)
            request.done.set()


def _sample(logits: mx.array, temperatures: np.ndarray, key: mx.array) -> tuple[mx.array, mx.array]:
    """One token per row at that row's temperature (0: greedy), with its logprob under the tempered
    distribution it was drawn from (greedy: the untempered one), as `generate.sample_tokens`."""
    logits = logits.astype(mx.float32)
    greedy = mx.array(temperatures == 0)
    scale = mx.array(np.where(temperatures == 0, 1.0, temperatures))[:, None]
    scaled = logits / scale
    logprobs = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    tokens = mx.where(greedy, mx.argmax(logprobs, axis=-1), mx.random.categorical(logprobs, key=key))
    return tokens, mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
