"""Sliding-window families (Gemma 3/4, GPT-OSS): bounded window memory, the mask shortcut, and window
layers through joins, compaction and prefix-cache hits, against mlx-lm's own forward."""

import mlx.core as mx
import numpy as np
import pytest

from artmlx.model.policy import LoraSpec, load_policy


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "gemma4_text"])
def test_window_layers_hold_only_what_a_row_can_still_see(folders, family):
    """Bounded window memory (window 8, cache blocks of 4 slots so that trimming starts early): rows of
    different lengths decode 40 tokens in the engine; the window layers' buffers hold a few blocks past the
    window while full-attention layers hold every slot, and every row's logits are mlx-lm's own forward's."""
    from artmlx.engine.cache import LayerKV
    from artmlx.engine.generate import Engine

    model, _, _ = load_policy(str(folders[family]), LoraSpec(rank=4))
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 100, n).tolist() for n in (5, 17, 9)]
    engine = Engine(model, cache_block=4)
    cache = engine.new_cache(3)
    logits = engine.prefill(cache, prompts)
    tokens, logprobs, _ = engine.decode(cache, logits, mx.random.key(1), temperature=1.0, max_tokens=40,
                                        stop_tokens=[-1])
    bounded = [layer for layer in cache.layers if isinstance(layer, LayerKV) and layer.bounded]
    full = [layer for layer in cache.layers if isinstance(layer, LayerKV) and not layer.bounded]
    assert bounded and full and cache.state.window_base > 0
    assert bounded[0].keys.shape[2] <= cache.used - cache.state.window_base + 4
    assert bounded[0].keys.shape[2] < 8 + 3 * 4 < cache.used <= full[0].keys.shape[2]
    for row, prompt in enumerate(prompts):
        sequence = prompt + tokens[row].tolist()
        reference = model(mx.array([sequence[:-1]]))[0, len(prompt) - 1:].astype(mx.float32)
        expected = np.array(mx.take_along_axis(reference - mx.logsumexp(reference, axis=-1, keepdims=True),
                                               mx.array(tokens[row])[:, None], axis=-1)[:, 0])
        np.testing.assert_allclose(logprobs[row], expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_a_dense_cache_inside_the_window_gives_window_layers_no_mask_array(folders, family):
    """Window 8: a sequence whose every slot lies inside every query's window gives the window layers None /
    "causal" (MLX's fused attention), with the logits of the array-masked path exactly; from the step where
    the oldest slot leaves the window, and in a ragged cache, they get the window mask array again."""
    from artmlx.engine.cache import LayerKV
    from artmlx.engine.cache import make_ragged_cache
    from artmlx.engine.generate import Engine
    from tests.engine.test_generate import _decode_logits

    model, _, _ = load_policy(str(folders[family]), LoraSpec(rank=4))
    sequence, steps = [5, 17, 3, 9], [7, 42, 9, 11, 2, 30]  # 4 + 6 slots: the last steps pass the window of 8
    seen = []
    original = LayerKV.make_mask

    def recording(self, N, return_array=False, window_size=None, **kwargs):
        mask = original(self, N, return_array, window_size=window_size, **kwargs)
        if window_size is not None:
            seen.append((self.state.used, N, None if mask is None or isinstance(mask, str) else mask.shape))
        return mask

    LayerKV.make_mask = recording
    try:
        fast = _decode_logits(model, make_ragged_cache(model, 1), sequence, steps, array_masks=False)
    finally:
        LayerKV.make_mask = original
    # the prefill (4 slots) and the steps up to slot 7 need no array; the step at slot 8 does (8 - 0 >= 8)
    assert [shape is None for used, n, shape in seen] == [used + n - 1 < 8 for used, n, _ in seen]
    assert any(shape is None for *_, shape in seen) and any(shape is not None for *_, shape in seen)
    exact = _decode_logits(model, make_ragged_cache(model, 1), sequence, steps, array_masks=True)
    assert np.array_equal(fast, exact)

    ragged = make_ragged_cache(model, 2)
    Engine(model).prefill(ragged, [[3, 4, 5], [6, 7]])
    assert isinstance(ragged.layers[0].make_mask(1, window_size=8), mx.array)
    dense = make_ragged_cache(model, 1)
    Engine(model).prefill(dense, [sequence])
    assert dense.layers[0].make_mask(1, window_size=8) is None
    assert isinstance(dense.layers[0].make_mask(1, return_array=True, window_size=8), mx.array)
    dense.state.window_dropped[0] = 1  # zeros for slots a join or compaction moved: the mask must hide them
    assert isinstance(dense.layers[0].make_mask(1, window_size=8), mx.array)


def test_window_layers_trim_through_joins_compaction_and_prefix_hits(folders):
    """The scheduler on Gemma 3 with 4-slot blocks: rows join (caches trimmed to different slots),
    long rows leave (compaction moves their dropped slots to the front as zeros), and follow-up turns
    reuse a kept sequence only where its window layers still hold the keys a resumed row attends to.
    Every greedy sequence is the one it gets alone from mlx-lm's forward."""
    from artmlx.engine.generate import Engine
    from artmlx.engine.scheduler import Request, Scheduler
    from tests.engine.test_scheduler import assert_greedy_and_exact, run

    model, _, _ = load_policy(str(folders["gemma3_text"]), LoraSpec(rank=4))
    rng = np.random.default_rng(3)
    prompt = lambda n: rng.integers(3, 100, n).tolist()  # noqa: E731
    scheduler = Scheduler(Engine(model, cache_block=4), max_rows=4, prefix_cache_bytes=1 << 24)
    arrivals = {0: [Request(prompt(5), 30, 0.0), Request(prompt(40), 6, 0.0)],
                9: [Request(prompt(3), 25, 0.0), Request(prompt(160), 4, 0.0)], 20: [Request(prompt(9), 12, 0.0)]}
    run(scheduler, arrivals)
    first = [r for rs in arrivals.values() for r in rs]
    kept = list(scheduler.prefix.entries.values())
    assert any(entry.window_from > 0 for entry in kept)  # some sequences were kept after their windows trimmed
    follow = [Request(r.prompt + r.tokens + prompt(4), 10, 0.0) for r in first]
    run(scheduler, {0: follow})
    assert all(entry.window_from <= len(entry.tokens) for entry in kept)
    assert scheduler.counts["compactions"] >= 1 and scheduler.prefix.stats["prefix_hits"] >= 1
    # a prompt sharing only the start of a trimmed sequence: the window layers of a row resumed there would
    # need keys the sequence no longer held, so it is not a hit (prefilled in full instead)
    trimmed = max(kept, key=lambda entry: entry.window_from)
    assert trimmed.window_from >= 14
    hits = scheduler.prefix.stats["prefix_hits"]
    partial = Request(trimmed.tokens[: trimmed.window_from + 2] + prompt(3), 6, 0.0)
    run(scheduler, {0: [partial]})
    assert scheduler.prefix.stats["prefix_hits"] == hits
    for request in first + follow + [partial]:
        assert request.finish_reason == "length"
        assert_greedy_and_exact(model, request)


def test_compaction_after_window_layers_dropped_slots_keeps_every_row_exact(folders):
    """A long row leaves once the window layers have dropped the slots below its window (their buffers start
    at `window_base` > 0); compaction then gathers the survivors' slots from those buffers. Slots below the
    base must read as zeros, not wrap around (argsort's indices are unsigned: `order - base` underflowed
    and the gather read past the buffer, a segfault on the CPU)."""
    from artmlx.engine.generate import Engine
    from artmlx.engine.scheduler import Request, Scheduler
    from tests.engine.test_scheduler import assert_greedy_and_exact, run

    model, _, _ = load_policy(str(folders["gemma3_text"]), LoraSpec(rank=4))
    rng = np.random.default_rng(3)
    prompt = lambda n: rng.integers(3, 100, n).tolist()  # noqa: E731
    scheduler = Scheduler(Engine(model, cache_block=4), max_rows=4, decode_chunk=1)
    arrivals = {0: [Request(prompt(5), 30, 0.0), Request(prompt(40), 6, 0.0)],
                9: [Request(prompt(3), 25, 0.0), Request(prompt(160), 8, 0.0)]}
    run(scheduler, arrivals)
    assert scheduler.counts["compactions"] >= 1
    for request in [r for rs in arrivals.values() for r in rs]:
        assert request.finish_reason == "length"
        assert_greedy_and_exact(model, request)


def test_a_prompt_starting_like_a_running_row_uses_its_window_keys_only_where_held(folders):
    """A new prompt that extends a decoding row's whole sequence on Gemma 3 (window 8, 4-slot blocks) starts from
    that row's KV, copied out of the running batch after its window layers dropped old slots; one that shares only
    the row's first positions, whose window keys are gone, is prefilled in full. Both are exact."""
    from artmlx.engine.generate import Engine
    from artmlx.engine.scheduler import Request, Scheduler
    from tests.engine.test_scheduler import assert_greedy_and_exact, run

    model, _, _ = load_policy(str(folders["gemma3_text"]), LoraSpec(rank=4))
    rng = np.random.default_rng(5)
    prompt = lambda n: rng.integers(3, 100, n).tolist()  # noqa: E731
    scheduler = Scheduler(Engine(model, cache_block=4), max_rows=4, prefix_cache_bytes=1 << 24, decode_chunk=1)
    long = scheduler.submit(Request(prompt(20), 40, 0.0))  # a whole 16-token block to share
    for _ in range(30):
        scheduler.step()
    assert scheduler.batches[0].cache.state.window_base > 0
    whole = Request(long.prompt + long.tokens + prompt(3), 5, 0.0)
    early = Request(long.prompt + long.tokens[:2] + prompt(3), 5, 0.0)  # its window would need keys now gone
    prefilled = scheduler.prefill_tokens
    run(scheduler, {0: [whole, early]})
    assert scheduler.counts["running_prefixes"] == 1 and scheduler.prefill_tokens == prefilled + 3 + len(early.prompt)
    for request in (long, whole, early):
        assert_greedy_and_exact(model, request)
