"""Lockstep runner: minipaged's prefix-caching KVCacheManager against vLLM v1's, op by op.

``run_trace`` feeds both managers (tests/vllm/peer_sides.py: each side's small interface, how
vLLM is driven, and the documented differences, normalised there and nowhere else) the same
operations, compares after every operation (success, prompt tokens already cached, free blocks,
table length) and after every step (which prefixes are cached, the eviction order of the free
cached blocks, and the whole free queue when minipaged offers ``free_queue()``). Everything is
keyed by *token prefix*, never by block id or hash value, and every comparison is recorded in a
``Report``.
"""

from __future__ import annotations

import zlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from peer_sides import MinipagedSide, Prefix, VllmSide, minipaged_keeps_duplicates
from peer_traces import RequestSpec, Trace

OP_METRICS = ("success", "cached_tokens", "free_blocks", "table_len")
STEP_METRICS = ("cached_prefixes", "eviction_order", "free_queue")


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
    in peer_sides' docstring) when minipaged has it; ``"stock"`` runs vLLM unchanged.
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
