"""What reading K/V through block tables costs, in NumPy: paged decode attention vs dense.

Decode attention for S sequences of equal context length, on the same numbers:

    dense      the baseline: K/V of every sequence contiguous, [S, Hkv, Tk, D] (the best
               layout for NumPy's matmul), computed whole and in cache-sized chunks of
               (sequence, KV head) pairs; the faster of the two is the baseline;
    gather     paged_attention(method="gather"): fetch each sequence's blocks, then the same
               dense kernel; the extra cost is one copy of K/V, a few KV heads at a time;
    online     paged_attention(method="online"): walk the block table one block of BS keys
               at a time, as the GPU kernels do, and merge the blocks with the online softmax
               (as minipaged's CUDA version 0 does; vLLM's kernel and versions 1-4 keep the
               logits in shared memory instead); in NumPy each block costs a handful of small
               calls, so expect it to be slower here.

The paper measures its GPU kernel at 20-26% above FasterTransformer's contiguous one (section
7.1, Fig. 18a); a GPU kernel reads each block where it lies, while NumPy's gather copies it
first, so the gather ratio here is only the CPU analogue. The default shape is a Llama-like
layer: H=32, Hkv=8, D=128, BS=16, float32, S=32 sequences at contexts 1024 and 4096. On a
shared machine run it as OPENBLAS_NUM_THREADS=1 minipaged bench attention: a BLAS thread that
loses its core stalls every GEMM, and the figures then measure the scheduler rather than the
attention.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console

from minipaged._checks import cdiv
from minipaged.attention import plain_softmax
from minipaged.kit.bench import decode_case, fill_unset, flag_value, medians
from minipaged.kit.cli.common import refuse_if_too_big, table
from minipaged.paged.paged_attention import GATHER_CHUNK_BYTES, paged_attention

# What the shape options are when not given, without and with --quick (about a second).
DEFAULTS = dict(seqs=32, heads=32, kv_heads=8, head_size=128, contexts=[1024, 4096], repeats=5)
QUICK = dict(seqs=4, heads=8, kv_heads=2, head_size=32, contexts=[64, 256], repeats=2)


def _dense(q, k, v, scale, chunked: bool):
    """q [S, H, D], k/v [S, Hkv, Tk, D] -> [S, H, D]: the oracle's kernel, batched over S, all
    (sequence, KV head) pairs at once, or (``chunked``) a few at a time so that the working set
    (scores, K, V of one chunk) stays in cache, which is what the gather path enjoys too."""
    S, H, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    qh = q.reshape(S * Hkv, H // Hkv, D) * q.dtype.type(scale)
    kf, vf = k.reshape(S * Hkv, Tk, D), v.reshape(S * Hkv, Tk, D)
    limits = np.full(H // Hkv, Tk - 1)           # decode: every key visible
    step = max(1, GATHER_CHUNK_BYTES // (Tk * D * k.itemsize)) if chunked else S * Hkv
    out = [plain_softmax(qh[i:i + step], kf[i:i + step], vf[i:i + step], limits)
           for i in range(0, S * Hkv, step)]
    return (out[0] if len(out) == 1 else np.concatenate(out)).reshape(S, H, D)


def _measure_context(rng, S, H, Hkv, D, BS, Tk, dtype, repeats, online):
    """Time every method at context Tk; return [(name, seconds, max |out - dense matmul out|)],
    the baseline's name and the K/V bytes one decode step reads."""
    q, key_cache, value_cache, tables, lens = decode_case(rng, S, H, Hkv, D, BS, Tk, dtype)
    scale = D ** -0.5

    def contiguous(cache):  # the same K/V, contiguous per sequence: [S, Hkv, Tk, D]
        blocks = cache[tables].transpose(0, 2, 1, 3, 4)      # [S, Hkv, MB, BS, D]
        return np.ascontiguousarray(blocks.reshape(S, Hkv, -1, D)[:, :, :Tk])

    k, v = contiguous(key_cache), contiguous(value_cache)
    candidates = {"dense matmul": lambda: _dense(q, k, v, scale, chunked=False),
                  "dense matmul, chunked": lambda: _dense(q, k, v, scale, chunked=True)}
    for method in ("gather", "online") if online else ("gather",):
        candidates[f"paged {method}"] = lambda m=method: paged_attention(
            q, key_cache, value_cache, tables, lens, method=m)
    times = medians(candidates, repeats=repeats)
    outs = {name: fn().astype(np.float64) for name, fn in candidates.items()}
    best = min(("dense matmul", "dense matmul, chunked"), key=times.get)
    rows = [(name, times[name], float(np.abs(out - outs["dense matmul"]).max()))
            for name, out in outs.items()]
    return rows, best, k.nbytes + v.nbytes


def run(args) -> int:
    fill_unset(args, DEFAULTS, QUICK)
    S, H, Hkv, D, BS = args.seqs, args.heads, args.kv_heads, args.head_size, args.block_size
    if H % Hkv:
        raise ValueError(f"{flag_value(args, 'heads')} must be a multiple of "
                         f"{flag_value(args, 'kv_heads')}")
    dtype = np.dtype(args.dtype)
    tk = max(args.contexts)
    # the paged caches, their contiguous copy and the chunked gather: about 3x one K/V pool
    refuse_if_too_big(f"{flag_value(args, 'seqs')} x {flag_value(args, 'contexts', tk)} (in "
                      f"blocks of --block-size={BS}) x {flag_value(args, 'kv_heads')} x "
                      f"{flag_value(args, 'head_size')}",
                      6 * S * (cdiv(tk, BS) * BS) * Hkv * D * dtype.itemsize)
    rng = np.random.default_rng(args.seed)
    t = table(f"decode attention, S={S} H={H} Hkv={Hkv} D={D} BS={BS} {dtype.name}, median "
              f"of {args.repeats}", ("context", "method", "median ms", "x dense", "K/V GB/s",
                                     "max |diff|"), left=("method",), title_justify="left")
    for Tk in args.contexts:
        rows, best, kv_bytes = _measure_context(rng, S, H, Hkv, D, BS, Tk, dtype, args.repeats,
                                                not args.no_online)
        base_t = next(sec for name, sec, _ in rows if name == best)
        for name, sec, diff in rows:
            t.add_row(str(Tk), name + ("  (baseline)" if name == best else ""),
                      f"{sec * 1e3:.1f}", f"{sec / base_t:.2f}", f"{kv_bytes / sec / 1e9:.1f}",
                      f"{diff:.1e}")
        t.add_section()
    console = Console()
    console.print(t)
    console.print("x dense: median time over the fastest dense formulation's. K/V GB/s: bytes of "
                  "K and V one step reads, over its time. max |diff|: against dense matmul's "
                  "output, the oracle's kernel (0 means the same bits).")
    return 0
