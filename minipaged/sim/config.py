"""What one simulation is asked to run: ``SimConfig``, checked when it is made.

One field per ``minipaged simulate`` flag, and num_slots, swap_space_blocks and usage_every. A run
never starts on a setting it would ignore, a KV budget holding no block, or a scheduler setting
the scheduler refuses.
The messages name the parameters, and the command line rewords them with its flags
(``kit/cli/common.flag_words``), so one check serves both. Read next: ``simulator.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minipaged._checks import SIZE_LIMIT, check_bool, check_choice, check_int, refuse_unused
from minipaged.serving.memory_policy import POLICY_NAMES
from minipaged.serving.scheduler import SchedulerConfig
from minipaged.sim import nbytes
from minipaged.sim.memory import MemoryPreset, preset
from minipaged.sim.workloads import (
    WORKLOADS,
    check_request_rate,
    check_workload,
    has_arrival_times,
)


@dataclass(frozen=True)
class SimConfig:
    workload: str = "sharegpt"        # sharegpt | alpaca | path of a JSONL trace
    policy: str = "paged"             # paged | orca-max | orca-pow2 | orca-oracle
    num_requests: int = 1000
    request_rate: float = math.inf    # requests per second (Poisson); inf: all at t=0
    seed: int = 0
    block_size: int = 16
    model: str = "opt-13b"            # memory + cost preset (memory.PRESETS)
    kv_cache_gb: float | None = None  # override the preset's KV budget (GiB)
    num_slots: int | None = None      # override the KV budget in token slots (tests)
    n: int = 1                        # parallel samples per request
    beam_width: int = 1
    sharing: str = "cow"              # n > 1: "cow" (v0 fork) or "prefix" (v1: n requests)
    enable_prefix_caching: bool = False
    preemption_mode: str = "recompute"
    swap_space_blocks: int | None = None  # CPU pool; default: as many blocks as the GPU
    chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    usage_every: int | None = None    # steps between usage snapshots; None: auto

    def __post_init__(self) -> None:
        # Each value is stored as it was checked (a NumPy int becomes an int, so the result's
        # JSON can hold it); the dataclass is frozen, hence object.__setattr__.
        def keep(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        check_workload(self.workload)
        check_choice("policy", self.policy, POLICY_NAMES)
        for name, low in (("num_requests", 1), ("n", 1), ("beam_width", 1), ("max_num_seqs", 1),
                          ("block_size", 1)):
            keep(name, check_int(name, getattr(self, name), low=low))
        keep("request_rate", check_request_rate(self.request_rate))
        keep("seed", check_int("seed", self.seed, low=0))
        check_choice("sharing", self.sharing, ("cow", "prefix"))
        for name in ("enable_prefix_caching", "chunked_prefill"):
            check_bool(name, getattr(self, name))
        for name, low in (("num_slots", 1), ("swap_space_blocks", 0), ("usage_every", 1)):
            if getattr(self, name) is not None:
                keep(name, check_int(name, getattr(self, name), low=low, high=SIZE_LIMIT))
        if self.num_slots is not None and self.kv_cache_gb is not None:
            raise ValueError(f"num_slots={self.num_slots} and kv_cache_gb={self.kv_cache_gb!r} "
                             "both set the KV budget; give one")
        p = preset(self.model, kv_cache_gb=self.kv_cache_gb)  # both checked
        self._check_budget(p)
        self.scheduler_config(p.model.max_model_len)  # its own checks, before any run
        self._check_combinations()

    def _check_budget(self, p: MemoryPreset) -> None:
        """The KV budget holds at least one block (or token slot), and fewer than 2**31."""
        slots = self.num_slots if self.num_slots is not None else p.num_token_slots
        budget = (f"num_slots={self.num_slots}" if self.num_slots is not None
                  else f"kv_cache_gb={self.kv_cache_gb:g}" if self.kv_cache_gb is not None
                  else f"the {self.model} preset's {nbytes(p.kv_cache_bytes)} of KV cache")
        larger = ("" if self.kv_cache_gb is None and self.num_slots is None else " or a larger "
                  + ("num_slots" if self.num_slots is not None else "kv_cache_gb"))
        unit, what = (self.block_size, "blocks") if self.policy == "paged" else (1, "token slots")
        if slots < unit:  # (a contiguous policy only with a tiny kv_cache_gb: num_slots >= 1)
            raise ValueError(f"{budget} holds {slots:,} token slots, less than one block of "
                             f"block_size={self.block_size}; expected a smaller block_size{larger}"
                             if unit > 1 else f"{budget} holds no token slot; expected a larger "
                             "kv_cache_gb")
        if unit == 1 and slots < p.model.max_model_len:  # ContiguousKVCache places one at least
            raise ValueError(f"{budget} holds {slots:,} token slots, fewer than one region of "
                             f"max_model_len={p.model.max_model_len} that policy={self.policy!r} "
                             "must be able to reserve; expected a larger "
                             + ("num_slots" if self.num_slots is not None else "kv_cache_gb"))
        if slots // unit >= SIZE_LIMIT:  # only a kv_cache_gb can get here: num_slots is bounded
            raise ValueError(f"{budget} holds {slots // unit:,} {what}; expected fewer than "
                             "2**31 (their ids are int32)")

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len, chunked_prefill=self.chunked_prefill,
            preemption_mode=self.preemption_mode, keep_outputs=False)

    def _check_combinations(self) -> None:
        """A setting the policy or the preemption mode would ignore is refused (the command
        line's flags come through here too)."""
        if self.policy != "paged" and (self.n > 1 or self.beam_width > 1):
            raise ValueError(f"policy={self.policy!r} cannot share memory between sequences: "
                             f"n={self.n} / beam_width={self.beam_width} need policy='paged'")
        paged_only = [f"{name}={getattr(self, name)!r}" for name, used in (
            ("enable_prefix_caching", self.enable_prefix_caching),
            ("preemption_mode", self.preemption_mode == "swap"),  # a reservation is never evicted
            ("block_size", self.block_size != SimConfig.block_size)) if used]  # its default
        if self.policy != "paged" and paged_only:
            raise ValueError(f"policy={self.policy!r} reserves one contiguous region per request "
                             f"and would ignore {', '.join(paged_only)}: only policy='paged' "
                             f"uses {'it' if len(paged_only) == 1 else 'them'}")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError(f"n={self.n} and beam_width={self.beam_width}: at most one of them "
                             "may be above 1")
        if self.request_rate != math.inf and self.workload not in WORKLOADS and \
                has_arrival_times(self.workload):  # (a trace that does not parse: load_jsonl says)
            refuse_unused(f"workload={str(self.workload)!r} gives each request's arrival_s",
                          [f"request_rate={self.request_rate}"],
                          "the default request_rate=inf with this trace")
        if self.sharing == "prefix" and self.n == 1:
            raise ValueError("sharing='prefix' is how the samples of a request share its prompt, "
                             "and n=1 (beam search forks its beams); expected n=2 or more")
        one_seq_groups = self.beam_width == 1 and (self.n == 1 or self.sharing == "prefix")
        if self.swap_space_blocks and self.preemption_mode == "recompute" and one_seq_groups:
            raise ValueError(
                f"swap_space_blocks={self.swap_space_blocks} would never be used: with "
                "preemption_mode='recompute' only a group of several sequences (n > 1 with "
                "sharing='cow', or beam_width > 1) is swapped; use preemption_mode='swap'")
