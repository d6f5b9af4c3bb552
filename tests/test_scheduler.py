"""Scheduler unit tests: what it plans. Prefill-only and decode-only steps, chunked prefill
within the token budget, both preemption modes, parallel sampling's copy-on-write, finishing a
sequence early, swapped-out groups coming back before any new admission, and the whole-batch
shortcut against its oracle. Bad inputs and refusals are in tests/test_scheduler_errors.py."""

from __future__ import annotations

import pytest
from scheduler_helpers import COST, paged, run

from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig
from minipaged.sim.executor import SimExecutor


def test_v0_steps_are_all_prefill_or_all_decode_and_finish():
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    for i in range(3):
        s.add_request(i, [i + 1] * 5, 3)
    outs = run(s)
    assert all(not (o.prefills and o.decodes) for o in outs)
    assert outs[0].num_prefill_tokens == 15 and not outs[0].decodes
    assert [len(g.outputs[0]) for g in s.finished] == [8, 8, 8]
    m = s.policy.manager
    assert m.num_free_blocks == m.num_blocks


def test_chunked_prefill_respects_the_token_budget_and_decodes_first():
    s = Scheduler(paged(num_blocks=32), SchedulerConfig(max_model_len=64, chunked_prefill=True,
                                                        max_num_batched_tokens=8))
    s.add_request(0, [1] * 3, 6)
    s.add_request(1, [2] * 30, 2)
    outs = run(s)
    assert all(o.num_tokens <= 8 for o in outs)
    chunks = [(c.start, c.end) for o in outs for c in o.prefills if c.seq.group.request_id == 1]
    assert chunks[0][0] == 0 and chunks[-1][1] == 30 and len(chunks) >= 4
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:])), "chunks must be contiguous"
    mixed = [o for o in outs if o.prefills and o.decodes]
    assert mixed, "chunked prefill should mix decodes and prefill chunks in one step"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_mode_is_honoured(mode):
    # 6 blocks of 4 slots: three requests growing to 20 tokens cannot all stay.
    s = Scheduler(paged(num_blocks=8, watermark=0.0),
                  SchedulerConfig(max_model_len=64, preemption_mode=mode))
    for i in range(3):
        s.add_request(i, [i + 1] * 4, 16)
    outs = run(s)
    modes = {m for o in outs for _, m in o.preempted}
    assert modes == {mode}
    if mode == "swap":
        assert any(o.blocks_to_swap_out for o in outs) and any(o.blocks_to_swap_in for o in outs)
    assert len(s.finished) == 3 and s.num_preemptions > 0


def test_parallel_sampling_forks_and_copies_on_write():
    s = Scheduler(paged(num_blocks=32), SchedulerConfig(max_model_len=64))
    s.add_request(0, [7] * 6, 3, n=3)  # 6 tokens in blocks of 4: the last block is shared
    outs = run(s)
    copies = [p for o in outs for p in o.blocks_to_copy]
    assert len(copies) == 2, "two of the three samples copy the shared partial block"
    g = s.finished[0]
    assert len(g.outputs) == 3 and len({tuple(o) for o in g.outputs}) == 3


def test_finish_seq_ends_a_sequence_early_and_frees_it():
    s = Scheduler(paged(num_blocks=32), SchedulerConfig(max_model_len=64))
    g = s.add_request(0, [1, 2, 3], 10, n=2)
    ex = SimExecutor(COST, 1, seed=0)
    out = s.schedule()
    s.update(out, ex.execute(out), 0.1)
    assert len(g.seqs) == 2
    first, second = g.seqs
    assert s.finish_seq(first, 0.2) is False and g.status == "running"
    with pytest.raises(ValueError, match="not a running sequence"):
        s.finish_seq(first, 0.2)
    assert s.finish_seq(second, 0.3) is True
    assert g.status == "finished" and g.finish_s == 0.3 and not s.has_unfinished()
    m = s.policy.manager
    assert m.num_free_blocks == m.num_blocks and len(g.outputs) == 2


def swap_then_admit(chunked: bool):
    """Three requests that outgrow 8 blocks (one is swapped out), then a tiny fourth one that
    arrives while it is out. Returns, per step: (a group is still swapped out after the
    schedule, the requests admitted, whether a group came back)."""
    s = Scheduler(paged(num_blocks=8, watermark=0.0),
                  SchedulerConfig(max_model_len=64, preemption_mode="swap",
                                  chunked_prefill=chunked,
                                  max_num_batched_tokens=32 if chunked else None))
    for i in range(3):
        s.add_request(i, [i + 1] * 4, 12)
    ex, now, log, late = SimExecutor(COST, 1, seed=0), 0.0, [], None
    while s.has_unfinished():
        if late is None and s.swapped:
            late = s.add_request("late", [9], 1, arrival_s=now)
        out = s.schedule()
        admitted = {c.seq.group.request_id for c in out.prefills if c.start == 0}
        log.append((bool(s.swapped), admitted, bool(out.blocks_to_swap_in)))
        res = ex.execute(out)
        now += res.duration_s
        s.update(out, res, now)
    assert late is not None and late.status == "finished"
    return log


@pytest.mark.parametrize("chunked", [False, True])
def test_swapped_out_groups_come_back_before_any_new_admission(chunked):
    log = swap_then_admit(chunked)
    assert not [i for i, (swapped, admitted, _) in enumerate(log) if swapped and admitted], \
        "a request was admitted while a group was swapped out"
    first_swap_in = next(i for i, (_, _, swap_in) in enumerate(log) if swap_in)
    late_admitted = next(i for i, (_, admitted, _) in enumerate(log) if "late" in admitted)
    # Chunked: the same step may bring the group back and then admit (swap-ins come first).
    assert first_swap_in <= late_admitted if chunked else first_swap_in < late_admitted


def test_a_swap_that_could_never_come_back_is_recomputed():
    # Three samples share one 32-slot block; the pool has 3 blocks. Swapped out, the newer
    # group would need its block plus one per sequence, 4 > 3, to come back: it is recomputed.
    s = Scheduler(make_policy("paged", num_slots=3 * 32, block_size=32, max_seq_len=64,
                              num_cpu_blocks=3),
                  SchedulerConfig(max_model_len=64, preemption_mode="swap"))
    for i, p in enumerate((19, 20)):
        s.add_request(i, [i + 1] * p, 10, n=3)
    outs = run(s)
    pre = [(g.request_id, mode) for o in outs for g, mode in o.preempted]
    assert pre and all(mode == "recompute" for _, mode in pre), pre
    assert not any(o.blocks_to_swap_out for o in outs) and s.num_swapped_out == 0
    assert [len(g.outputs) for g in s.finished] == [3, 3]
    m = s.policy.manager
    assert m.num_free_blocks == m.num_blocks and m.num_free_cpu_blocks == 3


# ---- the whole-batch shortcut against its oracle ---------------------------------------------
SHORTCUT_RUNS = [
    dict(),                                                # recompute under pressure
    dict(preemption_mode="swap"),
    dict(n=3),                                             # parallel sampling: copy-on-write
    dict(beam_width=3, preemption_mode="swap"),
    dict(enable_prefix_caching=True, shared_prefix=True),  # hits, evictions
    dict(chunked_prefill=True),
    dict(policy="orca-max"),
]


def _plans(run_kw: dict, by_group: bool, monkeypatch) -> list:
    """Every step's plan of a small, memory-starved run, as plain values."""
    from minipaged.sim.workloads import make_workload, prompt_token_ids

    kw = dict(run_kw)
    n, beam = kw.pop("n", 1), kw.pop("beam_width", 1)
    policy, shared = kw.pop("policy", "paged"), kw.pop("shared_prefix", False)
    chunked = kw.pop("chunked_prefill", False)
    mode = kw.pop("preemption_mode", "recompute")
    with monkeypatch.context() as m:
        if by_group:
            m.setattr(Scheduler, "_schedule_running", Scheduler._decode_by_group)
        pol = make_policy(policy, num_slots=60 * 8, block_size=8, max_seq_len=256,
                          num_cpu_blocks=30, **kw)
        s = Scheduler(pol, SchedulerConfig(max_model_len=256, chunked_prefill=chunked,
                                           preemption_mode=mode))
        for r in make_workload("alpaca", 40, seed=1, max_model_len=256):
            prompt = prompt_token_ids(0 if shared else r.request_id, r.prompt_len)
            s.add_request(r.request_id, prompt, min(r.output_len, 60), n=n, beam_width=beam)
        outs = run(s)
        assert not s.has_unfinished()
    return [([q.seq_id for q in o.decodes], [(c.seq.seq_id, c.start, c.end) for c in o.prefills],
             [(g.request_id, how) for g, how in o.preempted], o.blocks_to_copy,
             o.blocks_to_swap_out, o.blocks_to_swap_in) for o in outs]


@pytest.mark.parametrize("run_kw", SHORTCUT_RUNS, ids=lambda kw: ",".join(kw) or "plain")
def test_the_whole_batch_shortcut_plans_exactly_what_the_group_walk_plans(run_kw, monkeypatch):
    """``_schedule_running`` appends every decode at once when the whole batch fits; the
    group-by-group walk (``_decode_by_group``) is its oracle: the same runs, step by step, give
    the same decodes, prefills, preemptions, copies and swaps (block ids included)."""
    fast = _plans(run_kw, False, monkeypatch)
    assert fast == _plans(run_kw, True, monkeypatch)
    if run_kw.get("policy", "paged") == "paged":
        assert any(step[2] for step in fast), "the run should be starved enough to preempt"


def test_contiguous_usage_sizes_the_next_region_by_its_prompt():
    # Orca (Pow2) reserves the prompt plus the output rounded up: the next request, 50 tokens
    # growing to 100, needs 50 + 64 = 114 slots, which the one free 128-slot buddy block serves.
    p = make_policy("orca-pow2", num_slots=256, max_seq_len=256)
    assert p.admit([0], [[1] * 64], 128) == [0]  # 64 + 64: a 128-slot region
    u = p.usage({0: 128}, (50, 100))
    assert (u.external_fragmentation, u.free) == (0, 128)
    assert p.usage({0: 128}, None).external_fragmentation == 128  # a max_seq_len region: none
