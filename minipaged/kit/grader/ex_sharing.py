"""Hidden cases for exercises 08 (copy-on-write) and 09 (beam search); 10 and 11 are in
``ex_scheduling.py``.

Exercise 08 is graded with K/V actually written: the grader keeps a pool of token values
[NB, BS], writes every token at the slot the learner's manager returns, applies the copies it
reports before each step's writes (as the engine does with copy_blocks), and then reads every
live sequence back through its block table.
"""

from __future__ import annotations

import numpy as np

from minipaged.kit.grader.core import Exercise, expect, expect_raises

EX_08 = Exercise(
    "08_copy_on_write", "fork and copy-on-write append",
    ("CowBlockManager",),
    hint="append_slot: offset = seq_len % BS; offset 0 -> append a fresh block; else if "
         "ref_counts[last] > 1 -> fresh block, record (last, fresh), decrement last, replace it "
         "in the table; the slot is table[-1] * BS + offset.")


def _check_cow(mgr, nb: int, bs: int, pool: np.ndarray, model: dict[int, list[int]],
               log: list[str]) -> None:
    inputs = dict(num_blocks=nb, block_size=bs, operations=log[-10:])
    counts: dict[int, int] = {}
    for seq, tokens in model.items():
        table = mgr.block_table(seq)
        expect(len(table) == -(-len(tokens) // bs),
               f"sequence {seq} holds {len(tokens)} tokens but its table has {len(table)} "
               f"blocks", inputs=inputs, expected=-(-len(tokens) // bs), got=len(table))
        for b in table:
            counts[b] = counts.get(b, 0) + 1
        pos = np.arange(len(tokens))
        got = pool[np.asarray(table, dtype=np.int64)[pos // bs], pos % bs]
        expect(np.array_equal(got, tokens), f"sequence {seq} reads back wrong tokens through "
               f"its block table {table}", inputs=inputs, expected=tokens, got=got.tolist())
    for b in range(nb):
        expect(mgr.ref_count(b) == counts.get(b, 0), f"ref_count({b}) != number of table "
               f"entries pointing at it", inputs=inputs, expected=counts.get(b, 0),
               got=mgr.ref_count(b))
    expect(mgr.num_free_blocks == nb - len(counts), "free blocks + used blocks != total",
           inputs=inputs, expected=nb - len(counts), got=mgr.num_free_blocks)


@EX_08.case("fork shares, the first append copies the shared last block")
def _cow_basic(m):
    mgr = m.CowBlockManager(8, 4)
    mgr.allocate(0, 6)                  # blocks: one full, one with 2 of 4 tokens
    parent = mgr.block_table(0)
    mgr.fork(0, 1)
    expect(mgr.block_table(1) == parent, "a fork shares the parent's blocks",
           inputs="allocate(0, 6); fork(0, 1)", expected=parent, got=mgr.block_table(1))
    expect([mgr.ref_count(b) for b in parent] == [2, 2], "fork raises each count to 2",
           inputs="allocate(0, 6); fork(0, 1)", expected=[2, 2],
           got=[mgr.ref_count(b) for b in parent])
    expect(mgr.take_copies() == [], "fork copies nothing", inputs="allocate, fork",
           expected=[], got=mgr.copies)
    slot = mgr.append_slot(1)
    t1 = mgr.block_table(1)
    copies = mgr.take_copies()
    inputs = "allocate(0, 6); fork(0, 1); append_slot(1)"
    expect(t1[0] == parent[0] and t1[1] != parent[1], "the child gets a fresh last block",
           inputs=inputs, expected=f"[{parent[0]}, <fresh>]", got=t1)
    expect(copies == [(parent[1], t1[1])], "one copy (old last block -> fresh block)",
           inputs=inputs, expected=[(parent[1], t1[1])], got=copies)
    expect(slot == t1[1] * 4 + 2, "slot of position 6 in the fresh block", inputs=inputs,
           expected=t1[1] * 4 + 2, got=slot)
    slot = mgr.append_slot(0)
    expect(mgr.take_copies() == [] and slot == parent[1] * 4 + 2,
           "the parent, now sole owner of its last block, writes in place",
           inputs=inputs + "; append_slot(0)", expected=parent[1] * 4 + 2, got=slot)
    mgr.free(0)
    mgr.free(1)
    expect(mgr.num_free_blocks == 8, "freeing everything returns every block",
           inputs=inputs + "; free(0); free(1)", expected=8, got=mgr.num_free_blocks)


@EX_08.case("bad calls are rejected and change nothing")
def _cow_bad(m):
    mgr = m.CowBlockManager(4, 4)
    mgr.allocate(0, 5)
    expect_raises(lambda: mgr.allocate(0, 3), ValueError, "allocating an existing seq_id",
                  inputs="allocate(0, 5); allocate(0, 3)")
    expect_raises(lambda: mgr.fork(9, 1), (KeyError, ValueError), "fork of an unknown parent",
                  inputs="fork(9, 1)")
    mgr.fork(0, 1)
    expect_raises(lambda: mgr.fork(0, 1), ValueError, "fork onto an existing child",
                  inputs="fork(0, 1) twice")
    expect_raises(lambda: mgr.allocate(2, 13), RuntimeError, "13 tokens need 4 blocks, 2 free",
                  inputs="allocate(2, 13) with 2 free blocks")
    expect(mgr.num_free_blocks == 2, "a failed allocate must not take any block",
           inputs="allocate(2, 13) failed", expected=2, got=mgr.num_free_blocks)


@EX_08.case("random fork / append / free programs with K/V written and read back")
def _cow_random(m):
    rng = np.random.default_rng(20)
    for _trial in range(25):
        nb, bs = int(rng.integers(8, 40)), int(rng.choice([1, 2, 4, 8]))
        mgr = m.CowBlockManager(nb, bs)
        pool = np.full((nb, bs), -1, dtype=np.int64)
        model: dict[int, list[int]] = {}
        log: list[str] = [f"CowBlockManager({nb}, {bs})"]
        next_id, next_tok = 0, 1000
        for _ in range(40):
            op = rng.integers(4)
            live = sorted(model)
            if op == 0 or not live:
                n = int(rng.integers(1, 3 * bs + 1))
                if -(-n // bs) > mgr.num_free_blocks:
                    continue
                mgr.allocate(next_id, n)
                log.append(f"allocate({next_id}, {n})")
                table = mgr.block_table(next_id)
                toks = list(range(next_tok, next_tok + n))
                next_tok += n
                for p, t in enumerate(toks):
                    b = table[p // bs]
                    expect(mgr.ref_count(b) == 1, "a fresh allocation must own its blocks",
                           inputs=dict(operations=log[-10:]), expected=1, got=mgr.ref_count(b))
                    pool[b, p % bs] = t
                model[next_id] = toks
                next_id += 1
            elif op == 1:
                parent = int(rng.choice(live))
                mgr.fork(parent, next_id)
                log.append(f"fork({parent}, {next_id})")
                model[next_id] = list(model[parent])
                next_id += 1
            elif op == 2:
                step = [int(s) for s in rng.choice(live, size=int(rng.integers(1, len(live) + 1)),
                                                   replace=False)]
                if len(step) > mgr.num_free_blocks:
                    continue
                slots = [mgr.append_slot(s) for s in step]
                log.append(f"step: append_slot for {step} -> {slots}")
                copies = mgr.take_copies()
                for src, dst in copies:
                    pool[dst] = pool[src]
                for s, slot in zip(step, slots):
                    b, off = divmod(int(slot), bs)
                    table = mgr.block_table(s)
                    inputs = dict(operations=log[-10:], copies=copies)
                    expect(b == table[-1] and off == len(model[s]) % bs,
                           f"slot {slot} of seq {s} is not position {len(model[s])} of its "
                           f"last block", inputs=inputs,
                           expected=table[-1] * bs + len(model[s]) % bs, got=slot)
                    expect(mgr.ref_count(b) == 1, f"seq {s} would write into block {b}, "
                           f"which is shared (ref_count {mgr.ref_count(b)})", inputs=inputs,
                           expected=1, got=mgr.ref_count(b))
                    pool[b, off] = next_tok
                    model[s].append(next_tok)
                    next_tok += 1
            else:
                s = int(rng.choice(live))
                mgr.free(s)
                log.append(f"free({s})")
                del model[s]
            _check_cow(mgr, nb, bs, pool, model, log)
        for s in sorted(model):
            mgr.free(s)
        expect(mgr.num_free_blocks == nb, "freeing every sequence must return every block",
               inputs=dict(operations=log[-10:]), expected=nb, got=mgr.num_free_blocks)


EX_09 = Exercise(
    "09_beam_search", "beam search: fork the survivors, free the dropped beams",
    ("fork_and_free", "memory_saving"),
    hint="first raise the counts of every block of every new table, then lower those of every "
         "old table; a block reaching 0 is freed (and deleted from ref_counts).")


def _ref_fork_and_free(tables, counts, parents):
    new = [list(tables[p]) for p in parents]
    for t in new:
        for b in t:
            counts[b] += 1
    freed = []
    for t in tables:
        for b in t:
            counts[b] -= 1
            if counts[b] == 0:
                del counts[b]
                freed.append(b)
    return new, sorted(freed)


def _counts(tables):
    c: dict[int, int] = {}
    for t in tables:
        for b in t:
            c[b] = c.get(b, 0) + 1
    return c


@EX_09.case("a dropped beam sharing a block with a survivor (the ordering pitfall)")
def _beam_order(m):
    tables = [[0, 1], [0, 2]]
    counts = {0: 2, 1: 1, 2: 1}
    new, freed = m.fork_and_free(tables, counts, [0, 0])
    inputs = dict(tables=[[0, 1], [0, 2]], ref_counts={0: 2, 1: 1, 2: 1}, parents=[0, 0])
    expect([list(t) for t in new] == [[0, 1], [0, 1]], "both survivors copy beam 0's table",
           inputs=inputs, expected=[[0, 1], [0, 1]], got=new)
    expect(list(freed) == [2], "only beam 1's own block is freed", inputs=inputs,
           expected=[2], got=freed)
    expect(counts == {0: 2, 1: 2}, "ref_counts after the step", inputs=inputs,
           expected={0: 2, 1: 2}, got=counts)
    new[0].append(99)
    expect(new[1] == [0, 1], "new tables must be separate lists (appending to one must not "
           "change another)", inputs=inputs, expected=[0, 1], got=new[1])


@EX_09.case("random beam steps match the reference; saving is the paper's measure")
def _beam_random(m):
    rng = np.random.default_rng(21)
    for _ in range(40):
        k = int(rng.integers(1, 7))
        next_block = 1
        tables = [[0]]
        for _step in range(int(rng.integers(1, 6))):
            parents = [int(p) for p in rng.integers(0, len(tables), size=k)]
            tables = [list(tables[p]) + [next_block + j] for j, p in enumerate(parents)]
            next_block += k
        counts = _counts(tables)
        parents = [int(p) for p in rng.integers(0, len(tables), size=k)]
        inputs = dict(tables=tables, ref_counts=dict(counts), parents=parents)
        ref_counts = dict(counts)
        want_new, want_freed = _ref_fork_and_free(tables, ref_counts, parents)
        got_counts = dict(counts)
        got_new, got_freed = m.fork_and_free([list(t) for t in tables], got_counts, parents)
        expect([list(t) for t in got_new] == want_new, "wrong new tables", inputs=inputs,
               expected=want_new, got=got_new)
        expect(list(got_freed) == want_freed, "wrong freed blocks", inputs=inputs,
               expected=want_freed, got=got_freed)
        expect(got_counts == ref_counts, "wrong ref_counts after the step", inputs=inputs,
               expected=ref_counts, got=got_counts)
        total = sum(len(t) for t in want_new)
        want = (total - len(_counts(want_new))) / total
        got = m.memory_saving(want_new)
        expect(abs(got - want) < 1e-12, "wrong memory saving", inputs=dict(tables=want_new),
               expected=want, got=got)
    expect(m.memory_saving([]) == 0.0, "no blocks: saving 0.0", inputs=dict(tables=[]),
           expected=0.0, got=m.memory_saving([]))
    expect_raises(lambda: m.fork_and_free([[0]], {0: 1}, [3]), (IndexError, ValueError),
                  "parent index 3 of 1 beam must be rejected",
                  inputs=dict(tables=[[0]], parents=[3]))
