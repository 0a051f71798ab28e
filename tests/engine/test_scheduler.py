"""Continuous batching: requests join and leave between decode steps, each gets its own sequence."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from artmlx.engine.generate import Engine
from artmlx.engine.scheduler import Request, Scheduler
from tests.helpers import tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(perturb=0.02)


def reference_logprobs(model, request: Request, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Each sampled token's logprob and the argmax, from one full forward of prompt + reply alone."""
    full = request.prompt + request.tokens
    logits = model(mx.array([full]))[0].astype(mx.float32)
    steps = logits[len(request.prompt) - 1: len(full) - 1]
    scaled = steps / (temperature or 1.0)
    logprobs = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logprobs, mx.array(request.tokens)[:, None], axis=-1)[:, 0]
    return np.array(picked), np.array(mx.argmax(steps, axis=-1))


def assert_greedy_and_exact(model, request: Request) -> None:
    """The request got the argmax at every step, with the logprobs of its sequence run alone."""
    logprobs, argmax = reference_logprobs(model, request, 0.0)
    np.testing.assert_allclose(request.logprobs, logprobs, atol=2e-3)
    assert request.tokens == argmax.tolist()


def run(scheduler: Scheduler, arrivals: dict[int, list[Request]]) -> None:
    step = 0
    while scheduler.busy or any(k >= step for k in arrivals):
        for request in arrivals.get(step, []):
            scheduler.submit(request)
        scheduler.step()
        step += 1


def test_requests_joining_midway_each_get_their_own_greedy_sequence(policy):
    model, _ = policy
    rng = np.random.default_rng(0)
    prompt = lambda n: [int(t) for t in rng.integers(6, 100, size=n)]  # noqa: E731
    arrivals = {0: [Request(prompt(5), 12, 0.0), Request(prompt(9), 4, 0.0), Request(prompt(2), 20, 0.0)],
                3: [Request(prompt(7), 6, 0.0), Request(prompt(3), 30, 0.0)],
                9: [Request(prompt(11), 8, 0.0)]}
    scheduler = Scheduler(Engine(model), max_rows=4)  # the sixth waits for a free row
    run(scheduler, arrivals)
    for request in [r for rs in arrivals.values() for r in rs]:
        assert request.done.is_set() and request.finish_reason == "length"
        assert len(request.tokens) == request.max_tokens
        assert_greedy_and_exact(model, request)


def test_one_forward_per_decode_step_for_every_running_request(policy):
    model, _ = policy
    scheduler = Scheduler(Engine(model), max_rows=16)
    requests = [scheduler.submit(Request([7 + i, 20, 30], 10, 1.0)) for i in range(8)]
    while scheduler.busy:
        scheduler.step()
    assert scheduler.tokens_sampled == 80
    assert scheduler.decode_forwards == 9  # the tenth token of each ends it: nothing left to feed
    assert all(len(r.tokens) == 10 for r in requests)


def test_sampled_logprobs_are_under_each_requests_temperature_and_stops_end_it(policy):
    model, _ = policy
    scheduler = Scheduler(Engine(model), max_rows=8, seed=3)
    hot = [scheduler.submit(Request([11, 12, 13, i], 16, 0.7)) for i in range(4)]
    cold = scheduler.submit(Request([11, 12, 13], 16, 0.0))
    while scheduler.busy:
        scheduler.step()
    for request, temperature in [*((r, 0.7) for r in hot), (cold, 0.0)]:
        logprobs, _ = reference_logprobs(model, request, temperature)
        np.testing.assert_allclose(request.logprobs, logprobs, atol=2e-3)
    # A stop token ends a request with finish_reason "stop", the stop token included.
    first = hot[0].tokens[2]
    stopped = scheduler.submit(Request(list(hot[0].prompt), 16, 0.7, stop_tokens=frozenset({first})))
    scheduler.key = mx.random.key(3)  # not needed for the rule; the stop is whatever token comes
    while scheduler.busy:
        scheduler.step()
    if first in stopped.tokens:
        assert stopped.finish_reason == "stop" and stopped.tokens[-1] == first
    else:
        assert stopped.finish_reason == "length"


def test_holes_left_by_a_long_prompt_are_compacted_without_changing_the_others(policy):
    model, _ = policy
    scheduler = Scheduler(Engine(model), max_rows=8, decode_chunk=1)  # counted in single steps
    survivor = scheduler.submit(Request([5, 6, 7], 60, 0.0))
    for _ in range(3):
        scheduler.step()
    long = scheduler.submit(Request([int(t) for t in np.arange(200) % 90 + 6], 2, 0.0))
    scheduler.step()
    assert scheduler.batches[0].cache.used >= 200  # the survivor's row now has ~190 holes
    while not long.done.is_set():
        scheduler.step()
    scheduler.step()
    assert scheduler.batches[0].cache.used < 80  # compacted to the survivor's own length once the long one left
    while scheduler.busy:
        scheduler.step()
    for request in (survivor, long):
        assert_greedy_and_exact(model, request)


def test_bad_requests_are_refused_at_submit(policy):
    model, _ = policy
    scheduler = Scheduler(Engine(model), max_prompt_tokens=16)
    with pytest.raises(ValueError, match="empty prompt"):
        scheduler.submit(Request([], 4))
    with pytest.raises(ValueError, match="more than 16"):
        scheduler.submit(Request(list(range(17)), 4))
    with pytest.raises(ValueError, match="at least 1"):
        scheduler.submit(Request([1], 0))
    assert not scheduler.busy


def test_a_new_adapter_swaps_in_between_steps_and_running_requests_finish_on_theirs():
    model, _ = tiny_policy(perturb=0.02, seed=1)
    old = dict(tree_flatten(model.trainable_parameters()))
    mx.random.seed(7)
    new = {name: mx.random.normal(value.shape) * 0.05 for name, value in old.items()}
    scheduler = Scheduler(Engine(model), max_rows=8, decode_chunk=1)  # counted in single steps
    early = [scheduler.submit(Request([9, 10 + i, 11], 24, 0.0)) for i in range(3)]
    for _ in range(5):
        scheduler.step()
    forwards = scheduler.decode_forwards
    scheduler.set_adapter(1, new)  # no drain: the early requests are mid-way
    late = [scheduler.submit(Request([9, 40 + i, 11], 10, 0.0)) for i in range(2)]
    scheduler.step()
    assert scheduler.decode_forwards == forwards + 2  # one forward per adapter version while both run
    assert all(not r.done.is_set() for r in early)
    while scheduler.busy:
        scheduler.step()
    assert [r.adapter_version for r in early + late] == [0, 0, 0, 1, 1]
    assert set(scheduler.adapters) == {1}  # version 0's tensors went with its last request
    model.load_weights(list(old.items()), strict=False)
    for request in early:
        assert_greedy_and_exact(model, request)
    model.load_weights(list(new.items()), strict=False)
    for request in late:
        assert_greedy_and_exact(model, request)
    with pytest.raises(ValueError, match="not newer"):
        scheduler.set_adapter(0, old)
    with pytest.raises(ValueError, match="names differ"):
        scheduler.set_adapter(2, {"x": mx.zeros((2,))})


def test_calls_run_on_the_scheduler_thread_between_steps():
    import threading

    model, _ = tiny_policy()
    mx.eval(model.parameters())  # the scheduler's thread may use only evaluated arrays (MLX streams are per thread)
    scheduler = Scheduler(Engine(model), max_rows=4)
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        request = scheduler.submit(Request([5, 6, 7], 30, 1.0))
        assert scheduler.call(lambda: threading.current_thread() is thread).result(timeout=30)
        with pytest.raises(ZeroDivisionError):
            scheduler.call(lambda: 1 / 0).result(timeout=30)
        assert request.done.wait(30) and len(request.tokens) == 30
    finally:
        stop.set()
        thread.join(10)


def test_a_chunk_of_decode_steps_ends_each_request_where_single_steps_do(policy):
    """Eight steps between host reads: rows that end inside a chunk (their max_tokens, a stop token, a stop
    decided on the host by `on_token`) leave with exactly the tokens single steps give them, greedy and
    exact, while the rows beside them go on; the decode forwards are counted as they are queued."""
    model, _ = policy
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(6, 100, size=n)] for n in (4, 9, 6, 3)]
    alone = [Request(list(p), 21, 0.0) for p in prompts]
    run(Scheduler(Engine(model), max_rows=8, decode_chunk=1), {0: alone})
    stop = alone[1].tokens[3]
    host_stop = lambda request: request.finish_reason or (len(request.tokens) == 6 and  # noqa: E731
                                                         setattr(request, "finish_reason", "stop"))
    chunked = [Request(list(prompts[0]), 5, 0.0), Request(list(prompts[1]), 21, 0.0, stop_tokens=frozenset({stop})),
               Request(list(prompts[2]), 21, 0.0, on_token=host_stop), Request(list(prompts[3]), 21, 0.0)]
    scheduler = Scheduler(Engine(model), max_rows=8, decode_chunk=8)
    run(scheduler, {0: chunked})
    first_stop = alone[1].tokens.index(stop) + 1
    assert [len(r.tokens) for r in chunked] == [5, first_stop, 6, 21]
    assert [r.finish_reason for r in chunked] == ["length", "stop", "stop", "length"]
    for request, reference in zip(chunked, alone):
        assert request.tokens == reference.tokens[: len(request.tokens)]
        assert_greedy_and_exact(model, request)
    assert scheduler.decode_forwards == 20  # 8 + 8 + 5, the last one feeding no running row


def test_sequences_that_end_inside_a_chunk_are_remembered_up_to_their_end(policy):
    """A row fed past its end inside a chunk is kept in the prefix cache cut at its end (no KV of tokens that
    are not its own), and the next turn that extends it finds all of it and decodes exactly as a fresh prefill
    would."""
    model, _ = policy
    rng = np.random.default_rng(6)
    scheduler = Scheduler(Engine(model), max_rows=8, decode_chunk=8, prefix_cache_bytes=64 << 20)
    first = [Request([int(t) for t in rng.integers(6, 100, size=30)], n, 0.0) for n in (3, 5, 13)]
    run(scheduler, {0: first})
    assert scheduler.prefix.hits == 0
    entries = list(scheduler.prefix.entries.values())
    assert len(entries) == 3 and all(kv[0].shape[1] == len(entry.tokens) for entry in entries for kv in entry.kv)
    second = [Request(r.prompt + r.tokens + [11, 12, 13, 14], 9, 0.0) for r in first]
    prefilled = scheduler.prefill_tokens
    run(scheduler, {0: second})
    assert scheduler.prefix.hits == 3 and scheduler.prefill_tokens == prefilled + 3 * 4
    for request in second:
        assert_greedy_and_exact(model, request)


def test_a_request_arriving_during_a_chunk_ends_it_and_joins_at_the_next_step(policy):
    """A request seen waiting while a row is free ends the running chunk after the step that saw it: it joins
    after one step, not after the chunk's eight. Forwards count only steps that fed a row still running."""
    import dataclasses

    model, _ = policy
    with pytest.raises(ValueError, match="decode_chunk must be at least 1"):
        Scheduler(Engine(model), decode_chunk=-1)
    assert Scheduler(Engine(model)).decode_chunk == 8  # the default for a model without recurrent layers
    scheduler = Scheduler(Engine(model), max_rows=4, decode_chunk=8)
    first, late, seen = Request([5, 6, 7], 30, 0.0), Request([9, 10, 11], 4, 0.0), []
    late.on_token = lambda request: seen or seen.append(len(first.tokens))  # first's tokens when late's first comes
    trunk = scheduler.engine.parts.trunk

    def trunk_that_submits_late(tokens, layers):
        if tokens.shape[1] == 1 and late.adapter_version == -1 and late not in scheduler.waiting:
            scheduler.submit(late)  # arrives while the first decode step of first's chunk is being built
        return trunk(tokens, layers)

    scheduler.engine.parts = dataclasses.replace(scheduler.engine.parts, trunk=trunk_that_submits_late)
    scheduler.submit(first)
    scheduler.step()
    assert len(first.tokens) == 1 and list(scheduler.waiting) == [late]
    while scheduler.busy:
        scheduler.step()
    assert seen == [1 + 8]  # first's one token, then the chunk both rows decoded together
    assert scheduler.decode_forwards == 1 + 8 + 8 + 8 + 4  # first's 30th token fed nothing still running
    for request in (first, late):
        assert_greedy_and_exact(model, request)


def test_a_streamed_requests_first_token_is_read_after_one_step_not_a_chunk(policy):
    """Chunks delay the host's first read of a new request's token by a chunk: a streamed request (a client
    waiting for its first token) steps singly until it has one, then in chunks; the tokens are the same."""
    model, _ = policy
    stepped_at_first, tokens = {}, {}
    for stream in (False, True):
        scheduler = Scheduler(Engine(model), max_rows=4, decode_chunk=8)
        request = Request([5, 6, 7], 20, 0.0, stream=stream)
        request.on_token = lambda r, s=stream: stepped_at_first.setdefault(s, scheduler.counts["rows_stepped"])
        run(scheduler, {0: [request]})
        tokens[stream] = request.tokens
    assert stepped_at_first == {False: 8, True: 1} and tokens[False] == tokens[True]
