"""Block-manager operations per second, minipaged against a plain baseline, side by side.

A trace of a few thousand requests (shared system prompts + a private suffix, random output
lengths, some with n = 2 samples) is replayed through a continuous-batching loop: admit requests
while blocks allow, one decode step appends a token to every running sequence, finished
requests are freed, and when a step runs out of blocks the newest request is dropped (preempted
by recomputation, re-queued). Every allocate / append_slot / fork / free is timed, and the same
trace runs through two managers:

    minipaged    KVCacheManager, the manager the lessons build
    plain        PlainBlockManager: the obvious way, in the style of compact engines: a deque
                 free list, a dict hash -> block, a Block object per block, a cache hit on a
                 free block removed from the deque by value (O(NB))

With prefix caching the n samples of a request are n allocations (as vLLM v1 does,
vllm/v1/engine/parallel_sampling.py); without it they are a fork (vLLM v0 copy-on-write,
vllm/core/block_manager.py fork). The ratio printed is minipaged ops/s over plain ops/s per
operation type (above 1: minipaged is faster), from the times summed over every run.

Fair on a busy machine: the managers replay the trace in short chunks (--chunk scheduling
steps), alternating A B B A ..., so a burst of load from another process hits both; the caption
gives the median and quartiles of the per-chunk ratio as a measure of the spread. Both do the
same operations (same counts, same prefix hits).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import deque

import numpy as np
from rich.console import Console

from minipaged._checks import OutOfBlocksError
from minipaged.kit.bench import fill_unset
from minipaged.kit.bench.plain_manager import PlainBlockManager
from minipaged.kit.cli.common import refuse_if_too_big, table
from minipaged.serving.swap import KVCacheManager


def make_trace(num_requests: int, seed: int = 0) -> list[tuple[list[int], int, int]]:
    """(prompt token ids, output length, samples n) per request."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 32000, size=int(k)).tolist() for k in (40, 96, 160, 250)]
    trace = []
    for _ in range(num_requests):
        prompt = systems[int(rng.integers(0, 4))] + rng.integers(0, 32000, int(
            rng.integers(4, 64))).tolist()
        trace.append((prompt, int(rng.integers(8, 96)), 2 if rng.random() < 0.25 else 1))
    return trace


OPS = ("allocate", "append", "fork", "free")
MAX_RUNNING = 48  # requests in the batch at most, like a scheduler's max_num_seqs


def replay(mgr, trace, prefix: bool) -> dict[str, list[float]]:
    """Run the whole trace through ``mgr``; returns [seconds, count] per operation type."""
    stats = {op: [0.0, 0] for op in OPS}
    for _ in replay_steps(mgr, trace, prefix, stats):
        pass
    return stats


def replay_steps(mgr, trace, prefix: bool, stats: dict[str, list[float]],
                 steps_per_chunk: int = 1):
    """``replay`` as a generator that pauses every ``steps_per_chunk`` scheduling steps (so
    that ``compare`` can interleave two managers), adding [seconds, count] per operation type
    into ``stats``."""
    full = (OutOfBlocksError, MemoryError)
    pc = time.perf_counter
    waiting = deque(range(len(trace)))
    running: dict[int, list] = {}  # request -> [seq ids, tokens left]
    step = 0

    def timed(op, fn, *args):
        t0 = pc()
        out = fn(*args)
        st = stats[op]
        st[0] += pc() - t0
        st[1] += 1
        return out

    def drop(r):
        for s in running.pop(r)[0]:
            timed("free", mgr.free, s)

    while waiting or running:
        while waiting and len(running) < MAX_RUNNING:
            r = waiting[0]
            prompt, out_len, n = trace[r]
            seqs = []
            try:
                for i in range(n):
                    if i == 0 or prefix:
                        timed("allocate", mgr.allocate, (r, i), prompt)
                    else:
                        timed("fork", mgr.fork, (r, 0), (r, i))
                    seqs.append((r, i))
            except full:
                for s in seqs:
                    timed("free", mgr.free, s)
                if not running:
                    raise ValueError(f"request {r} ({len(prompt)} prompt tokens, {n} "
                                     "samples) does not fit in an empty cache; expected a "
                                     "larger --num-blocks") from None
                break
            waiting.popleft()
            running[r] = [seqs, out_len]
        for r in list(running):
            if r not in running:
                continue
            try:
                for s in running[r][0]:
                    timed("append", mgr.append_slot, s, (r * 7 + running[r][1]) % 32000)
            except full:  # preempt the newest request by recomputation
                newest = max(running)
                drop(newest)
                waiting.appendleft(newest)
                continue
            running[r][1] -= 1
            if running[r][1] == 0:
                drop(r)
        if hasattr(mgr, "take_copies"):
            mgr.take_copies()
        step += 1
        if step % steps_per_chunk == 0:
            yield step


def compare(trace, num_blocks: int, block_size: int, prefix: bool, repeats: int,
            steps_per_chunk: int = 8) -> tuple[dict[str, dict[str, list[float]]], list[float]]:
    """Both managers replay the same trace, interleaved chunk by chunk (A B, then B A, so
    neither always runs first), ``repeats`` times. Returns the summed [seconds, count] per
    manager and operation, and per chunk the ratio plain time / minipaged time.

    The garbage collector is off while timing (as ``timeit`` does): a collection pause lands
    on whichever manager happens to cross the allocation threshold, which is noise, not a
    property of either manager. It runs between repeats."""
    totals = {name: {op: [0.0, 0] for op in OPS} for name in ("minipaged", "plain")}
    chunk_ratios: list[float] = []

    def spent(name: str) -> float:
        return sum(v[0] for v in totals[name].values())

    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            gc.collect()
            managers = {"minipaged": KVCacheManager(num_blocks, block_size,
                                                    enable_prefix_caching=prefix),
                        "plain": PlainBlockManager(num_blocks, block_size, prefix)}
            gens = {name: replay_steps(mgr, trace, prefix, totals[name], steps_per_chunk)
                    for name, mgr in managers.items()}
            order, done = ["minipaged", "plain"], set()
            while len(done) < 2:  # both do the same steps, so both end on the same chunk
                before = {name: spent(name) for name in order}
                for name in order:
                    if next(gens[name], None) is None:  # the replay has ended
                        done.add(name)
                chunk = {name: spent(name) - before[name] for name in order}
                if chunk["minipaged"] > 0 and chunk["plain"] > 0:
                    chunk_ratios.append(chunk["plain"] / chunk["minipaged"])
                order.reverse()
    finally:
        if gc_was_on:
            gc.enable()
    return totals, chunk_ratios


# Measured with /usr/bin/time: a trace holds about 3 KB per request (its token lists), the two
# managers about 250 bytes per block together.
BYTES_PER_REQUEST, BYTES_PER_BLOCK = 4_000, 300
# What --requests and --repeats are when not given, without and with --quick (a smoke test).
DEFAULTS, QUICK = dict(requests=3000, repeats=3), dict(requests=300, repeats=1)


def run(args) -> int:
    fill_unset(args, DEFAULTS, QUICK)
    refuse_if_too_big(f"--requests={args.requests} and --num-blocks={args.num_blocks}",
                      args.requests * BYTES_PER_REQUEST + args.num_blocks * BYTES_PER_BLOCK)
    trace = make_trace(args.requests)
    console = Console()
    for prefix in (False, True):
        results, ratios = compare(trace, args.num_blocks, args.block_size, prefix,
                                  args.repeats, args.chunk)
        mode = "with prefix caching (v1)" if prefix else "without prefix caching (v0, fork)"
        t = table(f"{args.requests} requests, NB={args.num_blocks}, BS={args.block_size}, {mode}",
                  ("op", "count", "minipaged ops/s", "plain ops/s", "minipaged / plain"),
                  title_justify="left")
        rows = [(op, results["minipaged"][op], results["plain"][op]) for op in OPS]
        rows.append(("all", *[(sum(v[0] for v in results[m].values()),
                               sum(v[1] for v in results[m].values())) for m in results]))
        for op, (ta, na), (tb, nb) in rows:
            if na and nb:
                t.add_row(op, str(na) if na == nb else f"{na} / {nb}", f"{na / ta:,.0f}",
                          f"{nb / tb:,.0f}", f"{(na / ta) / (nb / tb):.2f}x")
        if ratios:
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            t.caption = (f"ratios: total time over {args.repeats} run(s); per chunk of "
                         f"{args.chunk} steps ({len(ratios)} chunks): median {q[1]:.2f}x, "
                         f"quartiles {q[0]:.2f}x-{q[2]:.2f}x")
        console.print(t)
    return 0
