"""KV copied out of a batch's rows for other prompts: a finished row's sequence into the prefix cache
(`keep_finished_rows`), and a running row's prefix for a new prompt that starts like it (`RowPrefixes`: a group's
shared first turn whose requests came in two admissions, a shared system prompt), instead of a full prefill."""

from __future__ import annotations

import mlx.core as mx

from .cache_rows import rows_kv, windows_from
from .prefix_cache import Prefix, PrefixCache, block_chain, shared_length, window_held
from .request import Batch


def keep_finished_rows(prefix: PrefixCache, batch: Batch, rows: list[int], past_end: dict[int, int]) -> None:
    """Keep the KV of requests that ended normally (prompt and every sampled token, all fed back), copied out
    together (`rows_kv`: one gather per layer, a quarter of the prefix cache at most), queued and not waited for:
    they read this step's forward, and waiting would leave the device idle while the host builds the next step.
    A row fed `past_end[row]` tokens past its end inside a chunk is cut at its end (no KV of other tokens);
    a recurrent state cannot be cut, so such a row of a model with recurrent layers is not kept."""
    rows = [row for row in rows if batch.running[row].finish_reason in ("stop", "length")
            and not (batch.cache.recurrent and past_end[row])]
    if not rows:
        return
    kvs = rows_kv(batch.cache, rows, [len(batch.running[row].prompt) + len(batch.running[row].tokens) for row in rows],
                  group_bytes=prefix.max_bytes // 4)
    mx.async_eval([shared.layers for shared in {id(s): s for _, s, _ in kvs}.values()])  # not each view
    for row, (kv, shared, index), held_from in zip(rows, kvs, windows_from(batch.cache, rows)):
        request = batch.running[row]
        prefix.insert(batch.version, request.prompt + request.tokens, kv, held_from, shared, index)


class RowPrefixes:
    """Finds, for prompts being admitted under one adapter version, the longest prefix a running row of that
    version's batch holds. Each row's block-chain hashes (as the prefix cache's) are kept across admissions and
    extended as the row grows, not hashed again."""

    def __init__(self, block: int):
        self.block = block
        self.chains: dict[int, dict[int, tuple]] = {}  # by version: id(request) -> (request, its chain hashes)

    def find(self, batch: Batch, prompts: list[list[int]], longer_than: list[int]) -> dict[int, tuple[int, Prefix]]:
        """{index of a prompt: (n, the KV of its first n tokens)} for prompts a running row of `batch` holds more
        of than `longer_than[i]` tokens (at most all but the prompt's last). Every token of a running row is in its
        cache row. Not for a model with recurrent layers: a row's state is after its every token and cannot be cut
        back; nor where a row's window layers no longer hold keys the resumed prompt would see."""
        if batch.cache.recurrent:
            return {}
        sequences = [r.prompt + r.tokens for r in batch.running]
        known = self.chains.get(batch.version, {})
        earlier = [known[id(r)][1] if known.get(id(r), (None,))[0] is r else None for r in batch.running]
        self.chains[batch.version] = chains = {id(r): (r, block_chain(sequence, self.block, hashes))
                                               for r, sequence, hashes in zip(batch.running, sequences, earlier)}
        index = {}  # chain hash of a row's first blocks -> the row
        for row, request in enumerate(batch.running):
            for chain in chains[id(request)][1]:
                index.setdefault(chain, row)
        found = {}  # prompt -> (row, tokens of it the row holds)
        for i, prompt in enumerate(prompts):
            blocks = block_chain(prompt[:-1], self.block)
            k = next((k for k in range(len(blocks) - 1, -1, -1) if blocks[k] in index), None)
            if k is None:
                continue
            row = index[blocks[k]]
            n = shared_length(sequences[row], prompt, len(prompt) - 1)  # hashes chose it; the ids decide
            if n > longer_than[i]:
                found[i] = (row, n)
        if not found:
            return {}
        rows = [row for row, _ in found.values()]
        kvs, held = rows_kv(batch.cache, rows, [n for _, n in found.values()]), windows_from(batch.cache, rows)
        return {i: (n, Prefix(kv, held_from, shared, member))
                for (i, (_, n)), (kv, shared, member), held_from in zip(found.items(), kvs, held)
                if window_held(batch.cache.state.window, held_from, n)}

    def forget_except(self, versions) -> None:
        """Drop the rows' hashes of versions that have no batch any more."""
        self.chains = {v: chains for v, chains in self.chains.items() if v in versions}
