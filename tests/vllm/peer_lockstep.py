"""Lockstep runner: minipaged's prefix-caching KVCacheManager against vLLM v1's, op by op.

Both managers sit behind one small interface (``allocate`` a prompt, ``append`` one decode
token, ``free``, and read-only views). ``run_trace`` feeds both the same operations, compares
after every operation (success, prompt tokens already cached, free blocks, table length) and
after every step (which prefixes are cached, the eviction order of the free cached blocks, and
the whole free queue when minipaged offers ``free_queue()``). Everything is keyed by *token
prefix*, never by block id or hash value: each side's hashes are translated to the prefix they
stand for, from the tokens this runner submitted to that side.

vLLM is driven the way its scheduler drives it (vllm/v1/core/sched/scheduler.py): a request
built with the engine's block hasher (vllm/v1/engine/core.py:231-240), ``get_computed_blocks``
then ``allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks)``
for a prompt, ``append_output_token_ids`` then ``allocate_slots(request, 1)`` per decode step,
``free`` when it finishes. Paths below are inside the installed ``vllm`` package (0.32.0).

Documented differences, normalised here and nowhere else:
 1. vLLM's pool spends one block on the *null block*: BlockPool pops it from the free queue at
    start-up and never frees it (v1/core/block_pool.py:184-188). The vLLM side gets
    ``num_blocks + 1`` blocks, so both have ``num_blocks`` usable ones.
 2. No lookahead and no watermark: ``allocate_slots`` is called with its default
    ``num_lookahead_tokens=0`` (v1/core/kv_cache_manager.py:377) and the manager with its
    default ``watermark=0.0`` (kv_cache_manager.py:148, 208), as minipaged has neither.
 3. vLLM does not de-duplicate: a block computed twice (two requests miss on the same block,
    or the last-token rule makes a repeated prompt recompute its last full block) is cached
    twice under one hash (v1/core/block_pool.py:48-52; ``insert`` at :85-99), and a lookup
    returns the first copy (``get_one_block``, :62-71). minipaged may choose to keep only the
    first copy (the second stays private). ``minipaged_keeps_duplicates`` asks minipaged which
    it does; if it keeps only the first, the vLLM side is given the same rule, in one place:
    ``_insert_block_hash`` (block_pool.py:626-646, called by ``cache_full_blocks`` at :295)
    leaves a block uncached when another block already holds its hash. Everything else about
    vLLM is untouched, and ``reference="stock"`` runs the unchanged vLLM, to measure what the
    choice costs (the prefix survives until its *last* copy is evicted; the copies sit at
    different places in the free queue). The views count a block as cached only if it is the
    copy a lookup returns (its *primary*), on both sides.
"""

from __future__ import annotations

import zlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from peer_traces import RequestSpec, Trace
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

import minipaged

Prefix = tuple[int, ...]
OP_METRICS = ("success", "cached_tokens", "free_blocks", "table_len")
STEP_METRICS = ("cached_prefixes", "eviction_order", "free_queue")


def keep_first_copy_only(pool) -> None:
    """Difference 3 as minipaged resolves it, applied to a vLLM BlockPool: a full block whose
    hash another block already holds stays uncached."""
    insert = pool._insert_block_hash

    def insert_first_copy_only(key, block, num_tokens) -> None:
        if block.block_hash is None and pool.cached_block_hash_to_block.get_one_block(key):
            return  # another block holds this prefix already: this copy stays uncached
        insert(key, block, num_tokens)

    pool._insert_block_hash = insert_first_copy_only


class VllmSide:
    """vLLM's v1 KVCacheManager, standalone: one full-attention group, prefix caching on."""

    def __init__(self, num_blocks: int, block_size: int, keep_duplicates: bool = True) -> None:
        # The engine's default hash (CacheConfig.prefix_caching_hash_algo = "sha256",
        # vllm/config/cache.py:143), initialised the way EngineCore does it.
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=16,
                                 dtype=torch.float32)
        config = KVCacheConfig(num_blocks=num_blocks + 1,  # + the null block (difference 1)
                               kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
        self.mgr = VllmKVCacheManager(config, max_model_len=1 << 20,
                                      scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True)
        self.pool = self.mgr.block_pool
        if not keep_duplicates:  # difference 3, as minipaged chose: the first copy only
            keep_first_copy_only(self.pool)
        self.requests: dict[str, Request] = {}
        self.prefix_of: dict[bytes, Prefix] = {}  # vLLM block hash -> the prefix it covers
        self.block_size = block_size

    def _learn(self, req: Request) -> None:
        bs, tokens = self.block_size, req.all_token_ids
        for i, h in enumerate(req.block_hashes):
            self.prefix_of.setdefault(h, tuple(tokens[:(i + 1) * bs]))

    def allocate(self, rid: str, tokens: list[int]) -> int | None:
        """Prompt tokens already cached, or None when the pool cannot hold the prompt."""
        req = Request(rid, list(tokens), SamplingParams(max_tokens=1 << 20), None,
                      block_hasher=self.hasher)
        self._learn(req)
        blocks, hits, _ = self.mgr.get_computed_blocks(req)
        if self.mgr.allocate_slots(req, req.num_tokens - hits, hits, blocks) is None:
            return None
        req.num_computed_tokens = req.num_tokens  # the whole prompt is prefilled in one step
        req.status = RequestStatus.RUNNING
        self.requests[rid] = req
        return hits

    def append(self, rid: str, token: int) -> bool:
        req = self.requests[rid]
        req.append_output_token_ids(token)
        self._learn(req)
        if self.mgr.allocate_slots(req, 1) is None:
            return False
        req.num_computed_tokens += 1
        return True

    def free(self, rid: str) -> None:
        self.mgr.free(self.requests.pop(rid))

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def table_len(self, rid: str) -> int:
        return len(self.mgr.get_block_ids(rid)[0])

    def _key(self, block) -> Prefix | None:
        """The prefix a block is the primary cached copy of, else None (difference 3)."""
        key = block.block_hash
        if key is None or block.is_null:
            return None
        if self.pool.cached_block_hash_to_block.get_one_block(key) is not block:
            return None
        return self.prefix_of[get_block_hash(key)]

    def cached_prefixes(self) -> set[Prefix]:
        return {k for b in self.pool.blocks if (k := self._key(b)) is not None}

    def free_queue(self) -> list[Prefix | None]:
        return [self._key(b) for b in self.pool.free_block_queue.get_all_free_blocks()]

    def eviction_order(self) -> list[Prefix]:
        return [k for k in self.free_queue() if k is not None]

    def num_duplicates(self) -> int:
        """Blocks that carry a hash but are not its primary copy (difference 3)."""
        return sum(1 for b in self.pool.blocks
                   if b.block_hash is not None and not b.is_null and self._key(b) is None)


class MinipagedSide:
    """minipaged.KVCacheManager with prefix caching, seen through ``mgr.allocator``'s views."""

    def __init__(self, num_blocks: int, block_size: int,
                 factory: Callable[..., minipaged.KVCacheManager] | None = None) -> None:
        self.prefix_of: dict[int, Prefix] = {}
        self._ids: dict[Prefix, int] = {}
        make = factory or minipaged.KVCacheManager
        # A hash function that names each prefix by a number of its own: collision-free, so
        # the hash -> prefix map is exact (the chain rule h_i = f(h_{i-1}, tokens_i) is
        # minipaged's contract for ``hash_fn``).
        self.mgr = make(num_blocks, block_size, enable_prefix_caching=True, hash_fn=self._hash)

    def _hash(self, parent: int, token_ids: tuple[int, ...]) -> int:
        prefix = self.prefix_of.get(parent, ()) + tuple(token_ids)
        h = self._ids.setdefault(prefix, len(self._ids) + 1)  # never 0, minipaged's root
        self.prefix_of[h] = prefix
        return h

    def allocate(self, rid: str, tokens: list[int]) -> int | None:
        try:
            return self.mgr.allocate(rid, tokens)
        except minipaged.OutOfBlocksError:
            return None

    def append(self, rid: str, token: int) -> bool:
        try:
            self.mgr.append_slot(rid, token)
        except minipaged.OutOfBlocksError:
            return False
        return True

    def free(self, rid: str) -> None:
        self.mgr.free(rid)

    def num_free_blocks(self) -> int:
        return self.mgr.num_free_blocks

    def table_len(self, rid: str) -> int:
        return len(self.mgr.block_table(rid))

    def _key(self, block: int) -> Prefix | None:
        alloc = self.mgr.allocator
        h = alloc.block_hash(block)
        if h is None or alloc.cached_blocks().get(h) != block:
            return None
        return self.prefix_of[h]

    def cached_prefixes(self) -> set[Prefix]:
        return {self.prefix_of[h] for h in self.mgr.allocator.cached_blocks()}

    def eviction_order(self) -> list[Prefix]:
        return [k for b in self.mgr.allocator.lru_blocks() if (k := self._key(b)) is not None]

    def free_queue(self) -> list[Prefix | None] | None:
        """All free blocks, next allocated first; None where minipaged has no ``free_queue``."""
        queue = getattr(self.mgr.allocator, "free_queue", None)
        return None if queue is None else [self._key(b) for b in queue()]


def minipaged_keeps_duplicates(factory: Callable | None = None) -> bool:
    """Does minipaged cache the second copy of a block computed twice, as vLLM does?

    Probe: the same two-block prompt twice. The second request hits the first block only (the
    last prompt token is recomputed), so it computes the second block again."""
    side = MinipagedSide(4, 2, factory)
    side.allocate("a", [1, 2, 3, 4])
    side.allocate("b", [1, 2, 3, 4])
    return side.mgr.allocator.block_hash(side.mgr.block_table("b")[1]) is not None


@dataclass
class Report:
    trace: str
    steps: int = 0
    ops: int = 0
    compared: Counter = field(default_factory=Counter)
    equal: Counter = field(default_factory=Counter)
    divergences: list[str] = field(default_factory=list)
    stopped: str | None = None
    stats: Counter = field(default_factory=Counter)  # hits, evictions, preemptions, ...

    @property
    def ok(self) -> bool:
        return not self.divergences and self.stopped is None

    def summary(self) -> str:
        lines = [f"{self.trace}: {self.steps} steps, {self.ops} ops, stats {dict(self.stats)}"]
        lines += [f"  {m}: {self.equal[m]}/{self.compared[m]} equal" for m in self.compared]
        if self.stopped:
            lines.append(f"  stopped: {self.stopped}")
        lines += [f"  divergence: {d}" for d in self.divergences[:5]]
        return "\n".join(lines)


def _fmt(p: Prefix | None) -> str:
    return "uncached" if p is None else f"<{len(p)} tokens ..{','.join(map(str, p[-4:]))}>"


def describe(mine: object, theirs: object) -> str:
    """A short account of how two compared values differ, prefixes abbreviated."""
    if isinstance(mine, set) and isinstance(theirs, set):
        only_m, only_v = sorted(mine - theirs, key=len), sorted(theirs - mine, key=len)
        return (f"cached only in minipaged: {[_fmt(p) for p in only_m[:4]]}, "
                f"only in vLLM: {[_fmt(p) for p in only_v[:4]]}")
    if isinstance(mine, list) and isinstance(theirs, list):
        i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                 min(len(mine), len(theirs)))
        return (f"lengths {len(mine)} / {len(theirs)}, first difference at position {i}: "
                f"minipaged {[_fmt(p) for p in mine[i:i + 3]]}, "
                f"vLLM {[_fmt(p) for p in theirs[i:i + 3]]}")
    return f"minipaged {mine!r} != vLLM {theirs!r}"


class Lockstep:
    """Applies each operation to both sides and records every comparison in a Report."""

    def __init__(self, trace: Trace, factory: Callable | None, keep_duplicates: bool) -> None:
        self.trace = trace
        self.mp = MinipagedSide(trace.num_blocks, trace.block_size, factory)
        self.vl = VllmSide(trace.num_blocks, trace.block_size, keep_duplicates)
        self.report = Report(f"{trace.name}[seed={trace.seed}]")
        self.where = ""
        self._cached_before: set[Prefix] = set()

    def check(self, metric: str, mine: object, theirs: object) -> bool:
        r = self.report
        r.compared[metric] += 1
        if mine == theirs:
            r.equal[metric] += 1
            return True
        r.divergences.append(f"{self.where}: {metric}: {describe(mine, theirs)}")
        if len(r.divergences) == 1:
            r.stats["duplicates_before_first_divergence"] = r.stats["max_duplicates"]
        return False

    def _after_op(self, rid: str | None) -> None:
        self.report.ops += 1
        stats = self.report.stats
        stats["max_duplicates"] = max(stats["max_duplicates"], self.vl.num_duplicates())
        self.check("free_blocks", self.mp.num_free_blocks(), self.vl.num_free_blocks())
        if rid is not None:
            self.check("table_len", self.mp.table_len(rid), self.vl.table_len(rid))

    def allocate(self, rid: str, tokens: list[int]) -> bool | None:
        """True / False when both sides agree the prompt fits or not; None when they disagree."""
        self.where = f"step {self.report.steps} allocate {rid} ({len(tokens)} tokens)"
        mine, theirs = self.mp.allocate(rid, tokens), self.vl.allocate(rid, tokens)
        if not self.check("success", mine is not None, theirs is not None):
            return None
        ok = mine is not None
        if ok:
            self.check("cached_tokens", mine, theirs)
            self.report.stats["hit_tokens"] += theirs
            self.report.stats["hit_tokens_minipaged"] += mine
        self._after_op(rid if ok else None)
        return ok

    def append(self, rid: str, token: int) -> bool | None:
        self.where = f"step {self.report.steps} append {rid}"
        mine, theirs = self.mp.append(rid, token), self.vl.append(rid, token)
        if not self.check("success", mine, theirs):
            return None
        self._after_op(rid if mine else None)
        return mine

    def free(self, rid: str) -> None:
        self.where = f"step {self.report.steps} free {rid}"
        self.mp.free(rid)
        self.vl.free(rid)
        self._after_op(None)

    def end_step(self) -> None:
        self.where = f"end of step {self.report.steps}"
        cached = self.vl.cached_prefixes()
        self.report.stats["evictions"] += len(self._cached_before - cached)
        self._cached_before = cached
        self.check("cached_prefixes", self.mp.cached_prefixes(), cached)
        self.check("eviction_order", self.mp.eviction_order(), self.vl.eviction_order())
        queue = self.mp.free_queue()
        if queue is not None:
            self.check("free_queue", queue, self.vl.free_queue())
        self.report.steps += 1


def next_token(trace: Trace, tokens: list[int], rng_state: int) -> int:
    """The next decode token: a function of the tokens so far when the trace is greedy (the same
    prompt then gets the same reply), else of the request's own counter too."""
    data = repr(tokens if trace.greedy else (rng_state, tokens[-4:])).encode()
    return zlib.crc32(data) % trace.vocab


def run_trace(trace: Trace, factory: Callable | None = None,
              reference: str = "normalised") -> Report:
    """Serve ``trace`` on both managers in lockstep; the report holds every comparison.

    ``reference="normalised"`` gives vLLM minipaged's documented duplicate rule (difference 3
    in the module docstring) when minipaged has it; ``"stock"`` runs vLLM unchanged.
    Each step: admit waiting requests first come first served while the prompt fits (at most
    ``max_running``); give every running request one decode token; free those that are done
    (and queue a conversation's next turn). A decode step that finds no free block preempts
    that request (freed on both sides, re-queued first with all its tokens, as vLLM's
    recompute preemption does). A request that cannot fit even alone is dropped. The run stops
    early only if the two sides disagree on success, since the next operation depends on it."""
    if reference not in ("normalised", "stock"):
        raise ValueError(f"reference={reference!r}; expected 'normalised' or 'stock'")
    # The duplicate rule is minipaged's design, asked of the real manager (not of a mutant).
    keep = reference == "stock" or minipaged_keeps_duplicates()
    ls = Lockstep(trace, factory, keep)
    ls.report.trace += f" vs {'stock' if keep else 'de-duplicated'} vLLM"
    pending = deque(sorted(trace.requests, key=lambda r: r.arrival))
    waiting: deque[RequestSpec] = deque()
    running: dict[str, tuple[RequestSpec, list[int], int]] = {}  # rid -> (spec, tokens, left)
    restarts: Counter = Counter()
    now = 0
    while (pending or waiting or running) and now < trace.max_steps:
        while pending and pending[0].arrival <= now:
            waiting.append(pending.popleft())
        while waiting and len(running) < trace.max_running:
            spec = waiting[0]
            ok = ls.allocate(spec.rid, spec.prompt)
            if ok is None:
                ls.report.stopped = ls.where + ": the sides disagree on success"
                return ls.report
            if not ok:
                if not running:  # cannot fit even alone: drop it
                    waiting.popleft()
                    ls.report.stats["dropped"] += 1
                    continue
                break
            waiting.popleft()
            running[spec.rid] = (spec, list(spec.prompt), spec.n_out)
        for rid in list(running):
            spec, tokens, left = running[rid]
            tok = next_token(trace, tokens, zlib.crc32(rid.encode()) + left)
            ok = ls.append(rid, tok)
            if ok is None:
                ls.report.stopped = ls.where + ": the sides disagree on success"
                return ls.report
            tokens.append(tok)
            left -= 1
            if not ok:  # preempt by recompute: all tokens so far become the new prompt
                ls.free(rid)
                del running[rid]
                ls.report.stats["preemptions"] += 1
                if left > 0:
                    restarts[spec.rid] += 1
                    waiting.appendleft(RequestSpec(f"{spec.rid}~{restarts[spec.rid]}", now,
                                                   tokens, left, spec.followups, spec.gap))
                continue
            if left == 0:
                ls.free(rid)
                del running[rid]
                if spec.followups:
                    user, n_out = spec.followups[0]
                    nxt = RequestSpec(f"{spec.rid}+", now + spec.gap, tokens + user, n_out,
                                      spec.followups[1:], spec.gap)
                    pending.append(nxt)
                    pending = deque(sorted(pending, key=lambda r: r.arrival))
            else:
                running[rid] = (spec, tokens, left)
        ls.end_step()
        now += 1
    if pending or waiting or running:
        ls.report.stopped = f"trace did not finish in {trace.max_steps} steps"
    return ls.report
