"""The C entry points that let ctypes call the kernels: generated C++ source text.

What it holds: one ``extern "C"`` function per kernel instantiation (dtype, head size D, block
size BS), which unpacks plain pointers and ints into a launch of the templated kernel on the
emulator (``cuda_emu.h``'s ``emu::launch``), plus the harness's own small entry points (the last
error, tracing, half conversions, the deliberately broken kernels). ``cpu_build.py`` compiles
this text together with the kernels. Read next: ``cpu_build.py``.
"""

from __future__ import annotations

from pathlib import Path

from minipaged.cuda.kernels import (
    ALL_INSTANTIATIONS,
    DTYPES,
    GQA_GROUP,
    KERNEL_FILES,
    NUM_THREADS,
    PARTITION_SIZE,
    Instantiation,
)


def symbol(kind: str, dtype: str, head_size: int = 0, block_size: int = 0) -> str:
    """The exported C name of one instantiation, e.g. mp_paged_attention_float16_d128_bs16."""
    if kind == "paged_attention":
        return f"mp_paged_attention_{dtype}_d{head_size}_bs{block_size}"
    return f"mp_{kind}_{dtype}"


def _common_entry_points() -> list[str]:
    out = [
        'extern "C" const char* mp_last_error() { return emu::error_message(); }',
        'extern "C" int mp_fast_switch() { return EMU_FAST_SWITCH; }',
        'extern "C" int mp_sanitized() { return EMU_ASAN; }',
        'extern "C" void mp_trace_start(long long capacity) {',
        "  emu::rt().trace.clear(); emu::rt().trace_capacity = (size_t)capacity; }",
        'extern "C" long long mp_trace_count() { return (long long)emu::rt().trace.size(); }',
        'extern "C" void mp_trace_get(long long i, int* ints, long long* value, const char** what)'
        " {",
        "  const emu::TraceEvent& e = emu::rt().trace[(size_t)i];",
        "  ints[0] = e.block_x; ints[1] = e.block_y; ints[2] = e.block_z; ints[3] = e.thread;",
        "  ints[4] = e.line; *value = e.value; *what = e.what; }",
        'extern "C" void mp_float_to_half(const float* in, unsigned short* out, long long n) {',
        "  for (long long i = 0; i < n; i++) out[i] = __float2half(in[i]).__x; }",
        'extern "C" void mp_half_to_float(const unsigned short* in, float* out, long long n) {',
        "  for (long long i = 0; i < n; i++) out[i] = __half2float(__half{in[i]}); }",
        'extern "C" int mp_broken(int which, int threads, float* out) {',
        "  return emu::launch(dim3(2), dim3(threads), 0, [&] { mp::broken_kernel(which, out); });",
        "}",
    ]
    for dtype, ctype in DTYPES.items():
        out += [
            f'extern "C" int {symbol("reshape_and_cache", dtype)}(const void* key,'
            " const void* value,",
            "    void* key_cache, void* value_cache, const long long* slots, int num_tokens,",
            "    int num_kv_heads, int head_size, int block_size, int threads) {",
            f"  using T = {ctype};",
            "  return emu::launch(dim3(num_tokens), dim3(threads), 0, [&] {",
            "    mp::reshape_and_cache_kernel<T>((const T*)key, (const T*)value, (T*)key_cache,",
            "        (T*)value_cache, slots, num_kv_heads, head_size, block_size); });",
            "}",
            f'extern "C" int {symbol("copy_blocks", dtype)}(void* key_cache, void* value_cache,',
            "    const long long* mapping, int num_pairs, int block_numel, int threads) {",
            f"  using T = {ctype};",
            "  return emu::launch(dim3(num_pairs), dim3(threads), 0, [&] {",
            "    mp::copy_blocks_kernel<T>((T*)key_cache, (T*)value_cache, mapping, block_numel);"
            " });",
            "}",
        ]
    return out


def _attention_entry_point(dtype: str, d: int, bs: int) -> list[str]:
    """One C function per (dtype, D, BS) that launches any version; the grid comes from
    checks.AttentionLaunch, the one place that computes launch geometry for both runners."""
    p, nt, g, ctype = PARTITION_SIZE, NUM_THREADS, GQA_GROUP, DTYPES[dtype]
    args = ("o, exp_sums, max_logits, tmp_out, qq, kk, vv, block_tables, seq_lens, num_heads, "
            "num_kv_heads, max_blocks, max_partitions, scale")
    out = [
        f'extern "C" int {symbol("paged_attention", dtype, d, bs)}(',
        "    int version, void* out, float* exp_sums, float* max_logits, float* tmp_out,",
        "    const void* q, const void* k, const void* v, const int* block_tables,",
        "    const int* seq_lens, int num_seqs, int num_heads, int num_kv_heads,",
        "    int max_blocks, int max_partitions, int gx, int gy, int gz, long long smem,",
        "    long long reduce_smem, float scale) {",
        f"  using T = {ctype};",
        "  T* o = (T*)out; const T* qq = (const T*)q;",
        "  const T* kk = (const T*)k; const T* vv = (const T*)v;",
        "  const dim3 grid(gx, gy, gz);",
        "  int rc = 1;",
        "  if (version == 0)",
        f"    return emu::launch(grid, dim3({nt}), 0, [&] {{",
        f"      mp::paged_attention_v0_kernel<T, {d}, {bs}>(o, qq, kk, vv, block_tables,",
        "          seq_lens, num_seqs, num_heads, num_kv_heads, max_blocks, scale); });",
    ]
    for version, group, part in ((1, 1, 0), (2, 1, p), (3, g, 0), (4, g, p)):
        out += [f"  if (version == {version})",
                f"    rc = emu::launch(grid, dim3({nt}), smem, [&] {{",
                f"      mp::paged_attention_kernel<T, {d}, {bs}, {nt}, {group}, {part}>({args});"
                " });"]
    return out + [
        "  if (rc || version == 1 || version == 3) return rc;",
        f"  return emu::launch(dim3(num_heads, num_seqs, 1), dim3({nt}), reduce_smem, [&] {{",
        f"      mp::paged_attention_v2_reduce_kernel<T, {d}, {nt}, {p}>(o, exp_sums, max_logits,",
        "          tmp_out, seq_lens, max_partitions); });",
        "}",
    ]


def wrapper_sources(instantiations: tuple[Instantiation, ...] = ALL_INSTANTIATIONS,
                    parts: int = 1, extra_sources: tuple[Path, ...] = ()) -> list[str]:
    """C++ translation units that include the kernels and export one C function per
    instantiation (split into `parts` files that compile in parallel). Only the first defines
    the context-switch routine and the common entry points, and includes ``extra_sources``."""
    parts = max(1, min(parts, len(instantiations) or 1))
    units = []
    for i in range(parts):
        out = ["// generated by minipaged/cuda/emu/wrappers.py: C entry points for ctypes"]
        if i > 0:
            out.append("#define EMU_NO_SWITCH_DEFINITION  // defined once, in part 0")
        out += [f'#include "{name}"' for name in KERNEL_FILES]
        if i == 0:
            out.append('#include "broken_kernels.cu"')
            out += [f'#include "{Path(x).resolve()}"' for x in extra_sources]
            out += _common_entry_points()
        for dtype, d, bs in instantiations[i::parts]:
            out += _attention_entry_point(dtype, d, bs)
        text = "\n".join(out) + "\n"
        units.append(text.replace('extern "C"',
                                  'extern "C" __attribute__((visibility("default")))'))
    return units
