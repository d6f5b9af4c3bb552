"""Hidden cases for exercises 08 (copy-on-write) and 09 (beam search).

Exercise 08 is graded with K/V actually written: the grader keeps a pool of token values
[NB, BS], writes every token at the slot the learner's manager returns, applies the copies it
reports before each step's writes (as the engine does with copy_blocks), and then reads every
live sequence back through its block table.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.grader.core import Exercise, equal, expect, rejects

EX_08 = Exercise("08_copy_on_write", "fork and copy-on-write append", ("CowBlockManager",))


def _cow_state(mgr, nb: int, seqs):
    """What a call could change, read through the manager's own methods."""
    return {"tables": {s: mgr.block_table(s) for s in seqs},
            "ref_counts": [mgr.ref_count(b) for b in range(nb)],
            "num_free_blocks": mgr.num_free_blocks}


def _counts(tables) -> dict[int, int]:
    """How many table entries point at each block: what its reference count must be."""
    return dict(Counter(b for t in tables for b in t))


def _check_cow(mgr, nb: int, bs: int, pool: np.ndarray, model: dict[int, list[int]],
               log: list[str]) -> None:
    inputs = dict(num_blocks=nb, block_size=bs, operations=log[-10:])
    tables = {seq: mgr.block_table(seq) for seq in model}
    for seq, tokens in model.items():
        table, pos = tables[seq], np.arange(len(tokens))
        equal(len(table), cdiv(len(tokens), bs), f"sequence {seq} holds {len(tokens)} tokens: "
              f"its table length is wrong", inputs)
        equal(pool[np.asarray(table, dtype=np.int64)[pos // bs], pos % bs].tolist(), tokens,
              f"sequence {seq} reads back wrong tokens through its block table {table}", inputs)
    counts = _counts(tables.values())
    equal([mgr.ref_count(b) for b in range(nb)], [counts.get(b, 0) for b in range(nb)],
          "ref_count(b) must equal the number of table entries pointing at b", inputs)
    equal(mgr.num_free_blocks, nb - len(counts), "free blocks + used blocks != total", inputs)


@EX_08.case("fork shares, the first append copies the shared last block",
            hint="before writing into a last block, look at its reference count: shared means "
                 "copy first")
def _cow_basic(m):
    mgr = m.CowBlockManager(8, 4)
    mgr.allocate(0, 6)                  # blocks: one full, one with 2 of 4 tokens
    parent = mgr.block_table(0)
    mgr.fork(0, 1)
    inputs = "allocate(0, 6); fork(0, 1)"
    equal(mgr.block_table(1), parent, "a fork shares the parent's blocks", inputs)
    equal([mgr.ref_count(b) for b in parent], [2, 2], "fork raises each count to 2", inputs)
    equal(mgr.take_copies(), [], "fork copies nothing", inputs + "; take_copies()",
          hint="fork only shares: copies happen later, on the first write to a shared block")
    inputs += "; append_slot(1)"
    slot = mgr.append_slot(1)
    t1 = mgr.block_table(1)
    equal(t1[0], parent[0], "the child keeps sharing the full first block", inputs)
    expect(t1[1] != parent[1], "the child gets a fresh last block", inputs=inputs,
           expected=f"a block other than {parent[1]}", got=t1[1])
    equal(mgr.take_copies(), [(parent[1], t1[1])],
          "one copy, (old last block, fresh block), recorded by append_slot", inputs)
    equal(slot, t1[1] * 4 + 2, "slot of position 6 in the fresh block", inputs)
    inputs += "; append_slot(0)"
    slot = mgr.append_slot(0)
    equal(mgr.take_copies(), [], "the parent, now sole owner of its last block, copies nothing",
          inputs, hint="after the child's copy the old block has one owner left: no copy")
    equal(slot, parent[1] * 4 + 2, "the parent writes in place, in its own last block", inputs)
    mgr.free(0)
    mgr.free(1)
    equal(mgr.num_free_blocks, 8, "freeing everything returns every block",
          inputs + "; free(0); free(1)")


@EX_08.case("bad calls are rejected and change nothing",
            hint="check ids and free blocks before changing anything, so a failed call leaves "
                 "the manager as it was")
def _cow_bad(m):
    mgr = m.CowBlockManager(4, 4)
    mgr.allocate(0, 5)
    state = lambda: _cow_state(mgr, 4, [0])  # noqa: E731
    rejects(lambda: mgr.allocate(0, 3), ValueError, "allocating an existing seq_id",
            "allocate(0, 5); allocate(0, 3)", state=state)
    rejects(lambda: mgr.fork(9, 1), (KeyError, ValueError), "fork of an unknown parent",
            "fork(9, 1)", state=state)
    mgr.fork(0, 1)
    state = lambda: _cow_state(mgr, 4, [0, 1])  # noqa: E731
    rejects(lambda: mgr.fork(0, 1), ValueError, "fork onto an existing child",
            "fork(0, 1) twice", state=state)
    rejects(lambda: mgr.allocate(2, 13), RuntimeError, "13 tokens need 4 blocks, 2 are free",
            "allocate(2, 13) with 2 free blocks", state=state,
            hint="count the blocks needed and compare with the free ones before taking any")
    mgr.allocate(2, 8)    # the pool is full; seq 1's last block (1 of 4 tokens) is shared
    rejects(lambda: mgr.append_slot(1), RuntimeError, "a copy-on-write with no free block",
            "allocate(0, 5); fork(0, 1); allocate(2, 8); append_slot(1)",
            state=lambda: _cow_state(mgr, 4, [0, 1, 2]),
            hint="take the fresh block before lowering the shared block's count")


@EX_08.case("random fork / append / free programs with K/V written and read back",
            hint="a block with reference count > 1 must never be written; copies are applied "
                 "before the step's writes")
def _cow_random(m):
    rng = np.random.default_rng(20)
    for _trial in range(25):
        nb, bs = int(rng.integers(8, 40)), int(rng.choice([1, 2, 4, 8]))
        mgr, pool = m.CowBlockManager(nb, bs), np.full((nb, bs), -1, dtype=np.int64)
        model: dict[int, list[int]] = {}   # seq_id -> the token values it holds, in order
        log: list[str] = [f"CowBlockManager({nb}, {bs})"]
        ids, tokens = itertools.count(), itertools.count(1000)
        for _ in range(40):
            op, live = rng.integers(4), sorted(model)
            if op == 0 or not live:
                n = int(rng.integers(1, 3 * bs + 1))
                if cdiv(n, bs) > mgr.num_free_blocks:
                    continue
                seq = next(ids)
                mgr.allocate(seq, n)
                log.append(f"allocate({seq}, {n})")
                table = mgr.block_table(seq)
                equal([mgr.ref_count(b) for b in table], [1] * len(table),
                      "a fresh allocation must own its blocks", dict(operations=log[-10:]))
                model[seq] = [next(tokens) for _ in range(n)]
                for p, t in enumerate(model[seq]):
                    pool[table[p // bs], p % bs] = t
            elif op == 1:
                parent, seq = int(rng.choice(live)), next(ids)
                mgr.fork(parent, seq)
                log.append(f"fork({parent}, {seq})")
                model[seq] = list(model[parent])
            elif op == 2:
                step = [int(s) for s in rng.choice(live, size=int(rng.integers(1, len(live) + 1)),
                                                   replace=False)]
                if len(step) > mgr.num_free_blocks:
                    continue
                slots = [mgr.append_slot(s) for s in step]
                log.append(f"step: append_slot for {step} -> {slots}")
                copies = mgr.take_copies()
                for src, dst in copies:   # copies first, as the engine runs copy_blocks
                    pool[dst] = pool[src]
                inputs = dict(operations=log[-10:], copies=copies)
                for s, slot in zip(step, slots):
                    equal(slot, mgr.block_table(s)[-1] * bs + len(model[s]) % bs, f"seq {s}'s "
                          f"slot must be position {len(model[s])} of its last block", inputs)
                    equal(mgr.ref_count(slot // bs), 1, f"seq {s} would write into a shared "
                          f"block {slot // bs}", inputs)
                    model[s].append(next(tokens))
                    pool[slot // bs, slot % bs] = model[s][-1]
            else:
                s = int(rng.choice(live))
                mgr.free(s)
                log.append(f"free({s})")
                del model[s]
            _check_cow(mgr, nb, bs, pool, model, log)
        for s in sorted(model):
            mgr.free(s)
        equal(mgr.num_free_blocks, nb, "freeing every sequence must return every block",
              dict(operations=log[-10:]))


EX_09 = Exercise("09_beam_search", "beam search: fork the survivors, free the dropped beams",
                 ("fork_and_free", "memory_saving"))


@EX_09.case("a dropped beam sharing a block with a survivor (the ordering pitfall)",
            hint="a block one beam drops may be the one a survivor keeps: raise the new counts "
                 "before lowering the old ones")
def _beam_order(m):
    counts = {0: 2, 1: 1, 2: 1}
    inputs = dict(tables=[[0, 1], [0, 2]], ref_counts=dict(counts), parents=[0, 0])
    new, freed = m.fork_and_free([[0, 1], [0, 2]], counts, [0, 0])
    equal([list(t) for t in new], [[0, 1], [0, 1]], "both survivors copy beam 0's table", inputs)
    equal(list(freed), [2], "only beam 1's own block is freed", inputs)
    equal(counts, {0: 2, 1: 2}, "ref_counts after the step", inputs)
    new[0].append(99)
    equal(new[1], [0, 1], "new tables must be separate lists (appending to one must not "
          "change another)", inputs, hint="copy each parent's list; do not reuse the object")


@EX_09.case("random beam steps; saving is the paper's measure",
            hint="the new counts are the entries of the new tables; a block is freed when it "
                 "appears in none of them")
def _beam_random(m):
    rng = np.random.default_rng(21)
    for _ in range(40):
        k, next_block, tables = int(rng.integers(1, 7)), 1, [[0]]
        for _step in range(int(rng.integers(1, 6))):
            parents = [int(p) for p in rng.integers(0, len(tables), size=k)]
            tables = [list(tables[p]) + [next_block + j] for j, p in enumerate(parents)]
            next_block += k
        counts = _counts(tables)
        parents = [int(p) for p in rng.integers(0, len(tables), size=k)]
        inputs = dict(tables=tables, ref_counts=dict(counts), parents=parents)
        want_new = [list(tables[p]) for p in parents]
        want_counts = _counts(want_new)
        got_counts = dict(counts)
        got_new, got_freed = m.fork_and_free([list(t) for t in tables], got_counts, parents)
        equal([list(t) for t in got_new], want_new, "wrong new tables", inputs)
        want_freed = sorted(counts.keys() - want_counts.keys())
        equal(list(got_freed), want_freed, "wrong freed blocks", inputs,
              hint="the right blocks in another order: freed is a sorted list"
              if sorted(got_freed) == want_freed else "")
        equal(got_counts, want_counts, "wrong ref_counts after the step", inputs)
        total = sum(len(t) for t in want_new)
        equal(m.memory_saving(want_new), (total - len(want_counts)) / total,
              "wrong memory saving", dict(tables=want_new), tol=1e-12)
    for tables in ([], [[], []]):
        equal(m.memory_saving(tables), 0.0, "no blocks: saving 0.0", dict(tables=tables))
    counts = {0: 1}
    for bad in (3, -1):
        rejects(lambda bad=bad: m.fork_and_free([[0]], counts, [bad]), (IndexError, ValueError),
                f"parent index {bad} of 1 beam must be rejected", dict(tables=[[0]],
                                                                      parents=[bad]),
                state=lambda: dict(counts), hint="check every parent index before changing a "
                "count" + (": tables[-1] is the last beam in Python" if bad < 0 else ""))
