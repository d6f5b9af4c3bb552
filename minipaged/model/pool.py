"""How many KV blocks a memory budget buys: lesson 01's arithmetic, applied to a real run.

What it teaches: the pool is sized by arithmetic, not guessed. vLLM's CPU backend takes a fixed
KV budget in GiB (the environment variable VLLM_CPU_KVCACHE_SPACE; vllm/platforms/cpu.py,
CpuPlatform.check_and_update_config) and divides it by the bytes of one block. The same
figures ``minipaged kv-calc`` prints (sim/memory.py ``kv_calc``) are computed here for the
loaded model, in float32:

    KV bytes per token = 2 (K and V) x layers x Hkv x D x 4 bytes
    token slots        = budget // bytes per token
    blocks             = token slots // block size

SmolLM2-135M: 2 x 30 x 3 x 64 x 4 = 46,080 bytes per token, so 1 GiB holds 23,301 tokens, 1,456
blocks of 16. The default budget is fixed (1 GiB), not "whatever memory is free", so a run
sizes its pool the same way on every machine.

Read before: decoder.py (ModelConfig.kv_bytes_per_token), ../sim/memory.py.
Read next: engine.py.
"""

from __future__ import annotations

DEFAULT_KV_CACHE_GB = 1.0


def pool_blocks(cfg, kv_cache_gb: float, block_size: int, *, num_params: float = 0.0,
                itemsize: int = 4) -> tuple[int, str]:
    """(num_blocks, the arithmetic in one line) for a KV budget of ``kv_cache_gb`` GiB."""
    from minipaged.sim.memory import GiB, GPUSpec, MemoryPreset, ModelSpec, kv_calc

    if isinstance(kv_cache_gb, bool) or not isinstance(kv_cache_gb, (int, float)) \
            or not kv_cache_gb > 0:
        raise ValueError(f"kv_cache_gb must be a number > 0 (GiB), got {kv_cache_gb!r}")
    spec = ModelSpec("model", cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                     float(num_params), itemsize, cfg.max_seq_len)
    # The "device" is host memory; kv_calc reads only its name (bandwidth and FLOP/s are for
    # the simulator's cost model, unused here).
    host = GPUSpec("host memory", int(kv_cache_gb * GiB), mem_bw=0.0, flops=0.0)
    r = kv_calc(MemoryPreset(spec, host, int(kv_cache_gb * GiB)), block_size=block_size,
                context_len=cfg.max_seq_len)
    if r["num_blocks"] < 1:
        raise ValueError(f"kv_cache_gb={kv_cache_gb} holds {r['token_slots']} tokens, less "
                         f"than one block of {block_size}: raise it")
    note = (f"KV pool: 2 x {cfg.n_layers} layers x {cfg.n_kv_heads} KV heads x {cfg.head_dim} "
            f"x {itemsize} B = {r['kv_bytes_per_token']:,} B per token; {kv_cache_gb:g} GiB / "
            f"that = {r['token_slots']:,} tokens = {r['num_blocks']:,} blocks of {block_size}")
    return r["num_blocks"], note


def pool_size(model, num_blocks: int | None, block_size: int, kv_cache_gb: float | None,
              from_dir: bool) -> tuple[int, str]:
    """The engine's pool: ``num_blocks`` when given; else 256 blocks for the tiny model (its
    default since lesson 09) unless a budget is given; else what the budget (1 GiB by default
    for a model directory) holds. Returns (num_blocks, a line saying which and how)."""
    if num_blocks is not None:
        return num_blocks, f"KV pool: {num_blocks} blocks of {block_size} (given)"
    if kv_cache_gb is None and not from_dir:
        return 256, f"KV pool: 256 blocks of {block_size} (the tiny model's default)"
    return pool_blocks(model.cfg, DEFAULT_KV_CACHE_GB if kv_cache_gb is None else kv_cache_gb,
                       block_size, num_params=model.num_parameters())
