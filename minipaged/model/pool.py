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

from minipaged._checks import check_float, check_int, refuse_unused

DEFAULT_KV_CACHE_GB = 1.0
DEFAULT_NUM_BLOCKS = 256  # a model object's pool when neither num_blocks nor a budget is given


def cpu_pool_size(preemption: str, num_cpu_blocks: int | None) -> int | None:
    """The CPU pool's blocks: 0 for preemption="recompute", which swaps nothing out (a
    num_cpu_blocks given with it is refused); for "swap" num_cpu_blocks >= 1 (None: as many as
    the KV pool, which pool_size counts in)."""
    if num_cpu_blocks is not None:
        num_cpu_blocks = check_int("num_cpu_blocks", num_cpu_blocks, low=0)
    if preemption == "swap" and num_cpu_blocks == 0:
        raise ValueError("preemption='swap' swaps preempted sequences out to a CPU pool, but "
                         "num_cpu_blocks=0 makes none; expected num_cpu_blocks >= 1 (None: as "
                         "many as num_blocks), or preemption='recompute'")
    if preemption != "swap" and num_cpu_blocks:
        refuse_unused(f"preemption={preemption!r} swaps nothing out",
                      [f"num_cpu_blocks={num_cpu_blocks}"], "preemption='swap' with it")
    return num_cpu_blocks if preemption == "swap" else 0


def pool_size(model, num_blocks: int | None, block_size: int, kv_cache_gb: float | None,
              from_dir: bool, *, num_cpu_blocks: int | None = 0) -> tuple[int, str]:
    """(num_blocks, a line saying how): ``num_blocks`` when given; else what ``kv_cache_gb`` GiB
    hold; with neither, 1 GiB for a model loaded ``from_dir`` (a Hugging Face folder) and 256
    blocks for a model passed as an object (the bundled tiny model, a Decoder built in code, or
    one already loaded with ``hf.load_hf``: pass ``kv_cache_gb`` to size that one by budget).
    Refused before anything is allocated, naming what the caller gave: both sizes, a budget
    holding no block, and a pool (with ``num_cpu_blocks`` more in the CPU pool; None: as many)
    more than this machine holds (sim/host.py's rule, the one every runner applies)."""
    from minipaged.sim.host import SIM_BYTES_PER_BLOCK, refuse_if_too_big
    from minipaged.sim.memory import GiB, GPUSpec, MemoryPreset, kv_calc

    c = model.cfg
    elem = next(model.parameters()).element_size()  # the KV cache takes the model's dtype
    if num_blocks is not None and kv_cache_gb is not None:
        raise ValueError(f"num_blocks={num_blocks} and kv_cache_gb={kv_cache_gb} both size the "
                         "KV pool; expected one of them")
    if num_blocks is not None:
        given = f"num_blocks={num_blocks}"
        note = f"KV pool: {num_blocks} blocks of {block_size} (given)"
    elif kv_cache_gb is None and not from_dir:
        num_blocks, given = DEFAULT_NUM_BLOCKS, f"the default {DEFAULT_NUM_BLOCKS} blocks"
        note = (f"KV pool: {DEFAULT_NUM_BLOCKS} blocks of {block_size} (the default for a model "
                "object; num_blocks or kv_cache_gb sets it)")
    else:
        gb = DEFAULT_KV_CACHE_GB if kv_cache_gb is None else kv_cache_gb
        if not check_float("kv_cache_gb", gb) > 0:
            raise ValueError(f"kv_cache_gb={gb} is out of range: expected > 0 (GiB)")
        spec = c.memory_spec(float(model.num_parameters()), dtype_bytes=elem)
        # the "device" is host memory; kv_calc reads only its name (not bandwidth, FLOP/s)
        host = GPUSpec("host memory", int(gb * GiB), mem_bw=0.0, flops=0.0)
        r = kv_calc(MemoryPreset(spec, host, int(gb * GiB)), block_size=block_size,
                    context_len=c.max_seq_len)
        num_blocks = r["num_blocks"]
        if num_blocks < 1:
            raise ValueError(f"kv_cache_gb={gb:g} holds {r['token_slots']:,} tokens of this "
                             f"model ({r['kv_bytes_per_token']:,} B each), less than one block "
                             f"of block_size={block_size}; expected a larger kv_cache_gb or a "
                             "smaller block_size")
        given = f"kv_cache_gb={gb:g}" if kv_cache_gb is not None else f"the default {gb:g} GiB"
        note = (f"KV pool: 2 x {c.n_layers} layers x {c.n_kv_heads} KV heads x {c.head_dim} x "
                f"{elem} B = {r['kv_bytes_per_token']:,} B per token; {gb:g} GiB / that = "
                f"{r['token_slots']:,} tokens = {num_blocks:,} blocks of {block_size}")
    cpu = num_blocks if num_cpu_blocks is None else num_cpu_blocks
    refuse_if_too_big(f"{given} x block_size={block_size} (the KV pool)",
                      (num_blocks + cpu) * block_size * c.kv_bytes_per_token(elem)
                      + num_blocks * 2 * SIM_BYTES_PER_BLOCK)
    return num_blocks, note
