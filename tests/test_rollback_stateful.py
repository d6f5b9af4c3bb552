"""Stateful tests of ``rollback``: speculative decoding's rejected tokens, with real K/V.

The machines of tests/test_kv_cache_stateful.py (the paged manager alone) and
tests/test_sharing_stateful.py (fork, copy-on-write, prefix caching, swap, recompute) get three
more rules, so rollbacks mix with every other operation:

    speculate        a decode step with k draft tokens: ``append_slot`` for each (lookahead
                     slots), the verification pass writes all their K/V, then the target model
                     rejects the last r of them and ``rollback(seq, r)`` gives their slots back;
    rollback         any sequence loses its last n tokens (0 <= n < length), K/V written;
    bad rollback     n out of range or not an int: a clear error, nothing changed.
Without prefix caching one more: ``rollback`` of tokens whose K/V are not written yet (their
pending writes dropped), so a pending copy-on-write into a block the rollback empties goes too.

Invariants, in prose here and asserted in the code below (besides each machine's own, which
keep running: the K/V of every live sequence read back through paged attention equal dense
attention over what the model wrote, a shared block is never written, usage equals its oracle,
the hash table maps only to blocks holding its tokens, freeing everything empties the pool):
    R1  after rollback(s, n) the sequence holds its first len - n tokens, and its table is its
        old table's first ceil((len - n) / BS) entries: nothing else in it moved;
    R2  every block the rollback dropped lost exactly one user, and no other block's count
        changed, except the source of a dropped pending copy (it loses that copy's read);
    R3  a rollback writes nothing: the K/V arrays are bit-identical before and after, so no
        other sequence sharing a block sees a change (and R3 + S2: the next write into a shared
        block copies it first);
    R4  a refused rollback changes nothing (the whole observable state, ``snapshot``).
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from test_kv_cache_stateful import PagedCacheMachine, snapshot
from test_sharing_stateful import PrefixCachingMachine, SharingMachine

from minipaged._checks import cdiv

BAD_N = [-1, 1.5, True, None, "1"]


def check_rollback(mgr, sid, n, kc, vc) -> None:
    """rollback(sid, n) on ``mgr``, checking R1-R3 around it."""
    bs = mgr.block_size
    old_table, old_tokens = mgr.block_table(sid), mgr.token_ids(sid)
    refs = [mgr.ref_count(b) for b in range(mgr.num_blocks)]
    copies = list(getattr(mgr, "pending_copies", []))
    k0, v0 = kc.copy(), vc.copy()
    mgr.rollback(sid, n)
    keep = len(old_tokens) - n
    assert mgr.token_ids(sid) == old_tokens[:keep]                        # R1
    assert mgr.block_table(sid) == old_table[:cdiv(keep, bs)]             # R1
    dropped = set(old_table[cdiv(keep, bs):])
    gone = {src for src, dst in copies if dst in dropped and mgr.ref_count(dst) == 0}
    for b in range(mgr.num_blocks):                                       # R2
        want = refs[b] - (b in dropped) - sum(1 for src, dst in copies
                                             if src == b and dst in dropped
                                             and mgr.ref_count(dst) == 0)
        assert mgr.ref_count(b) == want, f"block {b}: {refs[b]} -> {mgr.ref_count(b)}"
    assert gone <= {src for src, _ in copies}
    assert np.array_equal(kc, k0, equal_nan=True) and np.array_equal(vc, v0, equal_nan=True)  # R3


def refuse_bad(mgr, sid, bad) -> None:
    before = snapshot(mgr)
    n = mgr.seq_len(sid) + 1 if bad is None else bad   # None stands for "more than it holds"
    try:
        mgr.rollback(sid, n)
    except (TypeError, ValueError) as e:
        assert "n=" in str(e)
    else:
        raise AssertionError(f"rollback({sid!r}, {n!r}) was accepted")
    assert snapshot(mgr) == before                                         # R4


class RollbackPagedMachine(PagedCacheMachine):
    """The paged manager alone: rollbacks among allocate / append / free."""

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def rollback(self, data):
        sid = data.draw(st.sampled_from(sorted(self.model)))
        n = data.draw(st.integers(0, self.mgr.seq_len(sid) - 1))
        check_rollback(self.mgr, sid, n, self.kc, self.vc)
        ks, vs = self.model[sid]
        del ks[len(ks) - n:], vs[len(vs) - n:]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), bad=st.sampled_from(BAD_N))
    def bad_rollback(self, data, bad):
        refuse_bad(self.mgr, data.draw(st.sampled_from(sorted(self.model))), bad)


class RollbackSharingMachine(SharingMachine):
    """Fork, copy-on-write, swap and recompute, with speculative steps and rollbacks."""

    def _truncate(self, sid, n):
        ks, vs, keys = self.model[sid]
        del ks[len(ks) - n:], vs[len(vs) - n:], keys[len(keys) - n:]
        self._seen(sid)  # S7 holds again from the shorter table (R1 checked it)

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data(), drafts=st.lists(st.integers(0, 3), min_size=1, max_size=5))
    def speculate(self, data, drafts):
        sid = data.draw(st.sampled_from(self._gpu_seqs()))
        self.flush()
        before = self.mgr.seq_len(sid)
        for token in drafts:  # lookahead slots for the draft tokens
            self._append(sid, token)
        got = self.mgr.seq_len(sid) - before  # an append may have run out of blocks
        self.flush()  # the verification pass writes every draft token's K/V
        rejected = data.draw(st.integers(0, got))
        check_rollback(self.mgr, sid, rejected, self.kc, self.vc)
        self._truncate(sid, rejected)

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data())
    def rollback(self, data):
        sid = data.draw(st.sampled_from(self._gpu_seqs()))
        self.flush()
        n = data.draw(st.integers(0, self.mgr.seq_len(sid) - 1))
        check_rollback(self.mgr, sid, n, self.kc, self.vc)
        self._truncate(sid, n)

    @precondition(lambda self: not self.prefix_mode
                  and any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def rollback_unwritten(self, data, tokens):
        """Tokens appended (pending writes, maybe a pending copy-on-write) then rolled back
        before their K/V are written: their writes are dropped, and so is a copy into a block
        the rollback empties."""
        sid = data.draw(st.sampled_from(self._gpu_seqs()))
        start = self.mgr.seq_len(sid)
        for token in tokens:
            self._append(sid, token)
        n = data.draw(st.integers(0, self.mgr.seq_len(sid) - start))
        check_rollback(self.mgr, sid, n, self.kc, self.vc)
        kept = set(self.mgr.slot_mapping(sid, 0, self.mgr.seq_len(sid)).tolist())
        self.pending = [w for w in self.pending if w[0] != sid or w[1] in kept]
        self._truncate(sid, n)

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data(), bad=st.sampled_from(BAD_N))
    def bad_rollback(self, data, bad):
        refuse_bad(self.mgr, data.draw(st.sampled_from(self._gpu_seqs())), bad)

    @precondition(lambda self: bool(self.mgr.swapped_seq_ids) if hasattr(self, "mgr") else False)
    @rule(data=st.data())
    def rollback_swapped(self, data):
        sid = data.draw(st.sampled_from(sorted(self.mgr.swapped_seq_ids, key=repr)))
        before = snapshot(self.mgr)
        try:
            self.mgr.rollback(sid, 0)
        except ValueError as e:
            assert "swapped out" in str(e)
        else:
            raise AssertionError("a swapped-out sequence was rolled back")
        assert snapshot(self.mgr) == before                                # R4


class RollbackPrefixMachine(RollbackSharingMachine, PrefixCachingMachine):
    """The same with prefix caching on: rolled-back blocks were cached as they filled."""

    prefix_mode = True


RollbackPagedMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30)
RollbackSharingMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30)
RollbackPrefixMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30)
TestRollbackPaged = RollbackPagedMachine.TestCase
TestRollbackCopyOnWrite = RollbackSharingMachine.TestCase
TestRollbackPrefixCaching = RollbackPrefixMachine.TestCase
