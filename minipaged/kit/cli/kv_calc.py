"""The ``kv-calc`` command: how many tokens, slots and blocks fit in a KV cache budget.

Its runner prints the figures of ``minipaged.sim.memory.kv_calc`` as a table (or as JSON).
"""

from __future__ import annotations

import json
from dataclasses import replace

from rich.console import Console

from minipaged.kit.cli.args import bounds, command, num
from minipaged.kit.cli.common import table
from minipaged.sim import memory

KV_CALC_HELP = """\
How many tokens fit: KV bytes per token, token slots, blocks, and the block table's own size.

    KV bytes per token = 2 (K and V) x layers x KV heads x head size x bytes per element
    token slots        = KV cache bytes // KV bytes per token
    blocks             = token slots // block size
    block table bytes  = ceil(context / block size) x entry bytes, per request (vLLM: int32)

The opt-13b preset is the paper's setting (Table 1, section 6.1: about 12 GB of KV cache on one
A100-40GB, about 15.7K token slots, its "GB" being GiB; section 3: 800 KB per token).
--layers, --kv-heads, --head-size and --dtype-bytes replace the preset's values (a "custom"
model).

Bytes are per GPU. --tp N shards the KV heads over N GPUs, max(1, KV heads // N) each, so
they replicate when N > KV heads (vLLM's rule, vllm/config/model.py get_num_kv_heads); the
budget of a preset sized by vLLM's rule is recomputed with 1/N of the weights per GPU.
--kv-dtype fp8 halves the bytes of fp16/bf16. deepseek-v2 caches one MLA latent per token and
layer, kv_lora_rank 512 + qk_rope_head_dim 64 elements, on every GPU (TP does not divide it).
"""


# The sizes a machine type has, for --dtype-bytes and --entry-bytes: there is no 3-byte float.
BYTES = (1, 2, 4, 8)


def add_kv_calc(sub) -> None:
    p = command(sub, "kv-calc", "KV cache arithmetic: bytes per token, slots, blocks, "
                "block-table size", KV_CALC_HELP, kv_calc)
    p.add_argument("--model", default="opt-13b", choices=sorted(memory.KV_PRESETS),
                   help="model + GPU preset (opt-13b: A100-40GB with 12 GiB of KV cache, the "
                        "paper's setting; llama-3-8b: H100-80GB; deepseek-v2: MLA, 8 H100s)")
    num(p, "--tp", int, None, "tensor-parallel GPUs (unset: the preset's): KV bytes per GPU")
    p.add_argument("--kv-dtype", choices=sorted(memory.KV_DTYPE_BYTES),
                   help="KV cache dtype (unset: the model's): 2 bytes per element, fp8 1")
    num(p, "--kv-cache-gb", float, None, "override the KV cache budget, in GiB",
        bounds(above=0, high=2**40))
    num(p, "--layers", int, None, "custom model: number of layers")
    num(p, "--kv-heads", int, None, "custom model: number of KV heads")
    num(p, "--head-size", int, None, "custom model: head size")
    p.add_argument("--dtype-bytes", type=int, choices=BYTES, help="custom model: bytes per "
                   "element (2 fp16, 1 fp8)")
    num(p, "--block-size", int, 16, "tokens per block")
    num(p, "--context-len", int, 2048, "tokens per request, for the per-request figures")
    num(p, "--num-requests", int, 1000, "how many requests' block tables to add up")
    p.add_argument("--entry-bytes", type=int, default=4, choices=BYTES,
                   help="bytes per block-table entry (vLLM: int32 = 4)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def _check_tp(m: memory.ModelSpec, tp: int) -> None:
    """vLLM's rule for sharding over --tp GPUs (``ModelSpec.kv_heads_per_gpu`` decides), refused
    in the flag's words."""
    try:
        m.kv_heads_per_gpu(tp)
    except ValueError:
        kv = "" if m.is_mla else (f", and --tp and the {m.num_kv_heads} KV heads must divide one "
                                  "another")
        raise ValueError(f"--tp={tp} cannot shard {m.name}: vLLM needs --tp to divide the "
                         f"{m.num_heads} query heads{kv}") from None


def kv_calc(args) -> int:
    from minipaged.sim import nbytes

    if args.kv_dtype is not None and args.dtype_bytes is not None:
        raise ValueError("--kv-dtype and --dtype-bytes both set the bytes per element: give one")
    if args.tp is not None:
        _check_tp(memory.KV_PRESETS[args.model].model, args.tp)
    p = memory.kv_preset(args.model, kv_cache_gb=args.kv_cache_gb, tp=args.tp,
                         kv_dtype=args.kv_dtype)
    if any(v is not None for v in (args.layers, args.kv_heads, args.head_size, args.dtype_bytes)):
        m = p.model                  # a custom model: the given values replace the preset's
        if m.is_mla and (args.kv_heads or args.head_size):
            raise ValueError(f"--kv-heads and --head-size do not change the KV of {m.name}: "
                             f"MLA caches one latent per token and layer")
        kv_heads = args.kv_heads or m.num_kv_heads      # (the parser refused 0 and below)
        heads = m.num_heads if m.num_heads % kv_heads == 0 else kv_heads
        m = replace(m, name=f"{m.name} (custom)", num_layers=args.layers or m.num_layers,
                    num_heads=heads, num_kv_heads=kv_heads, head_size=args.head_size or
                    m.head_size, dtype_bytes=args.dtype_bytes or m.dtype_bytes)
        p = replace(p, model=m)
        _check_tp(m, p.tp)           # the custom heads, which the preset's check did not see
    r = memory.kv_calc(p, block_size=args.block_size, context_len=args.context_len,
                num_requests=args.num_requests, entry_bytes=args.entry_bytes)
    ids = 2 ** (8 * args.entry_bytes - 1)  # signed entries, as int32 is (minipaged pads with -1)
    if r["num_blocks"] > ids:
        raise ValueError(f"--entry-bytes={args.entry_bytes} names at most {ids:,} blocks (signed "
                         f"entries), and this cache has {r['num_blocks']:,}; expected a larger "
                         "--entry-bytes")
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    per_gpu = " (per GPU)" if r["tp"] > 1 else ""
    how = ((f"(kv_lora_rank + qk_rope_head_dim) x layers x {r['kv_dtype_bytes']} B (MLA)")
           if r["mla"] else f"2 x layers x {r['kv_heads_per_gpu']} KV heads{per_gpu} x "
           f"head_size x {r['kv_dtype_bytes']} B")
    t = table(f"KV cache of {r['model']} on {r['gpu']}"
              + (f", tensor parallel over {r['tp']} GPUs" if r["tp"] > 1 else ""),
              ("quantity", "value", "how"), left=("quantity", "how"))
    for row in (
        (f"KV bytes per token{per_gpu}", nbytes(r["kv_bytes_per_token"]), how),
        (f"KV cache budget{per_gpu}", nbytes(r["kv_cache_bytes"]), "preset or --kv-cache-gb"),
        ("token slots", f"{r['token_slots']:,}", "budget // bytes per token"),
        ("blocks", f"{r['num_blocks']:,}", f"slots // block_size ({r['block_size']})"),
        ("bytes per block", nbytes(r["block_bytes"]), "block_size x bytes per token"),
        ("blocks per request", f"{r['blocks_per_request']:,}",
         f"ceil(context {r['context_len']} / block_size)"),
        ("KV per request", nbytes(r["kv_bytes_per_request"]), "context x bytes per token"),
        ("block table per request", nbytes(r["block_table_bytes_per_request"]),
         f"blocks x {r['entry_bytes']} B per entry"),
        (f"block tables for {r['num_requests']:,} requests",
         nbytes(r["block_table_bytes_total"]), "per request x requests"),
        ("requests of that context that fit", f"{r['requests_that_fit']:,}", "slots // context"),
    ):
        t.add_row(*row)
    Console().print(t)
    return 0
