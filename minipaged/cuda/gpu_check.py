"""``minipaged gpu-check``: what to run, once, the day a machine with an NVIDIA GPU is lent.

What it teaches: what "works on the GPU" has to mean. In one command (a few minutes) it prints
the device and the CuPy and NVRTC versions, each kernel's registers and occupancy as the driver
reports them; checks every version and instantiation against the NumPy oracle on ragged GQA
cases with NaN in every unused slot, and the cache kernels bit for bit; probes the launch limits
(v1 at 11.6K and 12.2K tokens, around the 48 KiB shared-memory default; 60K tokens, beyond v1;
S = 70,000 rows, beyond gridDim.y); and measures each version's K/V bytes read per second
against a device-to-device copy of the same K/V (S=32, H=32, Hkv=8, D=128, fp16, ctx 4096).
Everything goes to a JSON report (--out). Without a GPU it says so in one line and exits 3.
Read next: lessons/08_gpu_kernel.py.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from minipaged._checks import cdiv
from minipaged._install import GPU_HINT
from minipaged.cuda import cupy_runner, kernels, launch
from minipaged.paged import cache_ops
from minipaged.paged.paged_attention import paged_attention as oracle


def gpu_missing() -> str | None:
    """None when CuPy sees a CUDA device, else why not (``gpu-check`` and ``bench kernel``)."""
    try:
        import cupy
    except ImportError:
        return f"CuPy is not installed ({GPU_HINT})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as e:  # noqa: BLE001 - no driver, no device: all mean "no GPU"
        return f"CuPy cannot reach a CUDA device ({type(e).__name__}: {e})"
    return None


def _device(backend: str):
    """(to device, to host) for a backend: CuPy's, or NumPy's identity for the CPU harness (so
    that tests/test_cuda_gpu_check.py runs these checks, small, where there is no GPU)."""
    if backend == "cpu":
        return np.asarray, np.asarray
    import cupy

    return cupy.asarray, cupy.asnumpy


def _case(rng, dtype, s, h, hkv, d, bs, lens, to_device):
    """A ragged case on a scattered pool whose unused slots and free blocks are NaN."""
    nblocks = [cdiv(n, bs) for n in lens]
    nb = sum(nblocks) + 3
    kc = np.full((nb, hkv, bs, d), np.nan, dtype)
    vc = np.full((nb, hkv, bs, d), np.nan, dtype)
    tables = np.full((s, max(nblocks)), -1, np.int32)
    physical = iter(rng.permutation(nb))
    for i, n in enumerate(lens):
        for j in range(nblocks[i]):
            p, used = next(physical), min(bs, n - j * bs)
            tables[i, j] = p
            kc[p, :, :used] = rng.standard_normal((hkv, used, d))
            vc[p, :, :used] = rng.standard_normal((hkv, used, d))
    q = rng.standard_normal((s, h, d)).astype(dtype)
    host = (q, kc, vc, tables, np.array(lens, np.int32))
    return host, tuple(to_device(a) for a in host)


def tolerance(dtype: str, want: np.ndarray) -> np.ndarray:
    """Allowed |kernel - NumPy oracle|, elementwise: twice tests/test_cuda_cases.tolerance, the
    bound each of them keeps to a float64 reference. Both accumulate in float32 whatever the
    dtype, in different orders (and CUDA's expf is not np.exp); a float32 sum of n terms drifts
    by about sqrt(n) ulps of 2^-24, 3e-6 relative at the 2,100 tokens of the float32 cases here:
    within the float32 bound, 2e-5 relative + 2e-5. A float16 output is then rounded once, and
    that drift may push it across a rounding boundary: one fp16 ulp (2^-10 relative) + 1e-4,
    which dwarfs the drift even at probe_limits' 60K tokens (1.5e-5)."""
    tol = 2.0**-10 * np.abs(want) + 1e-4 if dtype == "float16" else 2e-5 * np.abs(want) + 2e-5
    return 2 * tol


def _close(got, want, dtype) -> dict:
    """The max error, and the max error in units of the tolerance (<= 1 passes)."""
    err = np.abs(got.astype(np.float64) - want)
    return {"max_error": float(err.max()),
            "error_over_tolerance": float(np.max(err / tolerance(dtype, want)))}


def check_versions(rng, backend="cupy", instantiations=kernels.ALL_INSTANTIATIONS,
                   lens=(1, 700, 2100), heads=((8, 2), (12, 1))) -> list[dict]:
    """Every version of every (dtype, D, BS) in ``instantiations`` on a ragged case of ``lens``
    for each (H, Hkv) of ``heads`` (by default G = 4, and G = 12: two blocks per KV head in
    v3/v4), against the NumPy oracle: one row each (``bench kernel`` checks its shape so)."""
    to_device, to_host = _device(backend)
    out = []
    for dtype, d, bs in instantiations:
        for h, hkv in heads:
            host, dev = _case(rng, dtype, len(lens), h, hkv, d, bs, list(lens), to_device)
            want = oracle(*host).astype(np.float64)
            for v in kernels.VERSIONS:
                got = to_host(launch.paged_attention(*dev, backend=backend, version=v))
                out.append({"dtype": dtype, "D": d, "BS": bs, "H": h, "Hkv": hkv, "version": v,
                            **_close(got, want, dtype)})
    return out


def check_cache_kernels(rng, backend="cupy") -> dict[str, bool]:
    to_device, to_host = _device(backend)
    out = {}
    for dtype in kernels.DTYPES:
        kc = rng.standard_normal((16, 2, 16, 64)).astype(dtype)
        vc = rng.standard_normal((16, 2, 16, 64)).astype(dtype)
        key, value = (rng.standard_normal((40, 2, 64)).astype(dtype) for _ in range(2))
        slots = rng.permutation(256)[:40]
        slots[::7] = -1
        kd, vd = to_device(kc.copy()), to_device(vc.copy())
        launch.reshape_and_cache(to_device(key), to_device(value), kd, vd, to_device(slots),
                                 backend=backend)
        cache_ops.reshape_and_cache(key, value, kc, vc, slots)
        pairs = [(0, 9), (1, 10), (2, 11)]
        launch.copy_blocks(kd, vd, pairs, backend=backend)
        cache_ops.copy_blocks(kc, vc, np.array(pairs))
        out[dtype] = bool(np.array_equal(to_host(kd), kc) and np.array_equal(to_host(vd), vc))
    return out


def probe_limits(rng, backend="cupy", rows=70_000) -> dict:
    to_device, to_host = _device(backend)
    out = {}
    for tokens, version in ((11_600, 1), (12_200, 1), (60_000, 1), (60_000, None)):
        host, dev = _case(rng, "float16", 1, 1, 1, 128, 16, [tokens], to_device)
        key = f"{tokens} tokens, version={version}"
        try:
            got = to_host(launch.paged_attention(*dev, backend=backend, version=version))
            out[key] = {"launched": True,
                        **_close(got, oracle(*host).astype(np.float64), "float16")}
        except ValueError as e:  # the launcher's refusal, before any launch
            out[key] = {"launched": False, "refused": str(e)}
    lens = [int(n) for n in rng.integers(1, 33, rows)]
    host, dev = _case(rng, "float32", rows, 2, 1, 64, 16, lens, to_device)
    got = to_host(launch.paged_attention(*dev, backend=backend))
    want = oracle(*host, method="online").astype(np.float64)
    out[f"S={rows} rows"] = {"launched": True, **_close(got, want, "float32")}
    return out


def device_time(fn, repeats: int = 20) -> float:
    """Median seconds of fn() between two CUDA events (device time, not host time), after one
    warm-up call (shared with ``minipaged bench kernel``)."""
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def copy_bandwidth(xp, timer) -> float:
    """Bytes per second of a large device-to-device (or RAM-to-RAM) copy, read + write (1 GiB
    of float32 on a GPU, 128 MiB in RAM): the memory system's practical peak, the denominator of
    every "% of copy bandwidth" that ``gpu-check`` and ``bench kernel`` print. A kernel that
    reads N bytes in t seconds moves N / t of it; a copy moves each byte twice."""
    src = xp.ones(1 << 25 if xp is np else 1 << 28, xp.float32)
    dst = xp.empty_like(src)
    return 2 * src.nbytes / timer(lambda: xp.copyto(dst, src), 10)


def bandwidth(rng, s=32, h=32, hkv=8, d=128, bs=16, ctx=4096) -> dict:
    import cupy

    _, dev = _case(rng, "float16", s, h, hkv, d, bs, [ctx] * s, cupy.asarray)
    kv_bytes = 2 * s * hkv * ctx * d * 2  # what attention must read (the pool has 3 spare blocks)
    copy_bps = copy_bandwidth(cupy, device_time)
    out = {"shape": f"S={s} H={h} Hkv={hkv} D={d} BS={bs} fp16 ctx={ctx}",
           "copy_GBps": copy_bps / 1e9, "versions": {}}
    for v in kernels.VERSIONS:
        run = launch.prepare_paged_attention(*dev, backend="cupy", version=v)
        t = device_time(run, 3 if v == 0 else 20)
        out["versions"][v] = {"ms": t * 1e3, "kv_read_GBps": kv_bytes / t / 1e9,
                              "fraction_of_copy": kv_bytes / t / copy_bps}
    ms = {v: r["ms"] for v, r in out["versions"].items()}
    out["grouped_speedup"] = min(ms[1], ms[2]) / min(ms[3], ms[4])  # target >= 1.5 at G=4
    return out


def kernel_table() -> list[dict]:
    """Registers, local memory (spills) and occupancy per kernel, from the driver."""
    import cupy

    rows = []
    for inst in kernels.ALL_INSTANTIATIONS:
        for key, k in cupy_runner.attention_kernels(*inst).items():
            blocks = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                k.kernel.ptr, kernels.NUM_THREADS, 0)
            rows.append({"kernel": kernels.attention_names(*inst)[key], "registers": k.num_regs,
                         "local_bytes": k.local_size_bytes, "static_smem": k.shared_size_bytes,
                         "blocks_per_sm_without_dynamic_smem": blocks})
    return rows


def main(out: str = "gpu-check.json") -> int:
    """`minipaged gpu-check --out OUT`: 0 when every check passed, 1 when one failed, 3 when
    there is no GPU."""
    reason = gpu_missing()
    if reason:
        print(f"minipaged gpu-check: no GPU here ({reason}); nothing ran", file=sys.stderr)
        return 3
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    rng = np.random.default_rng(0)
    report = {"device": cupy_runner.device_info(), "cupy": cupy.__version__,
              "nvrtc": ".".join(map(str, nvrtc.getVersion())), "kernels": kernel_table()}
    print(f"{report['device']}, CuPy {report['cupy']}, NVRTC {report['nvrtc']}")
    for k in report["kernels"]:
        print(f"  {k['kernel']}: {k['registers']} registers, {k['local_bytes']} B local "
              f"(spills), {k['static_smem']} B static smem, "
              f"{k['blocks_per_sm_without_dynamic_smem']} blocks/SM")
    report["versions"] = check_versions(rng)
    bad = [r for r in report["versions"] if not r["error_over_tolerance"] <= 1]
    report["cache_kernels_exact"] = check_cache_kernels(rng)
    report["limits"] = probe_limits(rng)
    report["bandwidth"] = bandwidth(rng)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    b = report["bandwidth"]
    print(f"versions x instantiations checked: {len(report['versions'])}, failed: {len(bad)}; "
          f"cache kernels exact: {report['cache_kernels_exact']}")
    for key, r in report["limits"].items():
        print(f"  {key}: {r}")
    print(f"{b['shape']}: copy bandwidth {b['copy_GBps']:.0f} GB/s (read + write)")
    for v, r in b["versions"].items():
        print(f"  v{v}: {r['ms']:.3f} ms, {r['kv_read_GBps']:.0f} GB/s, "
              f"{100 * r['fraction_of_copy']:.0f}% of copy")
    print(f"grouped (v3/v4) over per-head (v1/v2): {b['grouped_speedup']:.2f}x; report: "
          f"{out}")
    ok = not bad and all(report["cache_kernels_exact"].values()) and all(
        r.get("error_over_tolerance", 0) <= 1 for r in report["limits"].values())
    return 0 if ok else 1
