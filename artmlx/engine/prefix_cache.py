"""A prefix cache: the KV of sequences the scheduler produced, reused by requests that extend them.

An agent's turn k+1 is turn k's prompt, turn k's sampled reply, then a few new tokens (the template
closing the reply, the environment's answer, the next generation prompt). Without a cache every
turn prefills the whole conversation again; with it, a turn prefills only what is new.

As vLLM's automatic prefix caching and SGLang's radix cache, entries are found by token ids:
- an entry is one finished sequence (its prompt and the sampled tokens fed back, i.e. all but the
  last) with its keys and values for every layer, copied from the batch cache when the request ends
  (the sequences that end together are copied in one gather per layer, and their entries then view
  those buffers: a group, counted once, aged and evicted as one);
- entries are indexed by a chain hash of every whole block of `block` tokens (hash of the previous
  block's hash and this block's ids), so finding the longest cached prefix of a prompt walks its
  blocks once; the match then extends token by token past the last whole block;
- KV depends on the adapter, so each entry belongs to one adapter version and only a request of that
  version may use it (`drop_version` forgets a version's entries when the scheduler forgets it);
- at least one token of a prompt is always prefilled (its logits are what is sampled next);
- bounded by bytes: least recently used entries (with their groups) go first.

Keys were written with RoPE at positions 0..n-1, and a row resumed from an entry continues at
position n, so a hit computes what a full prefill computes (up to the float rounding of a different
kernel order, as decode against prefill).

A model with recurrent layers (`whole_entries`) keeps, for those layers, the state after the entry's
last token, which cannot be cut back to an earlier position: a prompt then reuses an entry only when
the whole entry is its prefix (an agent's next turn extends the previous turn's sequence, so that is
the case that matters; SGLang's Mamba radix cache likewise keeps states at node ends only). Such
entries are found by the hash of all their tokens, per length: the longest entry that is a whole
prefix of the prompt answers, however many entries share its first blocks (a group's samples do).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import mlx.core as mx


def block_chain(tokens: list[int], block: int, known: list[int] | None = None) -> list[int]:
    """Chain hashes of each whole block of `tokens` (the hash of the previous block's hash and this block's ids);
    `known`: those of a prefix of `tokens`, extended rather than computed again."""
    out = list(known or [])
    previous = out[-1] if out else 0
    for start in range(len(out) * block, len(tokens) - block + 1, block):
        previous = hash((previous, tuple(tokens[start:start + block])))
        out.append(previous)
    return out


def shared_length(tokens: list[int], prompt: list[int], limit: int) -> int:
    """How many first tokens `tokens` and `prompt` share, at most `limit`."""
    n, limit = 0, min(limit, len(tokens), len(prompt))
    while n < limit and tokens[n] == prompt[n]:
        n += 1
    return n


def window_held(window: int | None, window_from: int, n: int) -> bool:
    """Whether a row resumed at position n, whose sliding-window layers hold keys from position `window_from` on,
    finds real keys at every position those layers see (n - window + 1 onwards)."""
    return not window_from or n - window + 1 >= window_from


class Prefix(list):
    """A hit: per-layer arrays as `cache_rows.rows_kv` gives them, and `window_from`, the first position whose keys
    the sliding-window layers hold (earlier ones are zeros: they had been dropped before the entry was kept); if
    they are views of a group's buffers, `shared` and the entry's `row` in them."""

    def __init__(self, layers, window_from: int = 0, shared: Shared | None = None, row: int = 0):
        super().__init__(layers)
        self.window_from, self.shared, self.row = window_from, shared, row


@dataclass
class Shared:
    """Buffers that several entries' arrays are views of (sequences kept together, one gather per layer for all
    of them: `layers`, each row padded to the longest): freed when the last of those entries goes, so the cache
    counts them once while any of them lives, and the group is what ages and is evicted (a hit on one of its
    entries keeps them all; evicting one alone would free nothing)."""
    nbytes: int
    layers: list = field(default_factory=list)
    members: set = field(default_factory=set)  # ids of the cache's entries that view these buffers


@dataclass
class Entry:
    version: int
    tokens: list[int]
    kv: list[tuple[mx.array, ...]]  # per layer: (heads, n, head_dim) keys and values, or a recurrent state
    nbytes: int  # its own arrays' bytes (0 when they are views of `shared`)
    window_from: int = 0  # positions below it have zeros in the sliding-window layers (they had been dropped)
    shared: Shared | None = None
    row: int = 0  # its row in `shared`'s buffers


class PrefixCache:
    def __init__(self, max_bytes: int, block: int = 16, whole_entries: bool = False, window: int | None = None):
        self.max_bytes = max_bytes
        self.block = block
        self.whole_entries = whole_entries
        self.window = window  # the model's sliding window, if it has window layers
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()
        self.index: dict[tuple[int, int], int] = {}  # (version, chain hash of the first k blocks) -> entry id
        self.ends: dict[tuple[int, int], dict[int, int]] = {}  # whole entries: (version, length) -> {hash: id}
        self.nbytes = 0
        self._next = 0
        self.lookups = self.hits = self.hit_tokens = self.lookup_tokens = 0

    def _chain(self, tokens: list[int]) -> list[int]:
        return block_chain(tokens, self.block)

    def insert(self, version: int, tokens: list[int], kv: list[tuple[mx.array, mx.array]], window_from: int = 0,
               shared: Shared | None = None, row: int = 0) -> None:
        """Keep `kv` (per layer, for exactly `tokens`) for version `version`; too large for the cache: dropped.
        `window_from`: the first position whose keys the sliding-window layers still held; `shared`: the buffers
        `kv` views, with other entries (counted once), `row` its row in them."""
        nbytes = 0 if shared is not None else sum(a.nbytes for layer in kv for a in layer)
        if len(tokens) < self.block or max(nbytes, shared.nbytes if shared else 0) > self.max_bytes:
            return
        ident, self._next = self._next, self._next + 1
        self.entries[ident] = Entry(version, list(tokens), kv, nbytes, window_from, shared, row)
        self.nbytes += nbytes
        if shared is not None:
            self.nbytes += 0 if shared.members else shared.nbytes
            shared.members.add(ident)
        if self.whole_entries:
            self.ends.setdefault((version, len(tokens)), {})[hash(tuple(tokens))] = ident
        for chain in [] if self.whole_entries else self._chain(tokens):
            self.index[(version, chain)] = ident  # the newest sequence with this prefix answers for it
        while self.nbytes > self.max_bytes:  # the least recently used entry, with the rest of its group
            for ident in self._group(next(iter(self.entries))):
                self._evict(ident)

    def lookup(self, version: int, prompt: list[int]) -> tuple[int, list[tuple[mx.array, mx.array]] | None]:
        """(n, per-layer KV of the first n prompt tokens) for the longest cached prefix, n < len(prompt);
        (0, None) when nothing is cached."""
        self.lookups += 1
        self.lookup_tokens += len(prompt)
        if self.whole_entries:
            return self._lookup_whole(version, prompt)
        found = None
        for chain in reversed(self._chain(prompt[:-1])):
            ident = self.index.get((version, chain))
            if ident is not None and ident in self.entries:
                found = ident
                break
        if found is None:
            return 0, None
        entry = self.entries[found]
        self._touch(found)
        n = shared_length(entry.tokens, prompt, len(prompt) - 1)  # hashes chose it; the ids decide
        if n == 0 or not window_held(self.window, entry.window_from, n):
            return 0, None
        self.hits += 1
        self.hit_tokens += n
        return n, Prefix([(k[:, :n], v[:, :n]) for k, v in entry.kv], entry.window_from, entry.shared, entry.row)

    def count_hit(self, new_hit: bool, tokens: int) -> None:
        """Count a hit found outside the cache (a running row of the scheduler's batch: `new_hit`), or `tokens`
        more of a prompt than the cache's own hit gave."""
        self.hits += int(new_hit)
        self.hit_tokens += tokens

    def _lookup_whole(self, version: int, prompt: list[int]):
        lengths = sorted((n for v, n in self.ends if v == version and self.block <= n < len(prompt)), reverse=True)
        for n in lengths:
            ident = self.ends[(version, n)].get(hash(tuple(prompt[:n])))
            if (ident is not None and self.entries[ident].tokens == prompt[:n]  # the hash chose it; the ids decide
                    and window_held(self.window, self.entries[ident].window_from, n)):
                self._touch(ident)
                self.hits += 1
                self.hit_tokens += n
                entry = self.entries[ident]
                return n, Prefix(entry.kv, entry.window_from, entry.shared, entry.row)
        return 0, None

    def _group(self, ident: int) -> list[int]:
        """`ident` and the other entries that view its buffers, oldest first."""
        shared = self.entries[ident].shared
        return sorted(shared.members) if shared is not None else [ident]

    def _touch(self, ident: int) -> None:
        """`ident` and the rest of its group become the most recently used."""
        for member in self._group(ident):
            self.entries.move_to_end(member)

    def drop_version(self, version: int) -> None:
        for ident in [i for i, e in self.entries.items() if e.version == version]:
            self._evict(ident)

    def _evict(self, ident: int) -> None:
        entry = self.entries.pop(ident)
        self.nbytes -= entry.nbytes
        if entry.shared is not None:
            entry.shared.members.discard(ident)
            self.nbytes -= 0 if entry.shared.members else entry.shared.nbytes
        ends = self.ends.get((entry.version, len(entry.tokens)), {})
        if ends.get(hash(tuple(entry.tokens))) == ident:
            del ends[hash(tuple(entry.tokens))]
            if not ends:
                del self.ends[(entry.version, len(entry.tokens))]
        for chain in self._chain(entry.tokens):
            if self.index.get((entry.version, chain)) == ident:
                del self.index[(entry.version, chain)]

    @property
    def stats(self) -> dict:
        return {"prefix_lookups": self.lookups, "prefix_hits": self.hits, "prefix_hit_tokens": self.hit_tokens,
                "prefix_lookup_tokens": self.lookup_tokens, "prefix_cache_bytes": self.nbytes,
                "prefix_cache_entries": len(self.entries)}
