"""``minipaged bench attention``: what reading K/V through block tables costs, in NumPy.

Decode attention for S sequences of equal context length, three ways, on the same numbers:

    dense      the baseline: K/V of every sequence contiguous, laid out [S, Hkv, Tk, D] (the
               best layout for NumPy's matmul: one GEMM per KV head reads a contiguous [Tk, D]);
               three formulations (one batched matmul; the same in cache-sized chunks of
               (sequence, KV head) pairs; einsum) are timed and the fastest one is the
               baseline the ratios are taken against;
    gather     paged_attention(method="gather"): fetch each sequence's blocks, then the same
               dense kernel. The extra cost is one copy of K/V (a few KV heads at a time, so
               the copy is still in cache when the GEMMs read it);
    online     paged_attention(method="online"): walk the block table, one block of BS keys per
               step for all sequences at once, with the online softmax. On a GPU this is the
               fast way (vLLM's kernel); in NumPy every block costs a handful of small calls
               and many tiny GEMMs, so expect it to be slower here: its point is the
               arithmetic (it is the kernel's algorithm), not NumPy speed.

Why gather costs more than dense on a CPU: the extra copy of K and V (1 GiB per step at S=32,
context 4096, float32) runs at memcpy speed on top of GEMMs that are already slow for decode
(each has only G = H / Hkv = 4 query rows). A GPU kernel never makes that copy; it reads each
block where it lies, which is why the paper's overhead is 20-26% (Fig. 18a).

The paper measures the GPU kernel at 20-26% above a contiguous one (Fig. 18a); the gather path's
ratio here is the NumPy analogue. The default shape is a Llama-like layer: H=32, Hkv=8, D=128,
BS=16, float32, S=32 sequences at contexts 1024 and 4096. When the block manager is present,
the bench also times the block manager's verbs (allocate / append_slot / free) per second.

On a machine shared with other work, run it as ``OPENBLAS_NUM_THREADS=1 minipaged bench
attention``: a BLAS worker thread that loses its core to another process stalls every GEMM,
and the figures then measure the scheduler rather than the attention.
"""

from __future__ import annotations

import argparse
import statistics
import time

QUICK = dict(seqs=4, heads=8, kv_heads=2, head_size=32, block_size=16, contexts=[64, 256],
             repeats=2)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="paged decode attention (gather, online) vs dense NumPy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, default=32, help="S, sequences in the batch (default 32)")
    p.add_argument("--heads", type=int, default=32, help="H, query heads (default 32)")
    p.add_argument("--kv-heads", type=int, default=8, help="Hkv, KV heads (default 8)")
    p.add_argument("--head-size", type=int, default=128, help="D (default 128)")
    p.add_argument("--block-size", type=int, default=16, help="BS, tokens per block (default 16)")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096],
                   help="context lengths Tk to measure (default 1024 4096)")
    p.add_argument("--dtype", choices=("float16", "float32", "float64"), default="float32")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    p.add_argument("--no-online", action="store_true", help="skip the (slow) online method")
    p.add_argument("--quick", action="store_true",
                   help="a tiny configuration that finishes in about a second (for tests)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def _dense_matmul(q, k, v, scale):
    """q [S, H, D], k/v [S, Hkv, Tk, D] -> [S, H, D]: the oracle's kernel, batched over S."""
    import numpy as np

    from minipaged.attention import plain_softmax

    S, H, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    qh = (q.reshape(S * Hkv, G, D) * q.dtype.type(scale))
    limits = np.full(G, Tk - 1)                  # decode: every key visible
    out = plain_softmax(qh, k.reshape(S * Hkv, Tk, D), v.reshape(S * Hkv, Tk, D), limits)
    return out.reshape(S, H, D)


def _dense_matmul_chunked(q, k, v, scale):
    """The same kernel over a few (sequence, KV head) pairs at a time: the working set (scores,
    K, V of one chunk) stays in cache, which is what the gather path enjoys too."""
    import numpy as np

    from minipaged.attention import plain_softmax
    from minipaged.paged.paged_attention import GATHER_CHUNK_BYTES

    S, H, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    qh = (q.reshape(S * Hkv, G, D) * q.dtype.type(scale))
    kf, vf = k.reshape(S * Hkv, Tk, D), v.reshape(S * Hkv, Tk, D)
    limits = np.full(G, Tk - 1)
    step = max(1, GATHER_CHUNK_BYTES // (Tk * D * k.itemsize))
    out = np.empty_like(qh)
    for i in range(0, S * Hkv, step):
        out[i:i + step] = plain_softmax(qh[i:i + step], kf[i:i + step], vf[i:i + step], limits)
    return out.reshape(S, H, D)


def _dense_einsum(q, k, v, scale):
    """The same attention written with einsum, for comparison."""
    import numpy as np

    S, H, D = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(S, Hkv, H // Hkv, D) * q.dtype.type(scale)
    s = np.einsum("shgd,shtd->shgt", qg, k)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    out = np.einsum("shgt,shtd->shgd", s, v)
    out /= s.sum(axis=-1, keepdims=True)
    return out.reshape(S, H, D)


def _block_manager_rates(console, repeats):
    """allocate / append_slot / free per second on a KVCacheManager, if that module exists."""
    try:
        from minipaged.serving.swap import KVCacheManager
    except ImportError:
        console.print("[dim]the block manager is not available: its rates are skipped[/]")
        return None
    n_seqs, prompt, steps, bs = 256, 100, 32, 16
    need = n_seqs * -(-(prompt + steps) // bs)
    prompt_ids = list(range(prompt))
    rates: dict[str, list[float]] = {}

    def cycle():
        mgr = KVCacheManager(need, bs)
        t0 = time.perf_counter()
        for s in range(n_seqs):
            mgr.allocate(s, prompt_ids)
        t1 = time.perf_counter()
        for _ in range(steps):
            for s in range(n_seqs):
                mgr.append_slot(s, 7)
        t2 = time.perf_counter()
        for s in range(n_seqs):
            mgr.free(s)
        t3 = time.perf_counter()
        for name, dt, n in (("allocate (100-token prompt)", t1 - t0, n_seqs),
                            ("append_slot", t2 - t1, n_seqs * steps), ("free", t3 - t2, n_seqs)):
            rates.setdefault(name, []).append(n / dt)

    for _ in range(max(1, repeats)):
        cycle()
    return {name: statistics.median(r) for name, r in rates.items()}


def _interleaved_medians(candidates, repeats):
    """Median seconds per candidate, timing them in turn (round-robin) after one warm-up each:
    load from other processes that comes and goes then hits every method alike, instead of
    whichever one happened to run during it."""
    from minipaged.kit.bench import median_time

    for fn in candidates.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            times[name].append(median_time(fn, repeats=1, warmup=0))
    return {name: statistics.median(t) for name, t in times.items()}


def _measure_context(rng, S, H, Hkv, D, BS, Tk, dtype, repeats, online):
    """Time every method at context Tk; return [(name, seconds, max |out - dense matmul out|)], the
    baseline's name and the K/V bytes one decode step reads."""
    import numpy as np

    from minipaged.paged.paged_attention import paged_attention

    nblk = -(-Tk // BS)
    NB = S * nblk
    # Fill the pool, then give each sequence randomly placed blocks (the paged layout).
    key_cache = rng.standard_normal((NB, Hkv, BS, D), dtype=np.float32).astype(dtype)
    value_cache = rng.standard_normal((NB, Hkv, BS, D), dtype=np.float32).astype(dtype)
    tables = rng.permutation(NB).astype(np.int32).reshape(S, nblk)              # [S, MB]
    lens = np.full(S, Tk, np.int32)
    q = rng.standard_normal((S, H, D), dtype=np.float32).astype(dtype)
    scale = D ** -0.5
    # The same K/V, contiguous per sequence: [S, Hkv, Tk, D].
    k = np.ascontiguousarray(key_cache[tables].transpose(0, 2, 1, 3, 4)
                             .reshape(S, Hkv, nblk * BS, D)[:, :, :Tk])
    v = np.ascontiguousarray(value_cache[tables].transpose(0, 2, 1, 3, 4)
                             .reshape(S, Hkv, nblk * BS, D)[:, :, :Tk])
    candidates = {
        "dense matmul": lambda: _dense_matmul(q, k, v, scale),
        "dense matmul, chunked": lambda: _dense_matmul_chunked(q, k, v, scale),
        "dense einsum": lambda: _dense_einsum(q, k, v, scale),
        "paged gather": lambda: paged_attention(q, key_cache, value_cache, tables, lens,
                                                method="gather"),
    }
    if online:
        candidates["paged online"] = lambda: paged_attention(q, key_cache, value_cache, tables,
                                                             lens, method="online")
    results = {name: (t, candidates[name]()) for name, t in _interleaved_medians(candidates,
                                                                                  repeats).items()}
    best = min((n for n in results if n.startswith("dense")), key=lambda n: results[n][0])
    ref = results["dense matmul"][1].astype(np.float64)     # the oracle's kernel, batched
    rows = [(name, t, float(np.abs(out.astype(np.float64) - ref).max()))
            for name, (t, out) in results.items()]
    return rows, best, k.nbytes + v.nbytes


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    console = Console()
    S, H, Hkv, D, BS = args.seqs, args.heads, args.kv_heads, args.head_size, args.block_size
    if min(S, H, Hkv, D, BS, args.repeats, *args.contexts) < 1 or H % Hkv:
        console.print(f"[red]need positive sizes and H % Hkv == 0; got S={S} H={H} Hkv={Hkv} "
                      f"D={D} BS={BS} contexts={args.contexts} repeats={args.repeats}[/]")
        return 2
    dtype = np.dtype(args.dtype)
    rng = np.random.default_rng(args.seed)
    table = Table(title=f"decode attention, S={S} H={H} Hkv={Hkv} D={D} BS={BS} {dtype.name}, "
                        f"median of {args.repeats}", title_justify="left")
    for col in ("context", "method", "median ms", "x dense", "K/V GB/s", "max |diff|"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for Tk in args.contexts:
        rows, best, kv_bytes = _measure_context(rng, S, H, Hkv, D, BS, Tk, dtype, args.repeats,
                                                not args.no_online)
        base_t = dict((n, t) for n, t, _ in rows)[best]
        for name, t, diff in rows:
            table.add_row(str(Tk), name + ("  (baseline)" if name == best else ""),
                          f"{t * 1e3:.1f}", f"{t / base_t:.2f}", f"{kv_bytes / t / 1e9:.1f}",
                          f"{diff:.1e}")
        table.add_section()
    console.print(table)
    console.print("x dense: median time over the fastest dense formulation's. K/V GB/s: bytes of "
                  "K and V one step reads, over its time. max |diff|: against dense matmul's "
                  "output, the oracle's kernel (0 means the same bits).")
    rates = _block_manager_rates(console, args.repeats)
    if rates:
        t2 = Table(title="block manager (KVCacheManager, BS=16), median of runs",
                   title_justify="left")
        t2.add_column("operation")
        t2.add_column("ops / s", justify="right")
        for name, r in rates.items():
            t2.add_row(name, f"{r:,.0f}")
        console.print(t2)
    return 0
