"""Hidden cases for exercises 03 (block allocator), 04 (block tables, slot mapping) and
05 (reshape_and_cache).

Exercise 03 is checked against a model (the blocks in use and their counts) over random operation
sequences, the way the package's own stateful tests check ``BlockAllocator``, and every rejected
call is checked to leave every count as it was. Exercise 05 is compared, exactly, with the
package's ``reshape_and_cache`` (both only copy numbers, so equality is exact).
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.grader.core import Exercise, agree, equal, expect, rejects
from minipaged.paged.cache_ops import reshape_and_cache

EX_03 = Exercise("03_block_allocator", "a block allocator with a free list and reference counts",
                 ("BlockAllocator",))


def _state(a, nb: int):
    """Everything a call on the allocator could change, as plain values."""
    return {"num_free_blocks": a.num_free_blocks,
            "ref_counts": [a.ref_count(b) for b in range(nb)]}


@EX_03.case("allocate every block once, then run out",
            hint="allocate hands out each free block exactly once; with none left it raises "
                 "before touching anything")
def _exhaust(m):
    a = m.BlockAllocator(8)
    equal(a.num_blocks, 8, "num_blocks", "BlockAllocator(8)")
    got = sorted(a.allocate() for _ in range(8))
    equal(got, list(range(8)), "8 allocations must return the 8 blocks once each",
          "BlockAllocator(8), allocate() x8")
    rejects(a.allocate, RuntimeError, "allocating from an empty pool must raise "
            "OutOfBlocksError (a RuntimeError)", "allocate() x9", state=lambda: _state(a, 8))


@EX_03.case("free returns a block; shared blocks need every owner to free",
            hint="a block goes back to the free list only when its count reaches 0")
def _shared(m):
    a = m.BlockAllocator(4)
    b = a.allocate()
    a.incref(b)
    a.incref(b)
    equal(a.ref_count(b), 3, "incref must raise the count", "allocate, incref x2")
    a.free(b)
    a.free(b)
    equal(a.num_free_blocks, 3, "a block with owners left must stay allocated",
          "allocate, incref x2, free x2")
    a.free(b)
    equal(a.num_free_blocks, 4, "the last free returns the block", "allocate, incref x2, free x3")


@EX_03.case("block ids out of range are rejected, at both ends",
            hint="valid ids are 0 .. num_blocks - 1, both ends checked before the id is used")
def _range(m):
    nb = 4
    a = m.BlockAllocator(nb)
    for _ in range(nb):
        a.allocate()  # every block in use: a wrong index would find a live block to change
    for bad in (-1, -nb, nb, nb + 3):
        hint = ("Python lists accept negative indices: counts[-1] is the last block, so check "
                "block >= 0 too" if bad < 0 else
                f"block {bad} is one past the last id: the upper bound is exclusive"
                if bad == nb else "")
        for op in ("free", "incref", "ref_count"):
            rejects(lambda op=op, bad=bad: getattr(a, op)(bad), ValueError,
                    f"{op}({bad}) on a pool of {nb} blocks must raise ValueError",
                    f"BlockAllocator({nb}); allocate() x{nb}; {op}({bad})",
                    state=lambda: _state(a, nb), hint=hint)


@EX_03.case("double free, incref of a free block and num_blocks=0 are rejected",
            hint="a free block has no owner: freeing or sharing it again is a bug to report")
def _bad(m):
    a = m.BlockAllocator(4)
    b = a.allocate()
    a.free(b)
    rejects(lambda: a.free(b), ValueError, "a double free must raise ValueError",
            f"allocate -> {b}, free({b}), free({b})", state=lambda: _state(a, 4))
    rejects(lambda: a.incref(b), ValueError, "incref of a free block must raise ValueError",
            f"incref({b}) while {b} is free", state=lambda: _state(a, 4))
    for nb in (0, -1):
        rejects(lambda nb=nb: m.BlockAllocator(nb), ValueError,
                f"num_blocks={nb} must be rejected", f"BlockAllocator({nb})")


@EX_03.case("random operations keep every invariant",
            hint="after every call: each block is free (count 0) or allocated (count >= 1), "
                 "and the free count matches")
def _random(m):
    rng = np.random.default_rng(4)
    for _trial in range(20):
        nb = int(rng.integers(1, 20))
        a, counts, log = m.BlockAllocator(nb), [0] * nb, [f"BlockAllocator({nb})"]
        for _ in range(150):
            op, in_use = rng.integers(3), [b for b in range(nb) if counts[b]]
            if op == 0 and len(in_use) == nb:
                log.append("allocate() -> OutOfBlocksError")
                rejects(a.allocate, RuntimeError, "allocate on a full pool must raise",
                        dict(operations=log[-12:]), state=lambda a=a, nb=nb: _state(a, nb))
            elif op == 0:
                b = a.allocate()
                log.append(f"allocate() -> {b}")
                expect(isinstance(b, (int, np.integer)) and 0 <= b < nb and not counts[b],
                       "allocate returned a block in use or out of range",
                       inputs=dict(operations=log[-12:], in_use=in_use),
                       expected=f"a free block in [0, {nb})", got=b)
                counts[b] = 1
            elif in_use:
                b = int(rng.choice(in_use))
                (a.incref if op == 1 else a.free)(b)
                counts[b] += 1 if op == 1 else -1
                log.append(f"{'incref' if op == 1 else 'free'}({b})")
            equal(_state(a, nb), {"num_free_blocks": counts.count(0), "ref_counts": counts},
                  "the allocator disagrees with the blocks in use", dict(operations=log[-12:]))


EX_04 = Exercise("04_block_table", "block tables, slot mapping and padded tables",
                 ("blocks_needed", "slot_for", "slot_mapping", "padded_block_tables"))


SLOT_ARGS = ("block_table", "block_size", "start", "end")


def _ref_slot_mapping(table, bs, start, end):
    return np.array([table[p // bs] * bs + p % bs for p in range(start, end)], dtype=np.int64)


@EX_04.case("blocks_needed is the ceiling",
            hint="a partly filled block still takes a whole block; zero tokens take none")
def _needed(m):
    agree(m.blocks_needed, cdiv, [(n, bs) for n in (0, 1, 15, 16, 17, 31, 32, 33, 1000, 2048)
                                  for bs in (1, 16, 32)], "wrong number of blocks")
    for bs in (0, -4):
        rejects(lambda bs=bs: m.blocks_needed(5, bs), ValueError,
                f"block_size={bs} must be rejected", dict(num_tokens=5, block_size=bs))
    rejects(lambda: m.blocks_needed(-1, 16), ValueError, "num_tokens=-1 must be rejected",
            dict(num_tokens=-1, block_size=16), hint="no sequence holds fewer than 0 tokens")


@EX_04.case("the paper's example (Fig. 6): logical 0 -> 7, 1 -> 1, 2 -> 3",
            hint="the logical block of position p is p // BS, its offset p % BS")
def _paper(m):
    table, bs = [7, 1, 3], 4
    for p in range(12):
        agree(m.slot_for, lambda t, b, p: int(_ref_slot_mapping(t, b, p, p + 1)[0]),
              [(table, bs, p)], f"wrong slot for position {p}")
    for p in (12, -1):
        rejects(lambda p=p: m.slot_for(table, bs, p), (IndexError, ValueError),
                f"position {p} is outside the table and must be rejected",
                dict(block_table=table, block_size=bs, position=p),
                hint="table[-1] is a real block in Python: check the position's range first")


@EX_04.case("slot_mapping on random tables (int64, exact)",
            hint="index the table with a whole array of logical blocks at once")
def _mapping(m):
    rng = np.random.default_rng(5)
    cases = []
    for _ in range(100):
        bs, nblk = int(rng.choice([1, 2, 4, 16, 32])), int(rng.integers(1, 12))
        table = [int(x) for x in rng.permutation(64)[:nblk]]
        start = int(rng.integers(0, nblk * bs + 1))
        cases.append((table, bs, start, int(rng.integers(start, nblk * bs + 1))))
    agree(m.slot_mapping, _ref_slot_mapping, cases, "wrong slot mapping", convert=np.asarray)
    got = m.slot_mapping(*cases[0])
    expect(isinstance(got, np.ndarray), "slot_mapping must return a NumPy array",
           inputs=dict(zip(SLOT_ARGS, cases[0])), expected="numpy.ndarray",
           got=type(got).__name__, hint="the kernels take one array of slots, not a list")
    for args in (cases[0], ([0, 1], 4, 3, 3)):  # an empty range too: np.array([]) is float
        equal(str(np.asarray(m.slot_mapping(*args)).dtype), "int64", "slot_mapping must be "
              "int64 (slots exceed 2**31 in big pools)", dict(zip(SLOT_ARGS, args)))
    for start, end, what in ((3, 9, "end beyond the table"), (-1, 2, "a negative start"),
                             (5, 3, "start after end")):
        rejects(lambda start=start, end=end: m.slot_mapping([0, 1], 4, start, end), ValueError,
                f"{what} must be rejected", dict(block_table=[0, 1], block_size=4, start=start,
                                                 end=end),
                hint="check 0 <= start <= end <= len(block_table) * block_size: NumPy reads "
                     "table[-1] and returns an empty range without a word")


@EX_04.case("padded_block_tables pads with -1, int32",
            hint="allocate the whole [S, MB] array filled with the pad first, then copy rows")
def _padded(m):
    tables = [[5, 2, 9], [1], [], [4, 8]]
    got = np.asarray(m.padded_block_tables(tables))
    equal(got, np.array([[5, 2, 9], [1, -1, -1], [-1, -1, -1], [4, 8, -1]], np.int32),
          "wrong padded table", dict(tables=[[5, 2, 9], [1], [], [4, 8]]))
    equal(tables, [[5, 2, 9], [1], [], [4, 8]], "padded_block_tables must leave its tables "
          "as they were", hint="the tables belong to the caller: pad a new array, not them")
    equal(str(got.dtype), "int32", "block tables are int32 here, as in vLLM's kernels "
          "(csrc/attention/attention_kernels.cuh)", dict(tables=tables))
    equal(np.asarray(m.padded_block_tables([[3]], pad=0)), np.array([[3]]),
          "pad argument / single table", dict(tables=[[3]], pad=0))
    equal(np.asarray(m.padded_block_tables([[], []], pad=0)), np.zeros((2, 1), np.int32),
          "tables that are all empty still get one column", dict(tables=[[], []], pad=0),
          hint="read the docstring again: how wide is MB when every table is empty?")


EX_05 = Exercise("05_reshape_and_cache", "reshape_and_cache: scatter new K/V into the pages",
                 ("reshape_and_cache",))


@EX_05.case("random scatters, with padding slots, equal the reference exactly",
            hint="a negative slot is padding: skip it; every other token goes to "
                 "(slot // BS, slot % BS) for all KV heads")
def _scatter(m):
    rng = np.random.default_rng(6)
    for _ in range(40):
        nb, hkv, bs, d = (int(rng.integers(1, 9)), int(rng.integers(1, 4)),
                          int(rng.choice([1, 4, 16])), int(rng.choice([2, 8])))
        t = int(rng.integers(1, min(nb * bs, 40) + 1))
        slots = rng.permutation(nb * bs)[:t].astype(np.int64)
        slots[rng.random(t) < 0.2] = -1
        slots[rng.random(t) < 0.1] = -3  # any negative slot is padding, not only -1
        key, value = (rng.standard_normal((t, hkv, d)).astype(np.float32) for _ in range(2))
        kc, vc = (rng.standard_normal((nb, hkv, bs, d)).astype(np.float32) for _ in range(2))
        kc_ref, vc_ref = kc.copy(), vc.copy()
        reshape_and_cache(key, value, kc_ref, vc_ref, slots)
        ret = m.reshape_and_cache(key, value, kc, vc, slots)
        inputs = dict(key_shape=key.shape, cache_shape=kc.shape, slot_mapping=slots)
        expect(ret is None, "reshape_and_cache works in place and returns None",
               inputs=inputs, expected="None", got=type(ret).__name__)
        equal(kc, kc_ref, "key_cache differs from the reference", inputs)
        equal(vc, vc_ref, "value_cache differs from the reference", inputs)


@EX_05.case("an out-of-range slot and mismatched shapes raise ValueError",
            hint="validate every slot and every shape before writing the first token")
def _bad_scatter(m):
    kc = np.zeros((2, 1, 4, 2), np.float32)
    vc = np.zeros_like(kc)
    k = np.ones((2, 1, 2), np.float32)
    caches = lambda: {"key_cache": kc.tolist(), "value_cache": vc.tolist()}  # noqa: E731
    rejects(lambda: m.reshape_and_cache(k, k, kc, vc, np.array([0, 8])), (ValueError, IndexError),
            "slot 8 with NB*BS = 8 must be rejected, before slot 0 is written",
            dict(slot_mapping=[0, 8], cache_shape=kc.shape), state=caches)
    vc3 = np.zeros((2, 1, 4, 3), np.float32)  # value_cache's D differs from key_cache's
    rejects(lambda: m.reshape_and_cache(k, k, kc, vc3, np.array([0, 1])), ValueError,
            "value_cache head size 3 vs key_cache head size 2 must be rejected",
            dict(key_shape=k.shape, cache_shape=kc.shape, value_cache_shape=vc3.shape),
            state=caches)
    k3 = np.ones((1, 1, 3), np.float32)
    rejects(lambda: m.reshape_and_cache(k3, k3, kc, vc, np.array([0])), ValueError,
            "head size 3 vs cache head size 2 must be rejected",
            dict(key_shape=k3.shape, cache_shape=kc.shape), state=caches)
    # NumPy would broadcast one KV head over two without a word: only a check catches these
    kc2 = np.zeros((2, 2, 4, 2), np.float32)
    vc2 = np.zeros_like(kc2)
    caches2 = lambda: {"key_cache": kc2.tolist(), "value_cache": vc2.tolist()}  # noqa: E731
    k1, k2 = np.ones((2, 1, 2), np.float32), np.ones((2, 2, 2), np.float32)
    for key, value, slots, what in (
            (k2, k1, [0, 1], "key [2, 2, 2] vs value [2, 1, 2]"),
            (k1, k1, [0, 1], "key/value with Hkv=1 vs a cache with Hkv=2"),
            (k2, k2, [0, 1, 2], "3 slots for T=2 tokens")):
        rejects(lambda key=key, value=value, slots=slots: m.reshape_and_cache(
                    key, value, kc2, vc2, np.array(slots)), ValueError,
                f"{what} must be rejected with ValueError",
                dict(key_shape=key.shape, value_shape=value.shape, cache_shape=kc2.shape,
                     slot_mapping=slots), state=caches2,
                hint="compare the shapes yourself: NumPy broadcasts a size-1 axis silently, "
                     "and its own errors are not always ValueError")
