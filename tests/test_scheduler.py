"""Scheduler unit tests: bad inputs, the step output's shape, chunked prefill, preemption modes."""

from __future__ import annotations

import numpy as np
import pytest

from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig, StepResult
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import SimExecutor
from minipaged.sim.memory import preset

COST = CostModel.for_preset(preset("opt-13b"))


def paged(num_blocks=16, block_size=4, **kw):
    return make_policy("paged", num_slots=num_blocks * block_size, block_size=block_size,
                       max_seq_len=64, num_cpu_blocks=64, **kw)


def run(s: Scheduler, max_steps=10_000):
    ex = SimExecutor(COST, 1, seed=0)
    now, outs = 0.0, []
    while s.has_unfinished() and len(outs) < max_steps:
        out = s.schedule()
        res = ex.execute(out)
        now += res.duration_s
        s.update(out, res, now)
        outs.append(out)
    return outs


def test_bad_requests_are_refused_with_the_reason():
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        s.add_request(0, [], 4)
    with pytest.raises(ValueError, match="output_len=0"):
        s.add_request(0, [1], 0)
    with pytest.raises(ValueError, match="exceeds max_model_len=64"):
        s.add_request(0, [1] * 60, 5)
    with pytest.raises(ValueError, match="at most one of them"):
        s.add_request(0, [1], 4, n=2, beam_width=2)
    s.add_request(0, [1], 4, arrival_s=2.0)
    with pytest.raises(ValueError, match="arrival order"):
        s.add_request(1, [1], 4, arrival_s=1.0)


def test_bad_configs():
    with pytest.raises(ValueError, match="preemption_mode"):
        SchedulerConfig(preemption_mode="drop")
    with pytest.raises(ValueError, match="max_num_batched_tokens=100 must be >= max_model_len"):
        SchedulerConfig(max_num_batched_tokens=100, max_model_len=2048)
    with pytest.raises(ValueError, match="watermark"):
        paged(watermark=1.5)
    for n in (2**31, 10**30):  # as every size: < 2**31
        with pytest.raises(ValueError, match=f"max_model_len={n} is out of range"):
            SchedulerConfig(max_model_len=n, chunked_prefill=True)
    # A truthy stand-in was stored as the flag ('yes' is not True); None dropped the outputs.
    for flag, bad in (("chunked_prefill", "yes"), ("keep_outputs", None), ("keep_outputs", 1)):
        with pytest.raises(TypeError, match=f"{flag}={bad!r} must be a bool"):
            SchedulerConfig(**{flag: bad})
    assert SchedulerConfig(chunked_prefill=np.True_).token_budget == 512


def test_contiguous_policies_refuse_sharing():
    s = Scheduler(make_policy("orca-oracle", num_slots=256, max_seq_len=64),
                  SchedulerConfig(max_model_len=64))
    with pytest.raises(ValueError, match="cannot share memory"):
        s.add_request(0, [1, 2], 4, n=2)


def test_step_result_must_match_sampled_sequences():
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    s.add_request(0, [1, 2, 3], 4)
    out = s.schedule()
    assert [c.end - c.start for c in out.prefills] == [3] and out.sampled == [out.prefills[0].seq]
    with pytest.raises(ValueError, match=r"samples=\[5, 6\] must be a list, one entry for each"):
        s.update(out, StepResult(0.1, [5, 6]), 0.1)


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


def test_a_request_too_big_for_the_cache_is_rejected_not_waited_for():
    s = Scheduler(paged(num_blocks=4, block_size=2), SchedulerConfig(max_model_len=64))
    s.add_request(0, [1] * 20, 2)
    s.add_request(1, [1] * 2, 2)
    run(s)
    assert [g.request_id for g in s.rejected] == [0]
    assert [g.request_id for g in s.finished] == [1]


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


def test_a_refused_request_says_why_at_once():
    s = Scheduler(paged(num_blocks=4, block_size=2), SchedulerConfig(max_model_len=64))
    g = s.add_request("big", [1] * 3, 6)  # grows to 8 tokens with K/V: 4 blocks, fits
    assert g.status == "waiting"
    g = s.add_request("wide", [1] * 3, 6, n=2)  # two samples of 8 tokens: 8 blocks
    assert g.status == "rejected" and s.rejected == [g] and list(s.waiting) != [g]
    assert s.rejections[g.order] == ("request 'wide' needs up to 8 blocks (2 sequence(s) of "
                                     "up to 8 tokens, block_size=2) but num_blocks=4")
    s2 = Scheduler(paged(), SchedulerConfig(max_model_len=64, max_num_seqs=2))
    g = s2.add_request(0, [1], 4, beam_width=3)
    assert g.status == "rejected" and "max_num_seqs=2" in s2.rejections[g.order]


def test_add_request_checks_every_argument_before_queueing_anything():
    import numpy as np

    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    for bad, kind, msg in [
        (dict(prompt_token_ids=[1, "x"]), TypeError, r"request 7: prompt_token_ids\[1\]='x'"),
        (dict(prompt_token_ids=[1, -2]), ValueError, r"prompt_token_ids\[1\]=-2"),
        (dict(prompt_token_ids="abc"), TypeError, "not a str"),
        (dict(output_len=2.5), TypeError, "output_len=2.5"),
        (dict(n=True), TypeError, "n=True"),
        (dict(arrival_s=float("nan")), ValueError, "arrival_s=nan"),
    ]:
        kw = dict(request_id=7, prompt_token_ids=[1, 2], output_len=3) | bad
        with pytest.raises(kind, match=msg):
            s.add_request(**kw)
        assert not s.has_unfinished() and not s.rejected and s._next_order == 0
    # NumPy integers are integers: accepted, stored as Python ints.
    g = s.add_request(0, np.array([5, 6, 7]), np.int64(3), n=np.int32(2))
    assert g.seqs[0].token_ids == [5, 6, 7] and type(g.seqs[0].token_ids[0]) is int
    run(s)
    assert s.finished == [g] and len(g.outputs) == 2


class _NoRoomPolicy:
    """A broken policy: says a request fits but never has room for it."""

    def __new__(cls):
        base = paged()
        base.admit = lambda seq_ids, token_ids, final_len: None
        return base


def test_a_step_that_can_do_nothing_raises_instead_of_spinning():
    from minipaged.serving.scheduler import NoProgressError

    s = Scheduler(_NoRoomPolicy(), SchedulerConfig(max_model_len=64))
    s.add_request("r0", [1, 2, 3], 4)
    with pytest.raises(NoProgressError, match=r"request 'r0' \(waiting, 1 sequence\(s\) of "
                                              r"\[3\] tokens.*16 of 16 blocks free"):
        s.schedule()


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


def test_update_checks_the_whole_step_before_changing_anything():
    """A bad result, a stale plan or a bad clock is refused and leaves every sequence as it
    was; the same plan cannot be applied twice."""
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    s.add_request("a", [1, 2, 3], 4)
    s.add_request("b", [1, 2], 4)
    out = s.schedule()
    before = [list(q.token_ids) for q in out.sampled]
    for result, now, err, match in (
            (StepResult(0.01, [1, "x"]), 0.1, TypeError, r"samples\[1\]='x'"),
            (StepResult(0.01, [1, -5]), 0.1, ValueError, r"samples\[1\]=-5"),
            (StepResult(0.01, [1, 1.5]), 0.1, TypeError, r"samples\[1\]=1.5"),
            (StepResult(0.01, [[1, 2], 1]), 0.1, ValueError, "takes one token id here"),
            (StepResult(0.01, 5), 0.1, ValueError, "must be a list, one entry for each"),
            (StepResult(0.01, [1, 2]), float("nan"), ValueError, "now=nan"),
            (None, 0.1, TypeError, "must be a StepResult")):
        with pytest.raises(err, match=match):
            s.update(out, result, now)
        assert [list(q.token_ids) for q in out.sampled] == before
    s.update(out, StepResult(0.01, [1, 2]), 0.1)
    with pytest.raises(ValueError, match="applied once"):
        s.update(out, StepResult(0.01, [1, 2]), 0.2)


def test_request_ids_are_unique_and_hashable_and_the_parts_typed():
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    s.add_request("r0", [1, 2, 3], 5)
    with pytest.raises(ValueError, match="request 'r0' was already added"):
        s.add_request("r0", [4, 5], 5)
    with pytest.raises(TypeError, match=r"request_id=\['x'\] must be hashable"):
        s.add_request(["x"], [1], 5)
    assert len(s.waiting) == 1
    with pytest.raises(TypeError, match="policy must be a MemoryPolicy"):
        Scheduler(None)
    with pytest.raises(TypeError, match="config must be a SchedulerConfig"):
        Scheduler(paged(), {"max_num_seqs": 2})
