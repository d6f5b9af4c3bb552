"""The serving simulator: the real scheduler and the real memory managers, a cost model for time.

What this teaches: how the paper's serving results come about. Requests arrive (``workloads``),
the scheduler (``serving/scheduler.py``) batches them step by step over a real
``KVCacheManager`` or ``ContiguousKVCache`` (``serving/memory_policy.py``); each step's duration
comes from a roofline cost model (``cost.py``), its sampled tokens from a deterministic stand-in
instead of a model (both through ``SimExecutor``, ``executor.py``). Memory decides the batch
size, the batch size decides the throughput: the paper's argument (sections 3 and 6), measured
with the project's own managers.
Read next: ``sim/experiments.py``.

What is measured (``SimResult``; ``--json`` writes it):
    kv_usage            time-averaged fractions of all KV slots per category (``usage.py``);
                        they add up to the used share; snapshots every ``usage_every`` steps
                        (auto: num_requests // 8, at least 16: a snapshot costs a pass over
                        the block tables), each weighted by the simulated time since the last;
                        None (JSON null) for a run shorter than its first snapshot
    kv_usage_saturated  the same, only over snapshots taken while requests were queued (memory
                        is the bottleneck then; this window is minipaged's choice: the paper
                        does not say over which part of its run Fig. 2 averages)
    avg_batch_size      sequences per decode step (all running sequences in vLLM v0's
                        decode steps), averaged over decode steps
    throughput          generated tokens per simulated second
    normalized latency  mean over requests of (finish - arrival) / output_len, in s/token
    memory_saving       for sharing runs: 1 - blocks used / blocks the same sequences would
                        need without sharing (the paper's Fig. 15 definition), time-averaged
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from minipaged._checks import cdiv, check_int
from minipaged.contiguous.usage import CATEGORIES
from minipaged.serving.memory_policy import PagedPolicy, make_policy
from minipaged.serving.scheduler import NoProgressError, Scheduler
from minipaged.sim.config import SimConfig
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import SimExecutor
from minipaged.sim.host import check_sim_size
from minipaged.sim.memory import preset
from minipaged.sim.workloads import WORKLOADS, make_workload, prompt_token_ids


@dataclass
class SimResult:
    config: dict
    num_requests: int
    num_finished: int
    num_rejected: int
    num_steps: int
    sim_time_s: float
    throughput_tokens_per_s: float
    throughput_requests_per_s: float
    normalized_latency_s_per_token: float
    avg_batch_size: float
    num_preemptions: int
    num_swapped_out: int
    num_recomputed: int
    kv_usage: dict[str, float] | None  # None: the run ended before its first snapshot
    kv_usage_saturated: dict[str, float] | None
    memory_saving: float | None
    token_slots: int
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def build(cfg: SimConfig):
    """The pieces of a run: (requests, scheduler, executor, token_slots); a run too big for
    this machine is refused before any of them is made (``host.check_sim_size``)."""
    p = preset(cfg.model, kv_cache_gb=cfg.kv_cache_gb)
    slots = cfg.num_slots if cfg.num_slots is not None else p.num_token_slots
    max_len = p.model.max_model_len
    kw = dict(request_rate=cfg.request_rate, seed=cfg.seed, max_model_len=max_len)
    synthetic = cfg.workload in WORKLOADS  # made after the size check; a trace is read first
    reqs = [] if synthetic else make_workload(cfg.workload, cfg.num_requests, **kw)
    check_sim_size(cfg.num_requests if synthetic else len(reqs), max(cfg.n, cfg.beam_width),
                   model=cfg.model, kv_cache_gb=cfg.kv_cache_gb, num_slots=cfg.num_slots,
                   block_size=cfg.block_size if cfg.policy == "paged" else None,
                   swap_space_blocks=cfg.swap_space_blocks)
    reqs = make_workload(cfg.workload, cfg.num_requests, **kw) if synthetic else reqs
    num_blocks = slots // cfg.block_size
    cpu = cfg.swap_space_blocks if cfg.swap_space_blocks is not None else num_blocks
    policy = make_policy(cfg.policy, num_slots=slots, block_size=cfg.block_size,
                         max_seq_len=max_len,
                         enable_prefix_caching=cfg.enable_prefix_caching or (
                             cfg.n > 1 and cfg.sharing == "prefix"),
                         num_cpu_blocks=cpu if cfg.policy == "paged" else 0)
    sched = Scheduler(policy, cfg.scheduler_config(max_len))
    cost = CostModel.for_preset(p)
    ex = SimExecutor(cost, p.model.kv_bytes_per_token * cfg.block_size, cfg.seed,
                     block_size=cfg.block_size if cfg.policy == "paged" else None)
    return reqs, sched, ex, slots


def simulate(cfg: SimConfig, *, progress: Callable[[int, int], None] | None = None,
             progress_every: int = 256) -> SimResult:
    """Run one simulation to the end. ``progress(finished, total)`` is called every
    ``progress_every`` steps and at the end."""
    if not isinstance(cfg, SimConfig):
        raise TypeError(f"cfg must be a SimConfig, got {type(cfg).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress={progress!r} must be a callable(finished, total) or None")
    check_int("progress_every", progress_every, low=1)
    reqs, sched, ex, slots = build(cfg)
    policy = sched.policy
    paged = isinstance(policy, PagedPolicy)
    bs = cfg.block_size if paged else 1
    v1_copies = cfg.n if (cfg.n > 1 and cfg.sharing == "prefix") else 1
    per_group_n = 1 if v1_copies > 1 else cfg.n
    total_groups = len(reqs) * v1_copies
    sharing_run = cfg.n > 1 or cfg.beam_width > 1 or cfg.enable_prefix_caching
    acc, acc_sat = dict.fromkeys(CATEGORIES, 0.0), dict.fromkeys(CATEGORIES, 0.0)
    w_total = w_sat = w_pending = 0.0
    used_blocks_acc = unshared_acc = 0.0
    batch_acc, decode_steps = 0.0, 0
    usage_every = cfg.usage_every or max(16, cfg.num_requests // 8)
    now, i, step = 0.0, 0, 0
    while i < len(reqs) or sched.has_unfinished():
        while i < len(reqs) and reqs[i].arrival_s <= now:
            r = reqs[i]
            toks = prompt_token_ids(r.request_id, r.prompt_len)
            for c in range(v1_copies):  # v1 parallel sampling: n requests, one shared prompt
                sched.add_request((r.request_id, c), list(toks), r.output_len,
                                  arrival_s=r.arrival_s, n=per_group_n,
                                  beam_width=cfg.beam_width)
            i += 1
        if not sched.has_unfinished():
            if i < len(reqs):
                now = reqs[i].arrival_s  # idle: jump to the next arrival
            continue
        out = sched.schedule()
        if out.is_empty:  # the scheduler raises first; this guards any other scheduler
            raise NoProgressError(f"step {step}: {sched.stall_report()}")
        res = ex.execute(out)
        now, dt = now + res.duration_s, res.duration_s
        sched.update(out, res, now)
        step += 1
        if out.decodes:
            batch_acc += len(out.decodes)
            decode_steps += 1
        w_pending += dt
        if step % usage_every == 0 and w_pending > 0:
            final_lens = {s.seq_id: g.final_len for g in sched.running for s in g.seqs}
            g0 = sched.waiting[0] if sched.waiting else None  # the next one to admit
            nxt = (len(g0.seqs[0].token_ids), g0.final_len) if g0 else None
            u = policy.usage(final_lens, nxt)
            saturated = bool(sched.waiting)
            for c in CATEGORIES:
                acc[c] += getattr(u, c) * w_pending
                if saturated:
                    acc_sat[c] += getattr(u, c) * w_pending
            w_total += w_pending
            if saturated:
                w_sat += w_pending
            if sharing_run and paged:
                used_blocks_acc += policy.blocks_in_use() * w_pending
                unshared = 0
                for g in sched.running:
                    for s in g.seqs:
                        unshared += cdiv(len(s.token_ids) - (0 if s.prefilling else 1), bs)
                unshared_acc += unshared * w_pending
            w_pending = 0.0
        if progress is not None and step % progress_every == 0:
            progress(len(sched.finished) + len(sched.rejected), total_groups)
    if progress is not None:
        progress(len(sched.finished) + len(sched.rejected), total_groups)

    fin = sched.finished
    start = reqs[0].arrival_s if reqs else 0.0
    makespan = max((g.finish_s for g in fin), default=start) - start
    gen_tokens = sum(g.output_len * max(g.n, g.beam_width) for g in fin)
    lat = [(g.finish_s - g.arrival_s) / g.output_len for g in fin]
    total = policy.total_slots

    def fractions(a: dict, w: float) -> dict[str, float] | None:
        if w <= 0:
            return None
        return {c: a[c] / (total * w) for c in CATEGORIES}

    extra: dict = {"blocks_read_per_decode_seq": ex.blocks_read / max(1, batch_acc)
                   if ex.block_size else None}
    if sched.rejected:  # refused up front: why the first one could never run
        extra["first_rejection"] = sched.rejections[sched.rejected[0].order]
    return SimResult(
        config=asdict(cfg),
        num_requests=total_groups,
        num_finished=len(fin),
        num_rejected=len(sched.rejected),
        num_steps=step,
        sim_time_s=now,
        throughput_tokens_per_s=gen_tokens / makespan if makespan > 0 else 0.0,
        throughput_requests_per_s=len(fin) / makespan if makespan > 0 else 0.0,
        normalized_latency_s_per_token=sum(lat) / len(lat) if lat else 0.0,
        avg_batch_size=batch_acc / decode_steps if decode_steps else 0.0,
        num_preemptions=sched.num_preemptions,
        num_swapped_out=sched.num_swapped_out,
        num_recomputed=sched.num_recomputed,
        kv_usage=fractions(acc, w_total),
        kv_usage_saturated=fractions(acc_sat, w_sat),
        memory_saving=(1.0 - used_blocks_acc / unshared_acc) if (
            sharing_run and paged and unshared_acc > 0) else None,
        token_slots=total,
        extra=extra,
    )
