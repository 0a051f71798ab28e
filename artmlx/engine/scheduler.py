"""Continuous batching on the engine: requests join and leave a running batch between decode steps.

What a server needs from the engine that environment rollouts (which start a batch together) do not:
- `submit(request)` from any thread; the scheduler's own thread calls `step()` in a loop;
- each `step()` first admits waiting requests (up to `max_rows` running): their prompts are
  prefilled together in a cache of their own, from the longest prefix the prefix cache or a running row
  holds, and joined to the running cache (`cache.join_caches`),
  then samples one token for every running request and feeds them all back in **one forward** per
  decode step (`decode_chunk` steps before the host reads their tokens), so a request that arrives
  while others decode joins the batch at the next step (the next chunk if no row is free);
- a request ends at one of its stop tokens or at its `max_tokens` (`finish_reason` "stop" or "length")
  and its row leaves the cache; holes left behind are compacted away once they outnumber the real slots;
- every sampled token is recorded with its logprob under the distribution it was drawn from, by the
  engine's one sampling rule (`sampling.sample`, as rollouts): per request temperature (0: greedy) and
  `options` (top_p, seed, logit_bias, presence/frequency penalties, top_logprobs), rows with and without
  options mixed in one batch (a step whose rows have none takes the plain path);
- `on_token(request)` (optional) is called on the scheduler's thread after each new token (streaming);
  `done` (a threading.Event) is set when the request ends;
- adapters swap without draining: `set_adapter(version, weights)` makes `version` the one new requests
  are admitted under; running requests finish on the adapter they started with, in one batch (and cache)
  per adapter version, whose adapter tensors a step loads before its forward (a reference swap of the LoRA
  arrays, no copy): one forward per version that still has requests; a version's tensors are dropped when
  its last request ends. Each request records its version;
- several adapter versions are servable at once: a request may name its `version` (None: the newest).
  Besides the newest, a version stays servable while it is `kept` (the ART backend keeps recent
  training steps until ART prunes them) or `hold`-ed (a lease: ART's exact adapter lease, or the
  base model, `BASE_VERSION`, whose tensors are the adapter with every LoRA B zero);
- `call(fn)` runs `fn()` on the scheduler's thread between steps (training the served model, or
  loading arrays, must happen on the thread that owns the MLX stream) and returns a Future.

Unlike vLLM's scheduler: no preemption or paged memory; a request waits for a free row (prompt up to `max_prompt_tokens`).
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from typing import Callable

import mlx.core as mx
import numpy as np

from ..model.policy import adapter_weights, conform_adapter_weights
from .cache_rows import cache_with_prefixes, compact, join_caches
from .generate import Engine
from .request import Batch, Request
from .row_prefixes import RowPrefixes, keep_finished_rows
from .sampling import sample

__all__ = ["BASE_VERSION", "Request", "Scheduler"]

# Decode steps between two host reads of the sampled tokens (H200: 128 agents 1.33x faster than single steps). A model
# with recurrent layers takes single steps: a row that ends inside a chunk runs past its end and a state cannot be cut.
DECODE_CHUNK = 8
BASE_VERSION = -2  # the base model alone (every LoRA B zero); -1 marks a request not yet admitted


class Scheduler:
    def __init__(self, engine: Engine, max_rows: int = 32, max_prompt_tokens: int = 8192, seed: int = 0,
                 prefix_cache_bytes: int = 0, decode_chunk: int = 0):
        if decode_chunk < 0:
            raise ValueError(f"decode_chunk must be at least 1, or 0 for the model's default (got {decode_chunk})")
        self.engine, self.decode_chunk = engine, decode_chunk or (1 if engine.parts.recurrent else DECODE_CHUNK)
        # KV of finished sequences, by adapter version: a prompt that extends one prefills only the rest
        self.prefix = engine.new_prefix_cache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.row_prefixes = RowPrefixes(self.prefix.block) if self.prefix is not None else None
        # prompt tokens actually prefilled (after prefix hits and shared prompts), and of every admitted request
        self.prefill_tokens = self.prompt_tokens = 0
        # where a scheduler's time goes (what benchmarks report): admissions and their rows, decode rows and
        # the cache slots they attend over, compactions, seconds spent admitting (prefill included), in
        # decode steps, and of those waiting for the device
        self.counts = collections.Counter()
        self.max_rows, self.max_prompt_tokens = max_rows, max_prompt_tokens
        self.key = mx.random.key(seed)
        mx.eval(self.key)  # MLX streams are per thread: nothing lazy may cross to the scheduler's thread
        self.waiting: collections.deque[Request] = collections.deque()
        self.calls: collections.deque[tuple[Callable, Future]] = collections.deque()
        self.lock = threading.Lock()
        self.wakeup = threading.Event()
        self.adapter_version = 0
        # Adapter tensors per version still in use; version 0 is what the model holds now.
        self.adapters: dict[int, dict[str, mx.array]] = {0: adapter_weights(engine.model)}
        mx.eval(self.adapters)
        self.loaded_version = 0
        self.kept: set[int] = set()  # versions servable while idle (beyond the newest)
        self.holds: collections.Counter[int] = collections.Counter()  # leases: servable while held
        self.batches: dict[int, Batch] = {}  # by version
        # forwards of batches with running requests, tokens sampled, and the most requests one forward served
        self.decode_forwards = self.tokens_sampled = self.peak_rows = 0

    @property
    def running(self) -> list[Request]:
        return [r for batch in self.batches.values() for r in batch.running]

    def submit(self, request: Request) -> Request:
        if not request.prompt:
            raise ValueError("empty prompt")
        if len(request.prompt) > self.max_prompt_tokens:
            raise ValueError(f"the prompt has {len(request.prompt)} tokens, more than {self.max_prompt_tokens}")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if request.version is not None and request.version not in self.adapters:
            raise ValueError(f"adapter version {request.version} is not served (served: {self.versions})")
        with self.lock:
            self.waiting.append(request)
        self.wakeup.set()
        return request

    def call(self, fn: Callable) -> Future:
        """Run `fn()` on the scheduler's thread before its next step; the Future holds its result."""
        future: Future = Future()
        with self.lock:
            self.calls.append((fn, future))
        self.wakeup.set()
        return future

    def set_adapter(self, version: int, weights: dict[str, mx.array]) -> None:
        """New requests are admitted under `version` (the adapter `weights`, names as the model's
        trainable parameters); running ones keep theirs. Call on the scheduler's thread (`call`)."""
        if version < self.adapter_version or (version == self.adapter_version and version in self.batches):
            raise ValueError(f"adapter version {version} is not newer than {self.adapter_version}, which serves requests")
        weights = conform_adapter_weights(self.adapters[self.adapter_version], weights)
        mx.eval(weights)
        self.adapters[version] = weights
        self.adapter_version = version
        self._forget_unused_adapters()

    @property
    def versions(self) -> list[int]:
        """The adapter versions a request may ask for now."""
        return sorted(self.adapters)

    def hold(self, version: int, weights: dict[str, mx.array] | None = None) -> None:
        """Keep `version` servable until as many `release`s; `weights` adds a version not in memory
        (loaded from a checkpoint, or the base). Call on the scheduler's thread."""
        if weights is not None and version not in self.adapters:
            weights = conform_adapter_weights(self.adapters[self.adapter_version], weights)
            mx.eval(weights)
            self.adapters[version] = weights
        if version not in self.adapters:
            raise ValueError(f"adapter version {version} is not in memory (served: {self.versions})")
        self.holds[version] += 1

    def release(self, version: int) -> None:
        self.holds[version] -= 1
        if self.holds[version] <= 0:
            del self.holds[version]
        self._forget_unused_adapters()

    def keep_only(self, versions) -> None:
        """Of the kept versions, keep only `versions` (the newest, held and running ones stay regardless)."""
        self.kept &= set(versions)
        self._forget_unused_adapters()

    def set_adapter_version(self, version: int) -> None:
        """Record `version` for the adapter the model holds now (weights swapped by the caller)."""
        self.set_adapter(version, adapter_weights(self.engine.model))
        self.loaded_version = version

    @property
    def busy(self) -> bool:
        return bool(self.batches or self.waiting or self.calls)

    def step(self) -> list[Request]:
        """Run pending calls, admit, then for each adapter version's batch: its decode steps (one forward each,
        up to `decode_chunk`), retire the finished. Returns the requests that finished in this step."""
        self._run_calls()
        started = time.perf_counter()
        self._admit()
        self.counts["admit_s"] += time.perf_counter() - started
        done = []
        for batch in list(self.batches.values()):
            self._load(batch.version)
            started = time.perf_counter()
            done += self._step_batch(batch)
            self.counts["decode_s"] += time.perf_counter() - started
            if not batch.running:
                del self.batches[batch.version]
        self._forget_unused_adapters()
        return done

    def load_current(self) -> None:
        """Load the newest adapter into the model (before training it on this thread)."""
        self._load(self.adapter_version)

    def _load(self, version: int) -> None:
        if version != self.loaded_version:
            weights = self.adapters[version]
            if weights:
                self.engine.model.load_weights(list(weights.items()), strict=False)
            self.loaded_version = version

    def _forget_unused_adapters(self) -> None:
        with self.lock:
            asked = {r.version for r in self.waiting}
        needed = {self.adapter_version, *self.batches, *self.kept, *self.holds, *asked}
        if self.row_prefixes is not None:
            self.row_prefixes.forget_except(self.batches)
        for version in [v for v in self.adapters if v not in needed]:
            del self.adapters[version]
            if self.prefix is not None:
                self.prefix.drop_version(version)

    def _run_calls(self) -> None:
        while True:
            with self.lock:
                if not self.calls:
                    return
                fn, future = self.calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as error:  # the caller's own error, handed back to it
                    future.set_exception(error)

    def _step_batch(self, batch: Batch) -> list[Request]:
        """Sample a token per row and feed it back, `decode_chunk` times (vLLM's multi-step scheduling), each step's
        forward queued as soon as it is built (`mx.async_eval`); then read the chunk's tokens on the host once and do
        each request's bookkeeping once per chunk. Every row is fed every sampled token, also past its end inside a
        chunk (wasted row-steps; the row leaves with its cache row, and what is remembered of it is cut at its end). A
        request seen waiting while a row is free ends the chunk (it joins at the next step). A batch steps singly with
        a row that is not `plain` (top_p, logit_bias, penalties, seeds, top logprobs: some need its tokens between
        draws) or a streamed row still waiting for its first token."""
        running = batch.running
        self.peak_rows = max(self.peak_rows, len(running))
        temperatures = np.array([r.temperature for r in running], np.float32)
        plain = all(r.options.plain for r in running)
        singly = not plain or any(r.stream and not r.tokens for r in running)  # a streamed row awaits its first token
        steps = 1 if singly else min(self.decode_chunk, max(r.max_tokens - len(r.tokens) for r in running))
        logits, chunk, timings, ones = batch.logits, [], collections.Counter(), np.ones((len(running),), np.int32)
        room, used = sum(len(b.running) for b in self.batches.values()) < self.max_rows, batch.cache.used
        for step in range(steps):
            built = time.perf_counter()
            self.key, step_key = mx.random.split(self.key)
            sampled = sample(logits, temperatures, step_key, None if plain else [r.options for r in running],
                             None if plain else [r.tokens for r in running])
            # fed even where every row ends here: a finished sequence is remembered with its last token
            h = batch.cache.forward(self.engine.parts.trunk, sampled.tokens[:, None], ones)
            logits = self.engine.parts.head(h[:, -1, :])
            launched = time.perf_counter()  # host seconds building (Python), launching (MLX), then syncing
            mx.async_eval(logits, *(a for a in sampled if a is not None))
            timings.update(build_s=launched - built, launch_s=time.perf_counter() - launched)
            chunk.append(sampled)
            if self.waiting and room:  # a newcomer could join now: end the chunk here rather than keep it waiting
                break
        steps = len(chunk)
        self.counts.update(rows_stepped=len(running) * steps,  # and the cache slots they attended over
                           slots_stepped=len(running) * (used * steps + steps * (steps - 1) // 2))
        waited = time.perf_counter()
        tokens, logprobs = (np.array(mx.stack(parts, axis=1)) if steps > 1 else np.array(parts[0])[:, None]
                            for parts in ([c.tokens for c in chunk], [c.logprobs for c in chunk]))  # no op for one
        self.counts.update(timings, sync_s=time.perf_counter() - waited)
        top = None if chunk[0].top_ids is None else (np.array(chunk[0].top_ids), np.array(chunk[0].top_logprobs))
        finished, keep, past_end, served = [], [], {}, 0
        for row, request in enumerate(running):
            for step in range(steps):
                token = int(tokens[row, step])
                request.tokens.append(token)
                request.logprobs.append(float(logprobs[row, step]))
                if request.options.top_logprobs:
                    k = request.options.top_logprobs
                    request.top_logprobs.append([(int(i), float(v)) for i, v in zip(top[0][row, :k], top[1][row, :k])])
                self.tokens_sampled += 1
                if token in request.stop_tokens:
                    request.finish_reason = "stop"
                elif len(request.tokens) >= request.max_tokens:
                    request.finish_reason = "length"
                if request.on_token is not None:
                    request.on_token(request)
                if request.finish_reason:
                    past_end[row] = steps - 1 - step  # tokens fed to its cache row after its last one
                    break
            served = max(served, step if request.finish_reason else steps)  # forwards it needed fed
            (finished if request.finish_reason else keep).append(row)
        self.decode_forwards += served  # forwards that fed a row still running (not a finished row's last token)
        if finished and self.prefix is not None:
            self._remember_kv(batch, finished, past_end)
        for row in finished:
            running[row].done.set()
        done = [running[row] for row in finished]
        if not keep:
            batch.running, batch.cache, batch.logits = [], None, None
            return done
        if finished:
            rows = mx.array(keep)
            batch.cache.select(rows)
            batch.running = [running[row] for row in keep]
            logits = logits[rows]
            if batch.cache.used > 2 * int(batch.cache.offset.max().item()) + 64:
                compact(batch.cache)
                self.counts["compactions"] += 1
        batch.logits = logits  # evaluated by the next step's async_eval, with that step's sampling
        return done

    def _remember_kv(self, batch: Batch, rows: list[int], past_end: dict[int, int]) -> None:
        started = time.perf_counter()
        keep_finished_rows(self.prefix, batch, rows, past_end)
        self.counts["remember_s"] += time.perf_counter() - started

    def _admit(self) -> None:
        with self.lock:
            free = self.max_rows - sum(len(b.running) for b in self.batches.values())
            admitted = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        if admitted:
            self.counts["admissions"] += 1
            self.counts["admitted"] += len(admitted)
        by_version: dict[int, list[Request]] = {}
        for request in admitted:
            by_version.setdefault(self.adapter_version if request.version is None else request.version,
                                  []).append(request)
        for version, requests in by_version.items():
            if version not in self.adapters:  # forgotten between submit and admission
                self._release(requests, f"adapter version {version} is no longer served")
                continue
            self._admit_batch(version, requests)

    def _admit_batch(self, version: int, admitted: list[Request]) -> None:
        """Prefill `admitted` under adapter `version` and join them to that version's batch. A prompt that
        extends a cached sequence starts from its KV and prefills only the rest; identical prompts (the n
        choices of one request, a group's shared first turn) are prefilled once and their rows repeated."""
        try:
            self._load(version)
            unique: dict[tuple, int] = {}
            for request in admitted:
                unique.setdefault(tuple(request.prompt), len(unique))
            prompts = [list(p) for p in unique]
            hits = [self.prefix.lookup(version, p) if self.prefix is not None else (0, None) for p in prompts]
            if self.prefix is not None and version in self.batches:  # a running row may hold more of a prompt
                found = self.row_prefixes.find(self.batches[version], prompts, [n for n, _ in hits])
                for i, (n, prefix) in found.items():
                    self.prefix.count_hit(not hits[i][0], n - hits[i][0])
                    hits[i] = (n, prefix)
                    self.counts["running_prefixes"] += 1
            side = self.engine.new_cache(len(prompts))  # (refuses a model whose layers it cannot cache)
            if any(n for n, _ in hits):
                side = cache_with_prefixes(side, [kv for _, kv in hits])
            logits = self.engine.prefill(side, [p[n:] for p, (n, _) in zip(prompts, hits)])
            self.prefill_tokens += sum(len(p) - n for p, (n, _) in zip(prompts, hits))
            self.prompt_tokens += sum(len(r.prompt) for r in admitted)
            if len(prompts) < len(admitted):
                rows = mx.array([unique[tuple(r.prompt)] for r in admitted])
                side.select(rows)
                logits = logits[rows]
            mx.eval(logits)
        except Exception as error:  # release the newcomers; the running batches are untouched
            self._release(admitted, f"{type(error).__name__}: {error}")
            return
        for request in admitted:
            request.adapter_version = version
        batch = self.batches.setdefault(version, Batch(version))
        if batch.cache is None:
            batch.cache, batch.logits = side, logits
        else:
            batch.cache = join_caches(batch.cache, side)
            batch.logits = mx.concatenate([batch.logits, logits], axis=0)  # evaluated by the next step
        batch.running.extend(admitted)

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
            self._fail_calls("the scheduler stopped")
            mx.synchronize()
        # This thread's streams go with it, here rather than in C++ thread-local teardown at process
        # exit, which races the interpreter's own ("terminate called without an active exception").
        mx.clear_streams()

    def fail(self, reason: str) -> None:
        """End every running request with `reason` (finish_reason "error") and start fresh batches."""
        running, self.batches = self.running, {}
        self._release(running, reason)

    def _fail_calls(self, reason: str) -> None:
        with self.lock:
            calls, self.calls = list(self.calls), collections.deque()
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError(reason))

    @staticmethod
    def _release(requests: list[Request], reason: str) -> None:
        for request in requests:
            request.error, request.finish_reason = reason, "error"
            if request.on_token is not None:
                request.on_token(request)
            request.done.set()

