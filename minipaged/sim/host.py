"""What this machine can hold: the one rule that refuses a run too big for it, before it allocates.

``simulate`` applies it to its own configuration, and the command line's runners (``kit/cli``,
``kit/bench``) to theirs, each naming its own arguments: half of the memory there is may be used
(the rest is for everything an estimate leaves out). The simulator's estimate counts what it
keeps per request and per paged block; a contiguous policy keeps no per-slot state.
"""

from __future__ import annotations

import os

from minipaged.sim import nbytes
from minipaged.sim.memory import preset

# Measured here with /usr/bin/time (max RSS over runs of two sizes): the simulator holds about
# 95 bytes per paged block (135 with prefix caching), its twin in the CPU pool included (the
# default swap space has one per GPU block), and about 7 KB per request of a ShareGPT workload
# that arrives all at once (its sequences, token ids and per-step records).
SIM_BYTES_PER_BLOCK = 150
SIM_BYTES_PER_REQUEST = 8_000


def available_memory() -> int:
    """Bytes this process could still allocate: the system's available memory (its physical
    memory where there is no /proc/meminfo), capped by the process's address-space limit
    (``ulimit -v``) when one is set."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        import resource
    except ImportError:                 # Windows: no address-space limit to read
        return avail
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return avail if soft == resource.RLIM_INFINITY else min(avail, soft)


def refuse_if_too_big(what: str, need: float) -> None:
    """Refuse a run, before it allocates, whose memory would exceed half of what is available
    (the rest is for everything the estimate leaves out)."""
    limit = available_memory() / 2
    if need > limit:
        raise ValueError(f"{what} would need about {nbytes(need)} of memory; at most "
                         f"{nbytes(limit)} (half of what is available) may be used")


def check_sim_size(num_requests: int, samples: int = 1, *, model: str = "opt-13b",
                   kv_cache_gb: float | None = None, num_slots: int | None = None,
                   block_size: int | None = 16, swap_space_blocks: int | None = None,
                   flag: str = "num_requests", kv_flag: str = "kv_cache_gb") -> None:
    """Refuse a simulation too big for this machine: ``num_requests`` requests of ``samples``
    sequences over the blocks of ``num_slots`` (else the preset's budget, or ``kv_cache_gb``)
    and a CPU pool of ``swap_space_blocks`` (``block_size=None``: a contiguous policy, which
    keeps no per-block state). ``flag`` and ``kv_flag`` name the count and the budget in the
    message (the command line passes its flags)."""
    slots = preset(model, kv_cache_gb=kv_cache_gb).num_token_slots if num_slots is None \
        else num_slots
    blocks = 0 if block_size is None else max(slots // block_size, swap_space_blocks or 0)
    what = f"{flag}={num_requests}" + (f" x {samples} sequences" if samples > 1 else "")
    given = [f"{kv_flag}={kv_cache_gb:g}"] if kv_cache_gb is not None else []
    given += [f"{name}={v}" for name, v in (("num_slots", num_slots),
                                            ("swap_space_blocks", swap_space_blocks))
              if v is not None]
    if given:
        what += f" with {' and '.join(given)} ({blocks:,} simulated blocks)"
    refuse_if_too_big(what, num_requests * samples * SIM_BYTES_PER_REQUEST
                      + blocks * SIM_BYTES_PER_BLOCK)
