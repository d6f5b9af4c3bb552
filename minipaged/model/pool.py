"""How many KV blocks a memory budget buys: lesson 01's arithmetic, applied to a real run.

vLLM's CPU backend takes a fixed KV budget in GiB (VLLM_CPU_KVCACHE_SPACE; vllm/platforms/cpu.py)
and divides it by the bytes of a block. Here ``kv_calc`` of sim/memory.py (``minipaged kv-calc``)
does it for the loaded model in its own dtype, which the KV cache takes: bytes per token = 2 (K
and V) x layers x Hkv x D x bytes per element; SmolLM2-135M in float32 (as hf.py loads it):
46,080, so 1 GiB holds 23,301 tokens, 1,456 blocks of 16. The default budget is a fixed 1 GiB,
not "whatever is free", so a run sizes its pool the same way on every machine.

Read before: ../sim/memory.py. Read next: engine.py.
"""

from __future__ import annotations

from minipaged._checks import check_float

DEFAULT_KV_CACHE_GB = 1.0
DEFAULT_NUM_BLOCKS = 256  # a model object's pool when neither num_blocks nor a budget is given


def pool_size(model, num_blocks: int | None, block_size: int, kv_cache_gb: float | None,
              from_dir: bool, *, names: tuple[str, str] = ("kv_cache_gb", "block_size"),
              ) -> tuple[int, str]:
    """(num_blocks, a line saying how): ``num_blocks`` when given; else what ``kv_cache_gb`` GiB
    hold; with neither, 1 GiB for a model loaded ``from_dir`` (a Hugging Face folder) and 256
    blocks for a model passed as an object (the bundled tiny model, a Decoder built in code, or
    one already loaded with ``hf.load_hf``: pass ``kv_cache_gb`` to size that one by budget).
    ``names``: what the caller calls kv_cache_gb and block_size when a budget holds no block
    (the command line: --kv-cache-gb and --block-size)."""
    from minipaged.sim.memory import GiB, GPUSpec, MemoryPreset, kv_calc

    if num_blocks is not None:
        return num_blocks, f"KV pool: {num_blocks} blocks of {block_size} (given)"
    if kv_cache_gb is None and not from_dir:
        return DEFAULT_NUM_BLOCKS, (f"KV pool: {DEFAULT_NUM_BLOCKS} blocks of {block_size} (the "
                                    "default for a model object; num_blocks or kv_cache_gb "
                                    "sets it)")
    gb = DEFAULT_KV_CACHE_GB if kv_cache_gb is None else kv_cache_gb
    if not check_float("kv_cache_gb", gb) > 0:
        raise ValueError(f"kv_cache_gb={gb} is out of range: expected > 0 (GiB)")
    c = model.cfg
    elem = next(model.parameters()).element_size()  # the KV cache takes the model's dtype
    spec = c.memory_spec(float(model.num_parameters()), dtype_bytes=elem)
    # the "device" is host memory; kv_calc reads only its name (not bandwidth, FLOP/s)
    host = GPUSpec("host memory", int(gb * GiB), mem_bw=0.0, flops=0.0)
    r = kv_calc(MemoryPreset(spec, host, int(gb * GiB)), block_size=block_size,
                context_len=c.max_seq_len)
    if r["num_blocks"] < 1:
        gb_name, bs_name = names
        raise ValueError(f"{gb_name}={gb:g} holds {r['token_slots']:,} tokens of this model "
                         f"({r['kv_bytes_per_token']:,} B each), less than one block of "
                         f"{bs_name}={block_size}; expected a larger {gb_name} or a smaller "
                         f"{bs_name}")
    return r["num_blocks"], (
        f"KV pool: 2 x {c.n_layers} layers x {c.n_kv_heads} KV heads x {c.head_dim} x {elem} B = "
        f"{r['kv_bytes_per_token']:,} B per token; {gb:g} GiB / that = {r['token_slots']:,} "
        f"tokens = {r['num_blocks']:,} blocks of {block_size}")
