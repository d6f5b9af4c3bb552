"""The paged attention CUDA kernel, checked against the NumPy oracle first, then timed.

Decode attention: every sequence has one new query token and ``ctx`` tokens of K/V in the paged
cache (blocks scattered at random over the pool). Decode attention is bandwidth-bound (see the
napkin math in minipaged/cuda/paged_attention.cu), so the figure of merit is

    effective bandwidth = K and V bytes read (2 * S * ctx * Hkv * D * itemsize) / time

printed as a fraction of the machine's measured copy bandwidth (a plain device-to-device copy
of a large array; bytes read + written / time), and the time as a ratio to a contiguous baseline.

What is timed: the kernel alone. Each version's launch is prepared once
(minipaged.cuda.launch.prepare_paged_attention: checks, host copies of the block tables, buffer
allocation) and only the prepared launch is timed (CUDA events on the GPU). The preparation,
which the public wrapper paged_attention() redoes on every call, is timed alone and printed as
the wrapper's overhead, so host work never hides inside a kernel figure.

    --backend cupy  the GPU kernel (NVRTC via CuPy). Defaults: S=64, H=32, Hkv=8, D=128, BS=16,
                    float16, contexts 1K/4K/16K. Baseline: torch's scaled_dot_product_attention
                    on the same K/V stored contiguously. Targets: at least 70% of copy
                    bandwidth at 4K and above, within 1.3x of the torch baseline.
    --backend cpu   the same kernel on the CPU emulation harness: a correctness and teaching
                    tool, not a fast path (every CUDA thread is a fiber). Defaults are small;
                    the baseline is NumPy's paged_attention (method="gather").

Before any timing, every version is compared with the NumPy oracle on a small ragged case, by
gpu-check's check and tolerance (minipaged.cuda.gpu_check.check_versions), and on the GPU with
the torch baseline at every size; a mismatch stops the benchmark with exit 1. Without a GPU,
--backend cupy says so and exits 3 (nothing ran), as gpu-check does.
"""

from __future__ import annotations

import math

import numpy as np
from rich.console import Console
from rich.markup import escape

from minipaged.kit.bench import decode_case, fill_unset, flag_value, median_time
from minipaged.kit.cli.common import refuse_if_too_big, table
from minipaged.paged.paged_attention import paged_attention as oracle

# What the options are when not given: on the GPU, on the CPU harness (whose every CUDA thread
# is a fiber: small), and with --quick on either (seconds).
GPU = dict(seqs=64, heads=32, kv_heads=8, head_size=128, contexts=[1024, 4096, 16384], repeats=20)
CPU = {**GPU, "seqs": 2, "contexts": [256, 1024], "repeats": 3}
QUICK = dict(seqs=1, heads=4, kv_heads=2, head_size=64, contexts=[64], repeats=1)


def _check(console, args) -> bool:
    """Every version against the NumPy oracle on a small ragged case at the benchmark's shape:
    gpu-check's check (minipaged.cuda.gpu_check.check_versions) and its tolerance. True when
    every version is within it."""
    from minipaged.cuda.gpu_check import check_versions

    rows = check_versions(np.random.default_rng(args.seed), args.backend,
                          [(args.dtype, args.head_size, args.block_size)], lens=(700, 1, 333),
                          heads=[(args.heads, args.kv_heads)])
    for r in rows:
        console.print(f"check v{r['version']} against the NumPy oracle: max error "
                      f"{r['max_error']:.2e} -> "
                      f"{'[green]ok[/]' if r['error_over_tolerance'] <= 1 else '[red]FAIL[/]'}")
    return all(r["error_over_tolerance"] <= 1 for r in rows)  # NaN fails


def run(args) -> int:
    # here, not at the top: the CUDA package loads when the command runs
    from minipaged.cuda.checks import SMEM_LIMIT_SM90, fits_smem
    from minipaged.cuda.gpu_check import copy_bandwidth, gpu_missing
    from minipaged.cuda.kernels import VERSIONS

    console = Console()
    gpu = args.backend == "cupy"
    fill_unset(args, GPU if gpu else CPU, QUICK)
    s, contexts, repeats = args.seqs, args.contexts, args.repeats
    H, Hkv, D, BS = args.heads, args.kv_heads, args.head_size, args.block_size
    if H % Hkv:  # bad input is refused first, with or without a GPU
        raise ValueError(f"{flag_value(args, 'heads')} must be a multiple of "
                         f"{flag_value(args, 'kv_heads')}")
    itemsize = np.dtype(args.dtype).itemsize
    if not gpu:  # host memory (on a GPU, CuPy's OutOfMemoryError, a MemoryError, refuses)
        refuse_if_too_big(f"{flag_value(args, 'seqs')} x "
                          f"{flag_value(args, 'contexts', max(contexts))} x "
                          f"{flag_value(args, 'kv_heads')}",
                          4 * s * (max(contexts) + BS) * Hkv * D * itemsize)
    if gpu and (reason := gpu_missing()) is not None:
        console.print(f"[red]No GPU:[/] {escape(reason)}. Nothing was measured. "
                      "Run `minipaged bench kernel --backend cpu` for the CPU harness.")
        return 3                    # gpu-check's status for no GPU: nothing ran, nothing failed
    if gpu:
        import cupy

        from minipaged.cuda import cupy_runner
        from minipaged.cuda.gpu_check import device_time as timer  # CUDA events: device time

        console.print(f"device: {cupy_runner.device_info()}")
        smem_limit = cupy_runner.smem_limit()
    else:
        smem_limit = SMEM_LIMIT_SM90
        def timer(fn, repeats: int) -> float:
            return median_time(fn, repeats=repeats)
    xp = cupy if gpu else np
    if not _check(console, args):
        console.print("[red]the kernel disagrees with the oracle: not timing a wrong answer[/]")
        return 1
    copy_bw = copy_bandwidth(xp, timer)
    console.print(f"measured copy bandwidth: {copy_bw / 1e9:.1f} GB/s (read + write)")

    t = table(f"decode attention, S={s} H={H} Hkv={Hkv} D={D} BS={BS} {args.dtype}, "
              f"backend={args.backend}", ("context", "version", "kernel (ms)", "KV GB/s",
                                          "% of copy BW", "overhead (ms)", "baseline (ms)",
                                          "kernel / baseline"))
    rng = np.random.default_rng(args.seed)
    scale = 1.0 / math.sqrt(D)
    too_long = []  # "vN at CTX": a single pass whose logits would not fit
    for ctx in contexts:
        data = decode_case(rng, s, H, Hkv, D, BS, ctx, args.dtype, xp=xp)
        if gpu:
            base_t, base_out = _torch_baseline(*data[:4], ctx, scale, repeats, timer)
        else:
            base_t, base_out = timer(lambda: oracle(*data), repeats), None  # noqa: B023
        for version in [v for v in VERSIONS if v != 0]:  # v0 (naive) is far too slow here
            if not fits_smem(version, ctx, BS, D, H // Hkv, smem_limit):
                t.add_row(str(ctx), f"v{version}", *["-"] * 6)
                too_long.append(f"v{version} at {ctx}")
                continue
            sec, overhead, out = _time_version(data, args.backend, version, repeats, timer)
            if base_out is not None:  # the baseline doubles as a check at full size
                err = float(xp.abs(out.astype(xp.float32) - base_out).max())
                if err > 1e-2:
                    console.print(f"[red]ctx {ctx} v{version}: differs from torch by {err:.2e}[/]")
                    return 1
            bw = 2 * s * ctx * Hkv * D * itemsize / sec         # K and V bytes read / time
            t.add_row(str(ctx), f"v{version}", f"{sec * 1e3:.3f}", f"{bw / 1e9:.3g}",
                      f"{100 * bw / copy_bw:.0f}%", f"{overhead * 1e3:.3f}",
                      f"{base_t * 1e3:.3f}" if base_t else "n/a",
                      f"{sec / base_t:.2f}x" if base_t else "n/a")
    console.print(t)
    if too_long:
        console.print(f"-: not run ({', '.join(too_long)}): a single-pass version (v1, v3) keeps "
                      "every logit of the context in shared memory, more than the "
                      f"{smem_limit:,} bytes a thread block may use; v2 and v4 partition it")
    console.print("kernel: the prepared launch alone; overhead: what the wrapper paged_attention() "
                  "adds before each launch (checks, host copies of seq_lens and block_tables, "
                  "allocation), timed alone on the host")
    if gpu:
        console.print("targets: >= 70% of copy bandwidth at 4K and above; kernel / torch "
                      "<= 1.3x (torch reads contiguous K/V, the kernel goes through block tables)")
    else:
        console.print("the CPU harness runs each CUDA thread as a fiber: its speed says nothing "
                      "about a GPU; the baseline is the NumPy oracle (method='gather')")
    return 0


def _time_version(data, backend: str, version: int, repeats: int, timer):
    """(kernel seconds, wrapper overhead seconds, output) for one version, timed as the module
    docstring says: the prepared launch by ``timer``, its preparation alone on the host."""
    from minipaged.cuda import launch

    def prepare():
        return launch.prepare_paged_attention(*data, backend=backend, version=version)

    prepared = prepare()
    overhead = median_time(prepare, repeats=max(repeats, 5))
    return timer(prepared, repeats), overhead, prepared()


def _torch_baseline(q, kc, vc, tables, ctx, scale, repeats, timer):
    """(median seconds, output) of torch's SDPA on the same K/V made contiguous, or (None, None)
    when torch has no CUDA here. K/V [S, Hkv, ctx, D]; GQA through enable_gqa."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None, None
    if not torch.cuda.is_available():
        return None, None
    tq, tkc, tvc, ttab = (torch.from_dlpack(a) for a in (q, kc, vc, tables))
    s, h, d = tq.shape
    hkv = tkc.shape[1]

    def contiguous(cache):  # [NB, Hkv, BS, D] -> [S, Hkv, ctx, D] in logical order
        g = cache[ttab.long()]                                   # [S, nblocks, Hkv, BS, D]
        return g.permute(0, 2, 1, 3, 4).reshape(s, hkv, -1, d)[:, :, :ctx].contiguous()

    k, v = contiguous(tkc), contiguous(tvc)
    q4 = tq.reshape(s, h, 1, d)

    gqa = {"enable_gqa": True} if hkv != h else {}
    try:  # enable_gqa (torch >= 2.5) reads each KV head once for its H/Hkv query heads
        F.scaled_dot_product_attention(q4[:1], k[:1], v[:1], scale=scale, **gqa)
    except TypeError:  # older torch: repeat the KV heads (more bytes: the baseline gets slower)
        k, v = (x.repeat_interleave(h // hkv, dim=1) for x in (k, v))
        gqa = {}

    def call():
        return F.scaled_dot_product_attention(q4, k, v, scale=scale, **gqa)

    import cupy

    return timer(call, repeats), cupy.from_dlpack(call().reshape(s, h, d).float().contiguous())
