"""Hidden cases for exercises 03 (block allocator), 04 (block tables, slot mapping) and
05 (reshape_and_cache).

Exercise 03 is checked against a model (a set of allocated blocks and their counts) over random
operation sequences, the way the package's own stateful tests check ``BlockAllocator``.
Exercise 05 is compared, exactly, with the package's ``reshape_and_cache`` when it exists, and
with a plain loop otherwise (both only copy numbers, so equality is exact).
"""

from __future__ import annotations

import numpy as np

from minipaged.kit.grader.core import Exercise, expect, expect_raises

EX_03 = Exercise(
    "03_block_allocator", "a block allocator with a free list and reference counts",
    ("BlockAllocator",),
    hint="keep a free list (stack) and a count per block; allocate pops and sets 1; free "
         "decrements and pushes back only at 0; check the range and the count before changing "
         "anything.")


def _check_state(alloc, counts: dict[int, int], nb: int, log: list) -> None:
    free = alloc.num_free_blocks
    expect(free == nb - len(counts), "num_free_blocks disagrees with the blocks in use",
           inputs=dict(operations=log[-12:]), expected=nb - len(counts), got=free)
    for b in range(nb):
        got = alloc.ref_count(b)
        want = counts.get(b, 0)
        expect(got == want, f"ref_count({b}) is wrong", inputs=dict(operations=log[-12:]),
               expected=want, got=got)


@EX_03.case("allocate every block once, then run out")
def _exhaust(m):
    a = m.BlockAllocator(8)
    expect(a.num_blocks == 8, "num_blocks", inputs=dict(num_blocks=8), expected=8,
           got=a.num_blocks)
    got = [a.allocate() for _ in range(8)]
    expect(sorted(got) == list(range(8)), "8 allocations must return the 8 blocks once each",
           inputs=dict(num_blocks=8), expected=list(range(8)), got=sorted(got))
    expect_raises(a.allocate, RuntimeError, "allocating from an empty pool must raise "
                  "OutOfBlocksError (a RuntimeError)", inputs=dict(num_blocks=8, allocated=8))
    expect(a.num_free_blocks == 0, "a failed allocate must not change the free count",
           expected=0, got=a.num_free_blocks)


@EX_03.case("free returns a block; shared blocks need every owner to free")
def _shared(m):
    a = m.BlockAllocator(4)
    b = a.allocate()
    a.incref(b)
    a.incref(b)
    expect(a.ref_count(b) == 3, "incref must raise the count", inputs="allocate, incref x2",
           expected=3, got=a.ref_count(b))
    a.free(b)
    a.free(b)
    expect(a.num_free_blocks == 3, "a block with owners left must stay allocated",
           inputs="allocate, incref x2, free x2", expected=3, got=a.num_free_blocks)
    a.free(b)
    expect(a.num_free_blocks == 4, "the last free returns the block",
           inputs="allocate, incref x2, free x3", expected=4, got=a.num_free_blocks)


@EX_03.case("double free, bad ids and incref of a free block are rejected")
def _bad(m):
    a = m.BlockAllocator(4)
    b = a.allocate()
    a.free(b)
    expect_raises(lambda: a.free(b), ValueError, "a double free must raise ValueError",
                  inputs=f"allocate -> {b}, free({b}), free({b})")
    expect_raises(lambda: a.free(7), ValueError, "free(7) on a pool of 4 must raise",
                  inputs="BlockAllocator(4).free(7)")
    expect_raises(lambda: a.incref(-1), ValueError, "incref(-1) must raise",
                  inputs="incref(-1)")
    expect_raises(lambda: a.incref(b), ValueError, "incref of a free block must raise",
                  inputs=f"incref({b}) while {b} is free")
    expect(a.num_free_blocks == 4, "rejected calls must change nothing", expected=4,
           got=a.num_free_blocks)
    expect_raises(lambda: m.BlockAllocator(0), ValueError, "num_blocks=0 must be rejected",
                  inputs="BlockAllocator(0)")


@EX_03.case("random operations keep every invariant")
def _random(m):
    rng = np.random.default_rng(4)
    for _trial in range(20):
        nb = int(rng.integers(1, 20))
        a = m.BlockAllocator(nb)
        counts: dict[int, int] = {}
        log: list[str] = [f"BlockAllocator({nb})"]
        for _ in range(150):
            op = rng.integers(3)
            if op == 0:
                if len(counts) == nb:
                    log.append("allocate() -> OutOfBlocksError")
                    expect_raises(a.allocate, RuntimeError, "allocate on a full pool must raise",
                                  inputs=dict(operations=log[-12:]))
                else:
                    b = a.allocate()
                    log.append(f"allocate() -> {b}")
                    expect(isinstance(b, (int, np.integer)) and 0 <= b < nb and b not in counts,
                           "allocate returned a block in use or out of range",
                           inputs=dict(operations=log[-12:], in_use=sorted(counts)),
                           expected=f"a free block in [0, {nb})", got=b)
                    counts[int(b)] = 1
            elif counts and op == 1:
                b = int(rng.choice(sorted(counts)))
                a.incref(b)
                counts[b] += 1
                log.append(f"incref({b})")
            elif counts:
                b = int(rng.choice(sorted(counts)))
                a.free(b)
                counts[b] -= 1
                if counts[b] == 0:
                    del counts[b]
                log.append(f"free({b})")
            _check_state(a, counts, nb, log)


EX_04 = Exercise(
    "04_block_table", "block tables, slot mapping and padded tables",
    ("blocks_needed", "slot_for", "slot_mapping", "padded_block_tables"),
    hint="slot = block_table[p // BS] * BS + p % BS; vectorise with np.arange and fancy "
         "indexing; a padded table is np.full((S, MB), pad, np.int32) with each row filled.")


def _ref_slots(table, bs, start, end):
    return [table[p // bs] * bs + p % bs for p in range(start, end)]


@EX_04.case("blocks_needed is the ceiling")
def _needed(m):
    for n in (0, 1, 15, 16, 17, 31, 32, 33, 1000, 2048):
        for bs in (1, 16, 32):
            want = -(-n // bs)
            got = m.blocks_needed(n, bs)
            expect(got == want, "wrong number of blocks",
                   inputs=dict(num_tokens=n, block_size=bs), expected=want, got=got)
    expect_raises(lambda: m.blocks_needed(5, 0), ValueError, "block_size=0 must be rejected",
                  inputs=dict(num_tokens=5, block_size=0))


@EX_04.case("the paper's example: logical 0 -> 7, 1 -> 1, 2 -> 3")
def _paper(m):
    table, bs = [7, 1, 3], 4
    for p in range(12):
        want = _ref_slots(table, bs, p, p + 1)[0]
        got = m.slot_for(table, bs, p)
        expect(got == want, f"wrong slot for position {p}",
               inputs=dict(block_table=table, block_size=bs, position=p), expected=want, got=got)
    expect_raises(lambda: m.slot_for(table, bs, 12), (IndexError, ValueError),
                  "position 12 is past the last block and must be rejected",
                  inputs=dict(block_table=table, block_size=bs, position=12))


@EX_04.case("slot_mapping on random tables (int64, exact)")
def _mapping(m):
    rng = np.random.default_rng(5)
    for _ in range(100):
        bs = int(rng.choice([1, 2, 4, 16, 32]))
        nblk = int(rng.integers(1, 12))
        table = [int(x) for x in rng.permutation(64)[:nblk]]
        start = int(rng.integers(0, nblk * bs + 1))
        end = int(rng.integers(start, nblk * bs + 1))
        want = np.array(_ref_slots(table, bs, start, end), dtype=np.int64)
        got = np.asarray(m.slot_mapping(table, bs, start, end))
        inputs = dict(block_table=table, block_size=bs, start=start, end=end)
        expect(got.shape == want.shape and np.array_equal(got, want), "wrong slot mapping",
               inputs=inputs, expected=want, got=got)
        expect(got.dtype == np.int64, "slot_mapping must be int64 (slots exceed 2**31 in big "
               "pools)", inputs=inputs, expected="int64", got=str(got.dtype))
    expect_raises(lambda: m.slot_mapping([0, 1], 4, 3, 9), ValueError,
                  "end beyond the table must be rejected",
                  inputs=dict(block_table=[0, 1], block_size=4, start=3, end=9))


@EX_04.case("padded_block_tables pads with -1, int32")
def _padded(m):
    tables = [[5, 2, 9], [1], [], [4, 8]]
    want = np.array([[5, 2, 9], [1, -1, -1], [-1, -1, -1], [4, 8, -1]], dtype=np.int32)
    got = np.asarray(m.padded_block_tables(tables))
    expect(got.shape == want.shape and np.array_equal(got, want), "wrong padded table",
           inputs=dict(tables=tables), expected=want, got=got)
    expect(got.dtype == np.int32, "block tables are int32 (as in vLLM)",
           inputs=dict(tables=tables), expected="int32", got=str(got.dtype))
    got = np.asarray(m.padded_block_tables([[3]], pad=0))
    expect(np.array_equal(got, [[3]]), "pad argument / single table",
           inputs=dict(tables=[[3]], pad=0), expected=[[3]], got=got)


EX_05 = Exercise(
    "05_reshape_and_cache", "reshape_and_cache: scatter new K/V into the pages",
    ("reshape_and_cache",),
    hint="keep = slot_mapping >= 0; blocks, offsets = np.divmod(slot_mapping[keep], BS); "
         "key_cache[blocks, :, offsets, :] = key[keep]; same for value.")


def _ref_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    try:
        from minipaged.paged.cache_ops import reshape_and_cache
    except ImportError:
        bs = key_cache.shape[2]
        for t, slot in enumerate(np.asarray(slot_mapping)):
            if slot >= 0:
                key_cache[slot // bs, :, slot % bs, :] = key[t]
                value_cache[slot // bs, :, slot % bs, :] = value[t]
        return
    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


@EX_05.case("random scatters, with padding slots, equal the reference exactly")
def _scatter(m):
    rng = np.random.default_rng(6)
    for _ in range(40):
        nb, hkv, bs, d = (int(rng.integers(1, 9)), int(rng.integers(1, 4)),
                          int(rng.choice([1, 4, 16])), int(rng.choice([2, 8])))
        t = int(rng.integers(1, min(nb * bs, 40) + 1))
        slots = rng.permutation(nb * bs)[:t].astype(np.int64)
        slots[rng.random(t) < 0.2] = -1
        key = rng.standard_normal((t, hkv, d)).astype(np.float32)
        value = rng.standard_normal((t, hkv, d)).astype(np.float32)
        kc = rng.standard_normal((nb, hkv, bs, d)).astype(np.float32)
        vc = rng.standard_normal((nb, hkv, bs, d)).astype(np.float32)
        kc_ref, vc_ref = kc.copy(), vc.copy()
        _ref_reshape_and_cache(key, value, kc_ref, vc_ref, slots)
        ret = m.reshape_and_cache(key, value, kc, vc, slots)
        inputs = dict(key_shape=key.shape, cache_shape=kc.shape, slot_mapping=slots)
        expect(ret is None, "reshape_and_cache works in place and returns None", inputs=inputs,
               expected=None, got=type(ret).__name__)
        bad = np.argwhere(kc != kc_ref)
        expect(bad.size == 0, "key_cache differs from the reference (first wrong entry "
               "[block, head, offset, dim] shown)", inputs=inputs,
               expected=bad[:1].tolist() and float(kc_ref[tuple(bad[0])]),
               got=bad[:1].tolist() and float(kc[tuple(bad[0])]))
        expect(np.array_equal(vc, vc_ref), "value_cache differs from the reference",
               inputs=inputs)


@EX_05.case("an out-of-range slot and mismatched shapes raise ValueError")
def _bad_scatter(m):
    kc = np.zeros((2, 1, 4, 2), np.float32)
    vc = np.zeros_like(kc)
    k = np.ones((1, 1, 2), np.float32)
    expect_raises(lambda: m.reshape_and_cache(k, k, kc, vc, np.array([8])),
                  (ValueError, IndexError), "slot 8 with NB*BS = 8 must be rejected",
                  inputs=dict(slot_mapping=[8], cache_shape=kc.shape))
    expect(not kc.any(), "a rejected call must not write anything", got=kc)
    expect_raises(lambda: m.reshape_and_cache(np.ones((1, 1, 3), np.float32),
                                              np.ones((1, 1, 3), np.float32), kc, vc,
                                              np.array([0])),
                  ValueError, "head size 3 vs cache head size 2 must be rejected",
                  inputs=dict(key_shape=(1, 1, 3), cache_shape=kc.shape))
