"""What the scenes share: a toy vocabulary, seeded random requests, real K/V beside a manager.

No model runs in these scenes (but ``model``), so the "tokens" are ids drawn from ``--seed`` and
shown through a toy vocabulary of short words: the point is where each token's K/V lives, not
what the words mean. The K/V written into the caches are random numbers too, and real:
attention reads them, and the scenes read them back through the block tables.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from minipaged.kit.viz.scene import Event
from minipaged.paged.cache_ops import copy_blocks, reshape_and_cache
from minipaged.paged.paged_attention import gather_kv

VOCAB = (
    "the", "a", "cat", "sat", "on", "mat", "and", "then", "dog", "ran", "to", "park", "it",
    "was", "warm", "day", "we", "saw", "two", "birds", "in", "tree", "they", "sang", "all",
    "noon", "my", "pen", "is", "red", "her", "cup", "of", "tea", "got", "cold", "so", "she",
    "made", "more", "you", "can", "see", "far", "from", "here", "at", "dusk", "sky", "turns",
    "gold", "old", "man", "sells", "figs", "by", "bay", "ship", "sails", "east", "wind", "blew",
    "hard", ".",
)


@dataclass(frozen=True)
class Request:
    """A request: its prompt's token ids and the length it will reach (prompt + output)."""

    seq_id: Hashable
    prompt: tuple[int, ...]
    final_len: int


def random_tokens(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, len(VOCAB), n)]


def random_requests(rng: np.random.Generator, n: int, *, prompt: tuple[int, int],
                    output: tuple[int, int], max_len: int) -> list[Request]:
    """``n`` requests with prompt and output lengths uniform in the given inclusive ranges."""
    out = []
    for i in range(n):
        p = int(rng.integers(prompt[0], prompt[1] + 1))
        final = min(max_len, p + int(rng.integers(output[0], output[1] + 1)))
        out.append(Request(i, tuple(random_tokens(rng, p)), final))
    return out


def words(token_ids: Sequence[int]) -> str:
    return " ".join(VOCAB[t % len(VOCAB)] for t in token_ids)


def ids_text(values: Sequence[int] | np.ndarray, limit: int = 12) -> str:
    """``[0 1 2 ...]`` short enough for one line of a step log."""
    vals = [int(v) for v in values]
    return f"[{' '.join(map(str, vals[:limit]))}{' ...' if len(vals) > limit else ''}]"


def blocks_text(blocks: Sequence[int]) -> str:
    return " ".join(f"#{b}" for b in blocks) or "(none)"


def random_kv(rng: np.random.Generator, t: int, num_kv_heads: int,
              head_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random K and V [T, Hkv, D] for ``t`` new tokens (what a model's projections would give)."""
    return (rng.standard_normal((t, num_kv_heads, head_size)).astype(np.float32),
            rng.standard_normal((t, num_kv_heads, head_size)).astype(np.float32))


class PagedKV:
    """Real K/V arrays beside a ``KVCacheManager`` and a dense record of what each sequence
    wrote, so a scene can show (not claim) that reading through the block table gives back
    exactly what was written, after copies, forks and swaps.

    key_cache, value_cache: [NB, Hkv, BS, D]; written[seq]: (k [T, Hkv, D], v [T, Hkv, D]).
    ``prefix_model``: a token's K/V is a fixed function of the tokens up to it, as in a real
    model, so a prefix-cache hit or a recompute must reproduce a cold run exactly."""

    def __init__(self, manager, rng: np.random.Generator, num_kv_heads: int = 1,
                 head_size: int = 4, *, prefix_model: bool = False) -> None:
        shape = (manager.num_blocks, num_kv_heads, manager.block_size, head_size)
        self.m, self.rng, self.prefix_model = manager, rng, prefix_model
        self.key_cache = np.zeros(shape, np.float32)
        self.value_cache = np.zeros(shape, np.float32)
        self.written: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}

    def write(self, seq_id: Hashable, start: int) -> None:
        """K/V for positions [start, seq_len) of ``seq_id``, scattered to their slots with
        ``reshape_and_cache`` (the caller has applied any pending copies first)."""
        end = self.m.seq_len(seq_id)
        if self.prefix_model:
            k, v = self.model_kv(self.m.token_ids(seq_id), start, end)
        else:
            k, v = random_kv(self.rng, end - start, *self.key_cache.shape[1::2])
        reshape_and_cache(k, v, self.key_cache, self.value_cache,
                          self.m.slot_mapping(seq_id, start, end))
        old_k, old_v = self.written.get(seq_id, (k[:0], v[:0]))
        self.written[seq_id] = (np.concatenate([old_k[:start], k]),
                                np.concatenate([old_v[:start], v]))

    def model_kv(self, tokens, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """K/V [end - start, Hkv, D] of positions [start, end), each a function of its prefix."""
        kvs = [random_kv(np.random.default_rng(hash(tuple(tokens[:p + 1])) % (1 << 63)), 1,
                         *self.key_cache.shape[1::2]) for p in range(start, end)]
        return (np.concatenate([k for k, _ in kvs]), np.concatenate([v for _, v in kvs]))

    def fork(self, parent: Hashable, child: Hashable) -> None:
        self.written[child] = self.written[parent]

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            copy_blocks(self.key_cache, self.value_cache, pairs)

    def decode(self, seq_ids, labels) -> tuple[list[tuple[int, int]], list[Event]]:
        """One decode step of samples that may share blocks: each appends a random token, the
        copy-on-write copies are applied, then the step's K/V written. Returns the copies and
        the step log, ending with the check that every sample reads back intact."""
        m = self.m
        before = {s: m.block_table(s) for s in seq_ids}
        tokens = {s: int(self.rng.integers(0, len(VOCAB))) for s in seq_ids}
        slots = {s: m.append_slot(s, tokens[s]) for s in seq_ids}
        copies = m.take_copies()
        self.copy(copies)  # the copies first, then the step's new K/V
        events = []
        for src, dst in copies:
            who = [labels(s) for s in seq_ids
                   if before[s][-1] == src and m.block_table(s)[-1] == dst]
            events.append(Event("copy", f"#{src} -> #{dst}: {', '.join(who)} wrote into a "
                                        f"shared block, so it gets its own copy first"))
        for s in seq_ids:
            self.write(s, m.seq_len(s) - 1)
            if len(m.block_table(s)) > len(before[s]):
                events.append(Event("block", f"{labels(s)}: last block full, new block "
                                             f"#{m.block_table(s)[-1]}"))
            events.append(Event("append", f"{labels(s)}: \"{VOCAB[tokens[s]]}\" -> slot "
                                          f"{slots[s]}"))
        return copies, events + [self.check(seq_ids)]

    def all_intact(self, seq_ids) -> bool:
        """Every listed sequence reads back, bit for bit, what was written for it (with
        ``prefix_model``: what a cold run of the whole sequence would write)."""
        for s in seq_ids:  # read through the block table as paged attention's oracle does
            k, v = gather_kv(self.key_cache, self.value_cache, np.asarray(self.m.block_table(s)),
                             self.m.seq_len(s))
            if self.prefix_model:
                wk, wv = self.model_kv(self.m.token_ids(s), 0, self.m.seq_len(s))
            else:
                wk, wv = self.written[s]
            if not (np.array_equal(k, wk) and np.array_equal(v, wv)):
                return False
        return True

    def check(self, seq_ids) -> Event:
        """The step log's line saying whether ``all_intact(seq_ids)`` holds."""
        what = "a cold computation" if self.prefix_model else "what was written for it"
        return Event("check", f"every sequence's K/V, read through its block table, equals "
                              f"{what}: {self.all_intact(seq_ids)}")
