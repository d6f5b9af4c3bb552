"""Hidden cases for exercises 10 (prefix cache) and 11 (preemption).

Exercise 10 is replayed against a reference that follows the exercise's rules 1-5 to the
letter, so block ids, cached-token counts and the LRU queue's order must match exactly; one case
replaces the learner's hash function with a colliding one, to prove that hits check token ids.
Exercise 11 is compared with the rules written in its docstring on random batches.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from minipaged.kit.grader.core import Exercise, expect, expect_raises

EX_10 = Exercise(
    "10_prefix_cache", "prefix caching: chained block hashes and an LRU free queue",
    ("block_hashes", "PrefixCache"),
    hint="hits stop at the first miss, token mismatch, or block reaching the last prompt "
         "token; fresh blocks come from free_queue.popitem(last=False), evicting an old hash; "
         "free walks the table in reverse and appends at the queue's end.")


class _RefPrefixCache:
    """The rules of exercise 10, written out again for replay (hash function injectable)."""

    def __init__(self, nb: int, bs: int, hash_fn) -> None:
        self.bs, self.hash_fn = bs, hash_fn
        self.ref = [0] * nb
        self.queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(nb))
        self.h2b: dict[int, int] = {}
        self.bh: dict[int, int] = {}
        self.bt: dict[int, tuple] = {}

    def hashes(self, toks):
        out, parent = [], -1
        for i in range(len(toks) // self.bs):
            parent = self.hash_fn(parent, toks[i * self.bs:(i + 1) * self.bs])
            out.append(parent)
        return out

    def allocate(self, toks):
        bs, n = self.bs, len(toks)
        hs = self.hashes(toks)
        hits = []
        for i, h in enumerate(hs):
            if (i + 1) * bs > n - 1:
                break
            b = self.h2b.get(h)
            if b is None or self.bt[b] != tuple(toks[i * bs:(i + 1) * bs]):
                break
            hits.append(b)
        fresh = -(-n // bs) - len(hits)
        if fresh > len(self.queue) - sum(self.ref[b] == 0 for b in hits):
            raise RuntimeError("out of blocks")
        for b in hits:
            if self.ref[b] == 0:
                self.queue.pop(b)
            self.ref[b] += 1
        table = list(hits)
        for i in range(len(hits), len(hits) + fresh):
            b, _ = self.queue.popitem(last=False)
            old = self.bh.pop(b, None)
            if old is not None:
                del self.h2b[old]
                del self.bt[b]
            self.ref[b] = 1
            table.append(b)
            if i < len(hs) and hs[i] not in self.h2b:
                self.h2b[hs[i]], self.bh[b] = b, hs[i]
                self.bt[b] = tuple(toks[i * bs:(i + 1) * bs])
        return table, len(hits) * bs

    def free(self, table):
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue[b] = None


def _replay(m, rng, nb: int, bs: int, prompts: list[list[int]], steps: int, hash_fn) -> None:
    cache, ref = m.PrefixCache(nb, bs), _RefPrefixCache(nb, bs, hash_fn)
    live: list[list[int]] = []
    log: list[str] = [f"PrefixCache({nb}, {bs})"]
    for _ in range(steps):
        if live and rng.random() < 0.45:
            table = live.pop(int(rng.integers(len(live))))
            cache.free(table)
            ref.free(table)
            log.append(f"free({table})")
        else:
            toks = list(prompts[int(rng.integers(len(prompts)))])
            toks += [int(t) for t in rng.integers(0, 5, size=int(rng.integers(0, 2 * bs)))]
            if not toks:
                toks = [1]
            inputs = dict(operations=log[-8:], token_ids=toks)
            try:
                want = ref.allocate(toks)
            except RuntimeError:
                log.append(f"allocate({toks}) -> out of blocks")
                expect_raises(lambda toks=toks: cache.allocate(toks), RuntimeError,
                              "out of blocks must raise RuntimeError", inputs=inputs)
                expect(cache.num_free_blocks == len(ref.queue), "a failed allocate must "
                       "change nothing", inputs=inputs, expected=len(ref.queue),
                       got=cache.num_free_blocks)
                continue
            got = cache.allocate(toks)
            log.append(f"allocate(<{len(toks)} tokens>) -> {want}")
            expect((list(got[0]), int(got[1])) == (want[0], want[1]),
                   "wrong (block_table, cached tokens)", inputs=inputs, expected=want, got=got)
            live.append(want[0])
        expect(list(cache.free_queue) == list(ref.queue), "free queue order (LRU first) "
               "differs", inputs=dict(operations=log[-8:]), expected=list(ref.queue),
               got=list(cache.free_queue))
    for table in live:
        cache.free(table)
    expect(cache.num_free_blocks == nb, "freeing everything returns every block",
           expected=nb, got=cache.num_free_blocks)


@EX_10.case("block_hashes: full blocks only, chained")
def _hashes(m):
    rng = np.random.default_rng(22)
    for _ in range(30):
        bs = int(rng.choice([1, 2, 4, 16]))
        toks = [int(t) for t in rng.integers(0, 50, size=int(rng.integers(0, 70)))]
        want = _RefPrefixCache(1, bs, m.hash_block).hashes(toks)
        got = m.block_hashes(toks, bs)
        expect(list(got) == want, "wrong block hashes", inputs=dict(token_ids=toks,
               block_size=bs), expected=want, got=got)
    a = m.block_hashes([1, 2, 3, 4], 2)
    b = m.block_hashes([9, 9, 3, 4], 2)
    expect(a[1] != b[1], "equal blocks after different prefixes must hash differently "
           "(chain each hash to its parent's)", inputs="[1, 2, 3, 4] vs [9, 9, 3, 4], BS=2",
           expected="different second hashes", got=(a[1], b[1]))


@EX_10.case("the same prompt twice: full blocks hit, the last token is recomputed")
def _twice(m):
    cache = m.PrefixCache(10, 4)
    toks = list(range(100, 112))            # 12 tokens = 3 full blocks
    t1, c1 = cache.allocate(toks)
    cache.free(t1)
    t2, c2 = cache.allocate(toks)
    inputs = dict(num_blocks=10, block_size=4, token_ids=toks, first_table=t1)
    expect(c1 == 0, "a cold cache has no hits", inputs=inputs, expected=0, got=c1)
    expect(c2 == 8, "blocks 0 and 1 hit; block 2 holds the last token, so it is recomputed",
           inputs=inputs, expected=8, got=c2)
    expect(list(t2[:2]) == list(t1[:2]), "hits reuse the same physical blocks", inputs=inputs,
           expected=t1[:2], got=t2[:2])


@EX_10.case("random traces with eviction under pressure replay exactly")
def _trace(m):
    rng = np.random.default_rng(23)
    for _ in range(20):
        bs = int(rng.choice([1, 2, 4]))
        nb = int(rng.integers(4, 16))
        system = [int(t) for t in rng.integers(0, 5, size=int(rng.integers(1, 3 * bs + 1)))]
        prompts = [system, system + [7, 7], [3] * bs, []]
        _replay(m, rng, nb, bs, prompts, 40, m.hash_block)


@EX_10.case("hash collisions: token ids are checked, not only hashes")
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


EX_11 = Exercise(
    "11_preemption", "preemption: whom to preempt, swap or recompute",
    ("blocks_for_step", "choose_victims", "swap_or_recompute"),
    hint="sort groups by arrival; while need > free: pop the last-arrived group, add its "
         "blocks to free and subtract its need. A step needs a block per sequence with "
         "seq_len % BS == 0.")


def _ref_need(lens, bs):
    return sum(1 for n in lens if n % bs == 0)


def _ref_victims(groups, free, bs):
    kept = [groups[i] for i in sorted(range(len(groups)),
                                      key=lambda i: (groups[i]["arrival"], i))]
    need = sum(_ref_need(g["seq_lens"], bs) for g in kept)
    out = []
    while kept and need > free:
        g = kept.pop()
        out.append(g["id"])
        free += g["num_blocks"]
        need -= _ref_need(g["seq_lens"], bs)
    return out


@EX_11.case("blocks_for_step counts sequences at a block boundary")
def _need(m):
    for lens, bs, want in (([16, 17, 32, 1], 16, 2), ([5, 6, 7], 1, 3), ([3], 4, 0)):
        got = m.blocks_for_step(lens, bs)
        expect(got == want, "wrong number of fresh blocks",
               inputs=dict(seq_lens=lens, block_size=bs), expected=want, got=got)


@EX_11.case("choose_victims: latest arrival first, all or nothing, random batches")
def _victims(m):
    rng = np.random.default_rng(25)
    for _ in range(200):
        bs = int(rng.choice([1, 2, 4, 16]))
        groups = []
        for i in range(int(rng.integers(1, 7))):
            lens = [int(x) for x in rng.integers(1, 5 * bs, size=int(rng.integers(1, 4)))]
            groups.append({"id": f"req{i}", "arrival": float(rng.integers(0, 5)),
                           "seq_lens": lens,
                           "num_blocks": sum(-(-n // bs) for n in lens)})
        free = int(rng.integers(0, 4))
        want = _ref_victims(groups, free, bs)
        got = m.choose_victims([dict(g) for g in groups], free, bs)
        expect(list(got) == want, "wrong victims", inputs=dict(groups=groups,
               num_free_blocks=free, block_size=bs), expected=want, got=got)


@EX_11.case("swap or recompute by the stated cost model")
def _swap(m):
    rng = np.random.default_rng(26)
    for _ in range(200):
        args = (int(rng.integers(1, 200)), int(rng.choice([2**16, 2**19, 2**21])),
                int(rng.integers(1, 4000)), float(rng.choice([8e9, 16e9, 32e9])),
                float(rng.choice([1e3, 1e4, 5e4])))
        swap = 2 * args[0] * args[1] / args[3]
        want = "swap" if swap < args[2] / args[4] else "recompute"
        got = m.swap_or_recompute(*args)
        expect(got == want, "wrong choice", inputs=dict(zip(
            ("num_blocks", "block_bytes", "num_tokens", "pcie_bytes_per_s",
             "prefill_tokens_per_s"), args)), expected=want, got=got)
    expect_raises(lambda: m.swap_or_recompute(1, 1, 1, 0.0, 1.0), ValueError,
                  "a PCIe rate of 0 must be rejected", inputs=dict(pcie_bytes_per_s=0.0))
