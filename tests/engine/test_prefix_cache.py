"""The prefix cache in the scheduler: a prompt that extends a finished sequence prefills only its new tokens,
and what it samples is what a full forward of the sequence alone gives; no KV crosses adapter versions."""

import mlx.core as mx
import numpy as np
import pytest

from artmlx.engine.generate import Engine
from artmlx.engine.prefix_cache import PrefixCache
from artmlx.engine.scheduler import Request, Scheduler
from artmlx.model.policy import adapter_weights
from tests.engine.test_scheduler import assert_greedy_and_exact, reference_logprobs, run
from tests.helpers import tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(perturb=0.02)


def prompt(rng, n):
    return [int(t) for t in rng.integers(6, 100, size=n)]


def test_turns_that_extend_a_finished_sequence_prefill_only_their_new_tokens(policy):
    model, _ = policy
    rng = np.random.default_rng(1)
    scheduler = Scheduler(Engine(model), max_rows=8, prefix_cache_bytes=64 << 20)
    first = [Request(prompt(rng, 40), 10, 0.0) for _ in range(3)]
    run(scheduler, {0: first})
    assert scheduler.prefill_tokens == 120 and scheduler.prefix.hits == 0
    # the next turn of each: its whole history, then 5 new tokens (the environment's answer)
    second = [Request(r.prompt + r.tokens + prompt(rng, 5), 10, 0.0) for r in first]
    run(scheduler, {0: second})
    assert scheduler.prefix.hits == 3 and scheduler.prefill_tokens == 120 + 3 * 5
    for request in second:
        assert_greedy_and_exact(model, request)
    # a shorter prompt inside a cached sequence reuses all of it but its last token
    inner = Request(first[0].prompt[:30], 4, 0.0)
    run(scheduler, {0: [inner]})
    assert scheduler.prefill_tokens == 120 + 15 + 1
    assert_greedy_and_exact(model, inner)


def test_a_prompt_starting_like_a_running_row_copies_that_rows_kv(policy):
    """A group's shared first turn whose requests arrive in two admissions: the later ones start from the KV of
    a row still decoding (its prompt's slots copied out of the batch's cache), not from a full prefill."""
    model, _ = policy
    rng = np.random.default_rng(8)
    scheduler = Scheduler(Engine(model), max_rows=4, prefix_cache_bytes=64 << 20, decode_chunk=1)
    shared = prompt(rng, 40)
    first = scheduler.submit(Request(list(shared), 12, 1.0))
    for _ in range(3):
        scheduler.step()
    late = [scheduler.submit(Request(list(shared), 12, 1.0)) for _ in range(2)]
    scheduler.step()
    assert scheduler.prefill_tokens == 40 + 1 and scheduler.counts["running_prefixes"] == 1
    while scheduler.busy:
        scheduler.step()
    for request in (first, *late):
        logprobs, _ = reference_logprobs(model, request, 1.0)
        np.testing.assert_allclose(request.logprobs, logprobs, atol=2e-3)


def test_identical_prompts_are_prefilled_once(policy):
    model, _ = policy
    rng = np.random.default_rng(2)
    scheduler = Scheduler(Engine(model), max_rows=8, prefix_cache_bytes=64 << 20)
    shared = prompt(rng, 30)
    group = [Request(list(shared), 6, 1.0) for _ in range(6)]
    run(scheduler, {0: group})
    assert scheduler.prefill_tokens == 30
    assert len({tuple(r.tokens) for r in group}) > 1  # the rows sample on their own after the shared prefill


def test_a_new_adapter_never_reuses_the_old_ones_kv(policy):
    model, _ = policy
    rng = np.random.default_rng(3)
    scheduler = Scheduler(Engine(model), max_rows=4, prefix_cache_bytes=64 << 20)
    first = Request(prompt(rng, 40), 8, 0.0)
    run(scheduler, {0: [first]})
    old = adapter_weights(model)
    new = {name: value + 0.05 * mx.random.normal(value.shape, key=mx.random.key(7)) for name, value in old.items()}
    scheduler.set_adapter(1, new)
    extended = Request(first.prompt + first.tokens + [7, 8, 9], 8, 0.0)
    run(scheduler, {0: [extended]})
    assert scheduler.prefix.hits == 0 and extended.adapter_version == 1
    assert_greedy_and_exact(model, extended)  # the model now holds version 1's tensors
    # the old version's entries went with it; version 1's own sequence is reused by version 1
    assert all(entry.version == 1 for entry in scheduler.prefix.entries.values())
    again = Request(extended.prompt + extended.tokens + [10], 4, 0.0)
    run(scheduler, {0: [again]})
    assert scheduler.prefix.hits == 1
    assert_greedy_and_exact(model, again)
    model.load_weights(list(old.items()), strict=False)


def test_a_small_budget_evicts_least_recently_used_and_stays_exact(policy):
    model, _ = policy
    rng = np.random.default_rng(4)
    probe = Scheduler(Engine(model), max_rows=4, prefix_cache_bytes=64 << 20)
    one = Request(prompt(rng, 40), 8, 0.0)
    run(probe, {0: [one]})
    entry_bytes = probe.prefix.nbytes
    scheduler = Scheduler(Engine(model), max_rows=4, prefix_cache_bytes=int(entry_bytes * 1.5))
    requests = [Request(prompt(rng, 40), 8, 0.0) for _ in range(3)]
    for request in requests:
        run(scheduler, {0: [request]})
    assert len(scheduler.prefix.entries) == 1 and scheduler.prefix.nbytes <= scheduler.prefix.max_bytes
    hits = []
    for request in reversed(requests):  # only the newest is still cached; each continuation is exact either way
        follow = Request(request.prompt + request.tokens + [5, 6], 6, 0.0)
        run(scheduler, {0: [follow]})
        assert_greedy_and_exact(model, follow)
        hits.append(scheduler.prefix.hits)
    assert hits == [1, 1, 1]  # the newest hit; the two evicted ones were prefilled in full


def test_lookup_matches_token_by_token_past_the_last_whole_block():
    cache = PrefixCache(1 << 20, block=4)
    kv = [(mx.arange(10.0).reshape(1, 10, 1), mx.arange(10.0).reshape(1, 10, 1))]
    cache.insert(0, list(range(10)), kv)
    n, got = cache.lookup(0, list(range(7)) + [99, 98])
    assert n == 7 and np.array(got[0][0]).ravel().tolist() == list(range(7))
    assert cache.lookup(1, list(range(10)))[0] == 0  # another adapter version
    assert cache.lookup(0, [0, 1, 2])[0] == 0  # shorter than a block
    assert cache.lookup(0, list(range(10)))[0] == 9  # at least one token is left to prefill


def test_a_recurrent_models_entries_are_reused_whole_or_not_at_all():
    """A recurrent layer's state belongs to an entry's last token: a prompt that shares only part of an
    entry gets no hit from it, but an older, shorter entry that it extends whole still answers."""
    cache = PrefixCache(1 << 20, block=4, whole_entries=True)
    state = lambda n: [(mx.zeros((1, n, 1)), mx.zeros((1, n, 1))), (mx.full((3,), float(n)),)]  # noqa: E731
    cache.insert(0, list(range(8)), state(8))
    cache.insert(0, list(range(12)), state(12))  # the newest entry with the first 8 tokens' blocks
    n, got = cache.lookup(0, list(range(12)) + [50])
    assert n == 12 and float(got[1][0][0]) == 12
    n, got = cache.lookup(0, list(range(10)) + [50, 51])  # inside the 12-token entry: only the 8 one is whole
    assert n == 8 and float(got[1][0][0]) == 8 and got[0][0].shape[1] == 8
    assert cache.lookup(0, list(range(6)) + [50, 51, 52])[0] == 0  # no entry is a whole prefix of it
    assert cache.lookup(0, list(range(8)))[0] == 0  # the whole prompt cached: one token must be prefilled


def test_sequences_kept_together_are_one_gather_per_layer_counted_once(policy):
    """`rows_kv` gathers the rows that end together into one buffer per layer (views per row, exactly each
    row's real slots in position order, cut at its end), `group_bytes` splits them; the prefix cache counts a
    group's buffers once, until its last entry is evicted."""
    from artmlx.engine.cache_rows import rows_kv

    model, _ = policy
    engine = Engine(model)
    cache = engine.new_cache(3)
    rng = np.random.default_rng(5)
    engine.prefill(cache, [prompt(rng, n) for n in (7, 20, 12)])
    cache.state.valid = mx.concatenate([cache.state.valid[:, :4], mx.zeros((3, 2), mx.bool_),  # holes in every row
                                        cache.state.valid[:, 4:]], axis=1)
    for layer in cache.layers:
        pad = mx.zeros((3, layer.keys.shape[1], 2, layer.keys.shape[3]), layer.keys.dtype)
        layer.keys = mx.concatenate([layer.keys[:, :, :4], pad, layer.keys[:, :, 4:]], axis=2)
        layer.values = mx.concatenate([layer.values[:, :, :4], pad, layer.values[:, :, 4:]], axis=2)
    cache.state.used += 2
    cache.state.dense = False
    rows, ends = [2, 0, 1], [12, 7, 15]
    together = rows_kv(cache, rows, ends)
    assert len({id(shared) for _, shared, _ in together}) == 1
    valid = np.array(cache.state.valid)
    for (kv, _, _), row, end in zip(together, rows, ends):
        slots = np.flatnonzero(valid[row])[:end]
        for layer, (k, v) in zip(cache.layers, kv):
            assert k.shape[1] == end
            assert np.array_equal(np.array(k), np.array(layer.keys[row])[:, slots])
            assert np.array_equal(np.array(v), np.array(layer.values[row])[:, slots])
    one_row = together[0][1].nbytes // 3  # every row is padded to the longest, 15 positions
    split = rows_kv(cache, rows, ends, group_bytes=2 * one_row)
    assert [id(shared) for _, shared, _ in split][:2] == [id(split[0][1])] * 2 and split[2][1] is not split[0][1]
    for (kv, _, _), (again, _, _) in zip(together, split):
        assert all(np.array_equal(np.array(a), np.array(b)) for x, y in zip(kv, again) for a, b in zip(x, y))
    short = rows_kv(cache, rows, [2, 1, 15])  # padding to 15 would be more than the real slots: a group apart
    assert short[0][1] is short[1][1] is not short[2][1] and short[0][1].nbytes == 2 * one_row * 2 // 15

    prefix = PrefixCache(together[0][1].nbytes, block=4)
    for i, (kv, shared, row) in enumerate(together):
        prefix.insert(0, list(range(100 * i, 100 * i + ends[i])), kv, shared=shared, row=row)
    assert len(prefix.entries) == 3 and prefix.nbytes == together[0][1].nbytes
    prefix.insert(0, list(range(500, 507)), [(k[:, :7], v[:, :7]) for k, v in together[1][0]])  # its own arrays
    # over budget: the least recently used go until the group's last one is gone and its buffers are freed
    assert list(prefix.entries) == [3] and prefix.nbytes == sum(a.nbytes for kv in together[1][0] for a in kv)
    assert not together[0][1].members


def test_a_cache_built_from_a_groups_buffers_equals_one_built_row_by_row(policy):
    """Prefixes that view one group's buffers (in another order, one cut short, beside a row of its own and
    a row without a prefix) give the cache the same real slots as copies of each prefix would."""
    from artmlx.engine.cache_rows import cache_with_prefixes, rows_kv
    from artmlx.engine.prefix_cache import Prefix

    model, _ = policy
    engine = Engine(model)
    source = engine.new_cache(3)
    rng = np.random.default_rng(6)
    engine.prefill(source, [prompt(rng, n) for n in (9, 17, 13)])
    kept = rows_kv(source, [0, 1, 2], [9, 17, 13])
    cuts = [(kept[2], 13), (kept[0], 5), (None, 0), (kept[1], 17)]
    views = [None if item is None else Prefix([(k[:, :n], v[:, :n]) for k, v in item[0]], 0, item[1], item[2])
             for item, n in cuts]
    copies = [None if p is None else [tuple(mx.array(np.array(a)) for a in layer) for layer in p] for p in views]
    own = Prefix([tuple(mx.array(np.array(a)) for a in layer) for layer in kept[1][0]])  # a row of its own
    views.append(own)
    copies.append(list(own))
    built, expected = cache_with_prefixes(engine.new_cache(1), views), cache_with_prefixes(engine.new_cache(1), copies)
    valid = np.array(expected.state.valid)
    assert np.array_equal(np.array(built.state.valid), valid) and built.state.used == expected.state.used == 17
    for got, want in zip(built.layers, expected.layers):
        for a, b in ((got.keys, want.keys), (got.values, want.values)):
            a, b = np.array(a), np.array(b)
            assert a.shape == b.shape and all(np.array_equal(a[r][:, valid[r]], b[r][:, valid[r]]) for r in range(5))


def test_a_group_ages_and_goes_as_one():
    """Entries that view one group's buffers: a hit on one keeps the whole group; past the budget the least
    recently used group goes whole (evicting one entry of a group would free nothing)."""
    from artmlx.engine.prefix_cache import Shared

    cache = PrefixCache(2 * 800, block=4)
    groups = [Shared(800) for _ in range(3)]
    view = [(mx.zeros((1, 8, 1)), mx.zeros((1, 8, 1)))]
    for g, shared in enumerate(groups[:2]):
        for row in range(4):
            cache.insert(0, [g * 100 + row * 10 + t for t in range(8)], view, shared=shared, row=row)
    assert len(cache.entries) == 8 and cache.nbytes == 1600
    assert cache.lookup(0, [0 + t for t in range(8)] + [99])[0] == 8  # group 0's first entry: group 0 is newest
    cache.insert(0, [500 + t for t in range(8)], view, shared=groups[2], row=0)
    assert cache.nbytes == 1600 and not groups[1].members and len(groups[0].members) == 4
    assert sorted(e.shared is groups[0] for e in cache.entries.values()) == [False] + [True] * 4
