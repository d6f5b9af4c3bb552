"""Prefix caching and block accounting: minipaged against vLLM v1's KVCacheManager, in lockstep.

Every seeded trace of tests/vllm/peer_traces.py is served by ``minipaged.KVCacheManager(...,
enable_prefix_caching=True)`` and by vLLM 0.32's ``KVCacheManager`` side by side
(tests/vllm/peer_sides.py says how each is driven and which documented differences are
normalised, with the vLLM source lines). After every operation: success, prompt tokens already
cached, free blocks, table length; after every step: the cached prefixes and the eviction order
of the free cached blocks (and the whole free queue, when minipaged's allocator has
``free_queue()``), all keyed by token prefix.

Two mutants of minipaged's manager show that the comparison can fail: one evicts the most
recently used cached block, one ignores the last-token rule.
"""

from __future__ import annotations

from collections import Counter

import pytest
from peer_traces import BS, FAMILIES, SEEDS

import minipaged

pytestmark = pytest.mark.requires("vllm")

def _cases():
    for family in FAMILIES:
        for seed in SEEDS:
            yield pytest.param(family, seed, id=f"{family}-{seed}")


@pytest.mark.parametrize(("family", "seed"), list(_cases()))
def test_lockstep_matches_vllm(lockstep, record, family, seed):
    report = lockstep.run_trace(FAMILIES[family](seed))
    record("normalised", family, report)
    assert report.ok, report.summary()


@pytest.mark.parametrize(("family", "seed"), [(f, s) for f in FAMILIES for s in SEEDS],
                         ids=[f"{f}-{s}" for f in FAMILIES for s in SEEDS])
def test_stock_vllm_differs_only_after_a_duplicate(lockstep, record, family, seed):
    """Unchanged vLLM: where minipaged keeps only the first copy of a block computed twice, any
    divergence from stock vLLM must come after vLLM cached a second copy (difference 3 of
    peer_sides), never before. The figures show what that choice costs."""
    report = lockstep.run_trace(FAMILIES[family](seed), reference="stock")
    record("stock", family, report)
    if lockstep.minipaged_keeps_duplicates():
        assert report.ok, report.summary()  # then "stock" is the normalised comparison itself
    else:
        assert report.ok or report.stats["duplicates_before_first_divergence"] > 0, \
            report.summary()


def test_traces_reach_what_they_claim(lockstep):
    """The comparison is only as strong as the traces: they must hit, evict, preempt, run out
    of room and make vLLM compute blocks twice, or a bug there could never show."""
    stats = {f: sum((lockstep.run_trace(FAMILIES[f](s), reference="stock").stats
                     for s in SEEDS), Counter()) for f in FAMILIES}
    for family in ("shared-system-prompt", "eviction-pressure", "exact-multiples",
                   "multi-turn", "recompute-after-eviction"):
        assert stats[family]["hit_tokens"] > 0, family
    for family in ("shared-system-prompt", "eviction-pressure", "no-sharing", "multi-turn"):
        assert stats[family]["evictions"] > 0, family
    assert stats["no-sharing"]["preemptions"] > 0
    for family in ("exact-multiples", "repeated-identical", "recompute-after-eviction"):
        assert stats[family]["max_duplicates"] > 0, family


def test_vllm_reuses_uncached_blocks_before_evicting(lockstep):
    """A fact about vLLM 0.32 that the comparison relies on and minipaged must match: a freed
    block without a hash goes to the *front* of the free queue, a cached one to the back
    (vllm/v1/core/block_pool.py:783-803), so every uncached free block is handed out before
    any cached block is evicted. (Older vLLM v1 appended both at the back.)"""
    side = lockstep.VllmSide(num_blocks=6, block_size=BS)
    assert side.allocate("a", list(range(2 * BS + 1))) == 0  # 2 full blocks + 1 partial
    side.free("a")
    queue = side.free_queue()
    assert queue[0] is None                          # a's partial block, reused first
    assert queue[-2:] == [tuple(range(2 * BS)), tuple(range(BS))]  # tail block evicted first
    assert queue[1:-2] == [None, None, None]         # the never-used blocks in between


def test_duplicate_probe_sees_minipaged_rule(lockstep):
    """The probe that picks the normalisation reads minipaged's real behaviour."""
    mgr = minipaged.KVCacheManager(4, 2, enable_prefix_caching=True)
    mgr.allocate("a", [1, 2, 3, 4])
    assert mgr.allocate("b", [1, 2, 3, 4]) == 2  # the last block is recomputed
    second_copy = mgr.block_table("b")[1]
    cached = mgr.allocator.block_hash(second_copy) is not None
    assert lockstep.minipaged_keeps_duplicates() is cached


# ---- mutants: the comparison must catch a wrong manager -----------------------------------
def _hook(obj: object, *names: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        pytest.fail(f"this mutant patches {type(obj).__name__}.{missing}, which the prefix "
                    "cache no longer has: re-point the mutant at the current implementation",
                    pytrace=False)


def evict_most_recent(mgr, monkeypatch) -> None:
    """Mutant: when a cached block must be evicted, take the most recently freed one."""
    alloc = mgr.allocator
    _hook(alloc, "_take_free", "_free", "_hash", "evict")

    def take_newest() -> int:
        head = next(iter(alloc._free))
        block = head
        if alloc._hash[head] is not None:  # an eviction: the newest cached free block instead
            block = [b for b in alloc._free if alloc._hash[b] is not None][-1]
        del alloc._free[block]
        if alloc._hash[block] is not None:
            alloc.evict(block)
        return block

    monkeypatch.setattr(alloc, "_take_free", take_newest)


def ignore_last_token_rule(mgr, monkeypatch) -> None:
    """Mutant: let a prompt hit every full block, its last token's block included."""
    _hook(mgr, "_plan")
    plan = mgr._plan

    def plan_all(tokens):
        # One token more lifts the (n - 1) // BS cap to n // BS; keep only real full blocks.
        hashes, hits = plan([*tokens, 0])
        n = len(tokens) // mgr.block_size
        return hashes[:n], hits[:n]

    monkeypatch.setattr(mgr, "_plan", plan_all)


def _mutated(monkeypatch, mutate):
    def factory(*args, **kwargs):
        mgr = minipaged.KVCacheManager(*args, **kwargs)
        mutate(mgr, monkeypatch)
        return mgr
    return factory


@pytest.mark.parametrize(("mutate", "family", "metrics"), [
    (evict_most_recent, "eviction-pressure", {"cached_prefixes", "eviction_order"}),
    (ignore_last_token_rule, "exact-multiples", {"cached_tokens"}),
], ids=["evict-most-recent", "ignore-last-token"])
def test_mutant_is_caught(lockstep, monkeypatch, mutate, family, metrics):
    trace = FAMILIES[family](0)
    assert lockstep.run_trace(trace).ok  # the real manager agrees on this trace ...
    report = lockstep.run_trace(trace, _mutated(monkeypatch, mutate))
    assert not report.ok                 # ... the mutant does not
    first = report.divergences[0]
    assert any(f": {m}:" in first for m in metrics), first
