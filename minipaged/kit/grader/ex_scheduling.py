"""Hidden cases for exercises 10 (prefix cache) and 11 (preemption).

Exercise 10 is replayed against a reference that follows the exercise's rules 1-5 to the letter,
so block ids, cached-token counts and the LRU queue's order must match exactly; one case replaces
the learner's hash function with a colliding one, to show that hits check token ids (the rule
of this exercise, as in nano-vllm's nanovllm/engine/block_manager.py; vLLM itself looks a hit
up by hash alone, vllm/v1/core/block_pool.py get_cached_block). Exercise 11 is
compared with the rules written in its docstring on random batches.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.grader.core import Exercise, agree, equal, expect, rejects

EX_10 = Exercise("10_prefix_cache", "prefix caching: chained block hashes and an LRU free queue",
                 ("block_hashes", "PrefixCache"))


class _RefPrefixCache:
    """The rules of exercise 10, written out again for replay (hash function injectable)."""

    def __init__(self, nb: int, bs: int, hash_fn) -> None:
        self.bs, self.hash_fn, self.ref = bs, hash_fn, [0] * nb
        self.queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(nb))  # LRU 1st
        self.h2b: dict[int, int] = {}                     # hash -> cached block
        self.cached: dict[int, tuple[int, tuple]] = {}    # cached block -> (hash, token ids)

    def hashes(self, toks):
        out, parent = [], -1
        for i in range(len(toks) // self.bs):
            parent = self.hash_fn(parent, toks[i * self.bs:(i + 1) * self.bs])
            out.append(parent)
        return out

    def allocate(self, toks):
        bs, n, hs = self.bs, len(toks), self.hashes(toks)
        block = lambda i: tuple(toks[i * bs:(i + 1) * bs])  # noqa: E731 - tokens of block i
        hits = []
        for i, h in enumerate(hs):
            b = self.h2b.get(h)
            if (i + 1) * bs > n - 1 or b is None or self.cached[b][1] != block(i):
                break
            hits.append(b)
        fresh = cdiv(n, bs) - len(hits)
        if fresh > len(self.queue) - sum(self.ref[b] == 0 for b in hits):
            raise RuntimeError("out of blocks")
        for b in hits:
            if self.ref[b] == 0:
                self.queue.pop(b)
            self.ref[b] += 1
        table = list(hits)
        for i in range(len(hits), len(hits) + fresh):
            b, _ = self.queue.popitem(last=False)
            if b in self.cached:                           # evicted: its contents are gone
                del self.h2b[self.cached.pop(b)[0]]
            self.ref[b] = 1
            table.append(b)
            if i < len(hs) and hs[i] not in self.h2b:
                self.h2b[hs[i]], self.cached[b] = b, (hs[i], block(i))
        return table, len(hits) * bs

    def free(self, table):
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue[b] = None


def _replay(m, rng, nb: int, bs: int, prompts: list[list[int]], steps: int, hash_fn) -> None:
    cache, ref = m.PrefixCache(nb, bs), _RefPrefixCache(nb, bs, hash_fn)
    state = lambda: {"num_free_blocks": cache.num_free_blocks,  # noqa: E731
                     "free_queue": list(cache.free_queue), "ref_counts": list(cache.ref_counts),
                     "hash_to_block": dict(cache.hash_to_block)}
    live: list[list[int]] = []
    log: list[str] = [f"PrefixCache({nb}, {bs})"]
    for _ in range(steps):
        if live and rng.random() < 0.45:
            table = live.pop(int(rng.integers(len(live))))
            cache.free(table)
            ref.free(table)
            log.append(f"free({table})")
            if any(ref.ref[b] == 0 for b in table):  # a block nobody holds now: no owner
                log.append(f"free({table}) again")
                rejects(lambda table=table: cache.free(table), ValueError,
                        "a double free (a block's count is already 0) must raise ValueError",
                        dict(operations=log[-8:]), state=state,
                        hint="look at each count before lowering it: at 0 the block has no owner "
                             "left, and freeing it again is a bug to report")
        else:
            toks = list(prompts[int(rng.integers(len(prompts)))])
            toks += [int(t) for t in rng.integers(0, 5, size=int(rng.integers(0, 2 * bs)))]
            toks = toks or [1]
            inputs = dict(operations=log[-8:], token_ids=toks)
            try:
                want = ref.allocate(toks)
            except RuntimeError:
                log.append(f"allocate({toks}) -> out of blocks")
                rejects(lambda toks=toks: cache.allocate(toks), RuntimeError,
                        "out of blocks must raise RuntimeError", inputs, state=state)
                continue
            got = cache.allocate(toks)
            log.append(f"allocate(<{len(toks)} tokens>) -> {want}")
            equal((list(got[0]), int(got[1])), want, "wrong (block_table, cached tokens)", inputs)
            live.append(want[0])
        equal(list(cache.free_queue), list(ref.queue), "free queue order (LRU first) differs",
              dict(operations=log[-8:]))
    for table in live:
        cache.free(table)
    equal(cache.num_free_blocks, nb, "freeing everything returns every block",
          dict(operations=log[-8:]))


@EX_10.case("block_hashes: full blocks only, chained",
            hint="each hash takes the previous block's hash as its parent; a partial last "
                 "block gets none")
def _hashes(m):
    rng = np.random.default_rng(22)
    cases = []
    for _ in range(30):
        bs = int(rng.choice([1, 2, 4, 16]))
        cases.append(([int(t) for t in rng.integers(0, 50, size=int(rng.integers(0, 70)))], bs))
    agree(m.block_hashes, lambda toks, bs: _RefPrefixCache(1, bs, m.hash_block).hashes(toks),
          cases, "wrong block hashes", convert=list)
    a, b = m.block_hashes([1, 2, 3, 4], 2), m.block_hashes([9, 9, 3, 4], 2)
    expect(a[1] != b[1], "equal blocks after different prefixes must hash differently",
           inputs="[1, 2, 3, 4] vs [9, 9, 3, 4], BS=2", expected="two different hashes",
           got=(a[1], b[1]), hint="chain each hash to its parent's")


@EX_10.case("the same prompt twice: full blocks hit, the last token is recomputed",
            hint="the model needs the logits of the last prompt token, so the block holding it "
                 "is never a hit")
def _twice(m):
    cache, toks = m.PrefixCache(10, 4), list(range(100, 112))  # 12 tokens = 3 full blocks
    t1, c1 = cache.allocate(toks)
    cache.free(t1)
    t2, c2 = cache.allocate(toks)
    inputs = dict(num_blocks=10, block_size=4, token_ids=toks, first_table=t1)
    equal(c1, 0, "a cold cache has no hits", inputs)
    equal(c2, 8, "blocks 0 and 1 hit; block 2 holds the last token, so it is recomputed", inputs)
    equal(list(t2[:2]), list(t1[:2]), "hits reuse the same physical blocks", inputs)


@EX_10.case("random traces with eviction under pressure replay exactly",
            hint="fresh blocks come from the head of the free queue; freed blocks join its "
                 "end, a table's tail first")
def _trace(m):
    rng = np.random.default_rng(23)
    for _ in range(20):
        bs, nb = int(rng.choice([1, 2, 4])), int(rng.integers(4, 16))
        system = [int(t) for t in rng.integers(0, 5, size=int(rng.integers(1, 3 * bs + 1)))]
        _replay(m, rng, nb, bs, [system, system + [7, 7], [3] * bs, []], 40, m.hash_block)


@EX_10.case("hash collisions: token ids are checked, not only hashes",
            hint="a hash match is only a candidate: compare the block's stored token ids too")
def _collide(m):
    rng = np.random.default_rng(24)
    original = m.hash_block
    m.hash_block = lambda parent, tokens: 12345          # every block collides
    try:
        for _ in range(10):
            prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3], [1, 2, 3, 4, 0, 0, 0]]
            _replay(m, rng, 12, 2, prompts, 30, m.hash_block)
    finally:
        m.hash_block = original


EX_11 = Exercise("11_preemption", "preemption: whom to preempt, swap or recompute",
                 ("blocks_for_step", "choose_victims", "swap_or_recompute"))


def _ref_need(seq_lens, block_size):
    return sum(1 for n in seq_lens if n % block_size == 0)


def _ref_victims(groups, num_free_blocks, block_size):
    kept = sorted(groups, key=lambda g: g["arrival"])  # stable: ties keep their order
    need, free, out = sum(_ref_need(g["seq_lens"], block_size) for g in kept), num_free_blocks, []
    while kept and need > free:
        g = kept.pop()
        out.append(g["id"])
        free += g["num_blocks"]
        need -= _ref_need(g["seq_lens"], block_size)
    return out


def _ref_choice(num_blocks, block_bytes, num_tokens, pcie_bytes_per_s, prefill_tokens_per_s):
    # the blocks go out and come back over PCIe, or the tokens are prefilled again
    swap_s, recompute_s = 2 * num_blocks * block_bytes / pcie_bytes_per_s, (
        num_tokens / prefill_tokens_per_s)
    return "swap" if swap_s < recompute_s else "recompute"


@EX_11.case("blocks_for_step counts sequences at a block boundary",
            hint="a sequence needs a fresh block only when its last block is exactly full")
def _need(m):
    agree(m.blocks_for_step, _ref_need, [([16, 17, 32, 1], 16), ([5, 6, 7], 1), ([3], 4)],
          "wrong number of fresh blocks")


@EX_11.case("choose_victims: latest arrival first, all or nothing, random batches",
            hint="a preempted group gives back its blocks and needs none this step; stop as "
                 "soon as the rest fits")
def _victims(m):
    rng = np.random.default_rng(25)
    cases = []
    for _ in range(200):
        bs, groups = int(rng.choice([1, 2, 4, 16])), []
        for i in range(int(rng.integers(1, 7))):
            lens = [int(x) for x in rng.integers(1, 5 * bs, size=int(rng.integers(1, 4)))]
            groups.append({"id": f"req{i}", "arrival": float(rng.integers(0, 5)),
                           "seq_lens": lens, "num_blocks": sum(cdiv(n, bs) for n in lens)})
        cases.append((groups, int(rng.integers(0, 4)), bs))
    agree(m.choose_victims, _ref_victims, cases, "wrong victims", convert=list)
    groups = cases[0][0] + [dict(cases[0][0][0], id="late", arrival=9.0)]  # preempted
    before = [dict(g) for g in groups]
    m.choose_victims(groups, 0, 1)
    equal(groups, before, "choose_victims must leave its groups as they were", dict(groups=before,
          num_free_blocks=0, block_size=1), hint="sort a copy: the scheduler keeps its list")


@EX_11.case("swap or recompute by the stated cost model",
            hint="compare the time to move the blocks both ways over PCIe with the time to "
                 "prefill the tokens again")
def _swap(m):
    rng = np.random.default_rng(26)
    agree(m.swap_or_recompute, _ref_choice, [
        (int(rng.integers(1, 200)), int(rng.choice([2**16, 2**19, 2**21])),
         int(rng.integers(1, 4000)), float(rng.choice([8e9, 16e9, 32e9])),
         float(rng.choice([1e3, 1e4, 5e4]))) for _ in range(200)], "wrong choice")
    # a tie, exact in floats: 2 * 4 * 2**16 B at 2**19 B/s = 1 s = 500 tokens at 500 tokens/s
    tie = (4, 2**16, 500, float(2**19), 500.0)
    agree(m.swap_or_recompute, _ref_choice, [tie], "equal costs: swap must cost strictly less",
          hint="read the docstring's comparison again: which answer does a tie get?")
    for args, what in (((1, 1, 1, 0.0, 1.0), "pcie_bytes_per_s=0.0"),
                       ((1, 1, 1, -8e9, 1.0), "pcie_bytes_per_s=-8e9"),
                       ((1, 1, 1, 8e9, 0.0), "prefill_tokens_per_s=0.0"),
                       ((1, 1, 1, 8e9, -1e4), "prefill_tokens_per_s=-1e4")):
        rejects(lambda args=args: m.swap_or_recompute(*args), ValueError,
                f"{what} must be rejected", what, hint="check both rates before dividing")
