"""What reading K/V through block tables costs, in NumPy: paged decode attention vs dense.

Decode attention for S sequences of equal context length, on the same numbers:

    dense      the baseline: K/V of every sequence contiguous, [S, Hkv, Tk, D] (the best
               layout for NumPy's matmul), computed whole and in cache-sized chunks of
               (sequence, KV head) pairs; the faster of the two is the baseline;
    gather     paged_attention(method="gather"): fetch each sequence's blocks, then the same
               dense kernel; the extra cost is one copy of K/V, a few KV heads at a time;
    online     paged_attention(method="online"): walk the block table one block of BS keys
               at a time with the online softmax, the GPU kernel's algorithm; in NumPy each
               block costs a handful of small calls, so expect it to be slower here.

The paper measures its GPU kernel at 20-26% above a contiguous one (Fig. 18a); a GPU kernel
reads each block where it lies, while NumPy's gather copies it first, so the gather ratio here
is only the CPU analogue. The default shape is a Llama-like layer: H=32, Hkv=8, D=128, BS=16,
float32, S=32 sequences at contexts 1024 and 4096. On a shared machine run it as
OPENBLAS_NUM_THREADS=1 minipaged bench attention: a BLAS thread that loses its core stalls
every GEMM, and the figures then measure the scheduler rather than the attention.
"""

from __future__ import annotations

import statistics

from minipaged._checks import cdiv

QUICK = dict(seqs=4, heads=8, kv_heads=2, head_size=32, block_size=16, contexts=[64, 256],
             repeats=2)


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

    nblk = cdiv(Tk, BS)
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


def run(args) -> int:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from minipaged.kit.cli.common import refuse_if_too_big

    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    S, H, Hkv, D, BS = args.seqs, args.heads, args.kv_heads, args.head_size, args.block_size
    if H % Hkv:
        raise ValueError(f"--heads={H} must be a multiple of --kv-heads={Hkv} (H % Hkv == 0)")
    dtype = np.dtype(args.dtype)
    tk = max(args.contexts)
    # the paged caches, their contiguous copy and the chunked gather: about 3x one K/V pool
    refuse_if_too_big(f"--seqs={S} x --contexts={tk} x --kv-heads={Hkv} x --head-size={D}",
                      6 * S * (cdiv(tk, BS) * BS) * Hkv * D * dtype.itemsize)
    console = Console()
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
    return 0
