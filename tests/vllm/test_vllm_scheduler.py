"""Scheduling: minipaged's Scheduler against vLLM v1's Scheduler, step by step.

Seeded request streams (tests/vllm/peer_traces.py, ``SCHED_FAMILIES``) go to both schedulers;
a stand-in model samples the same tokens on both sides (tests/vllm/peer_scheduler.py, which
also lists the settings matched and the one documented difference it normalises). After every
step: tokens scheduled per request (admission order, chunked-prefill chunk sizes, decodes),
preemption victims, the running queue and the waiting queue, in order.
"""

from __future__ import annotations

import pytest
from peer_traces import SCHED_FAMILIES, SCHED_SEEDS

pytestmark = pytest.mark.requires("vllm")

# A prompt's blocks become findable by hash only as its K/V are computed (or computed in this
# step), as in vLLM (vllm/v1/core/kv_cache_manager.py, allocate_slots caching computed blocks):
# the "prefix-cached" traces preempt requests in the middle of a chunked prefill to check it.


def _cases():
    for family in SCHED_FAMILIES:
        for seed in SCHED_SEEDS:
            yield pytest.param(family, seed, id=f"{family}-{seed}")


@pytest.fixture(scope="module")
def sched():
    import peer_scheduler

    return peer_scheduler


@pytest.mark.parametrize(("family", "seed"), list(_cases()))
def test_scheduler_matches_vllm(sched, record, family, seed):
    trace = SCHED_FAMILIES[family](seed)
    record("scheduler-stock", family, sched.run_sched_trace(trace, "stock"))  # figures only
    report = sched.run_sched_trace(trace)
    record("scheduler", family, report)
    assert report.ok, report.summary()


@pytest.mark.parametrize("seed", SCHED_SEEDS)
def test_without_memory_pressure_stock_vllm_agrees(sched, seed):
    """The normalisation is about when blocks are allocated, so it cannot matter while every
    allocation succeeds: with room for everything, stock vLLM agrees step for step."""
    report = sched.run_sched_trace(SCHED_FAMILIES["roomy"](seed), "stock")
    assert report.stats["preemptions"] == 0
    assert report.ok, report.summary()


def test_traces_reach_what_they_claim(sched):
    stats = {f: [sched.run_sched_trace(SCHED_FAMILIES[f](s)).stats for s in SCHED_SEEDS]
             for f in SCHED_FAMILIES}
    for family, per_seed in stats.items():
        assert sum(s["partial_prefill_chunks"] for s in per_seed) > 0, family
    for family in ("chunked", "tight-memory", "prefix-cached"):
        assert sum(s["preemptions"] for s in stats[family]) > 0, family


def test_comparison_catches_a_different_policy(sched, monkeypatch):
    """A minipaged scheduler that keeps one block free at admission (PagedPolicy's watermark,
    which vLLM's default turns off) or that cuts each prefill chunk one token short must
    diverge from vLLM."""
    from minipaged.serving import scheduler as mp_scheduler
    from minipaged.serving.memory_policy import PagedPolicy

    trace = SCHED_FAMILIES["tight-memory"](0)
    assert sched.run_sched_trace(trace).ok
    with monkeypatch.context() as m:
        m.setattr(PagedPolicy, "__init__", _with_watermark(PagedPolicy.__init__, 0.1))
        assert not sched.run_sched_trace(trace).ok
    with monkeypatch.context() as m:
        chunks = mp_scheduler.Scheduler._schedule_prefill_chunks
        m.setattr(mp_scheduler.Scheduler, "_schedule_prefill_chunks",
                  lambda self, out, budget: chunks(self, out, max(budget - 1, 0)))
        report = sched.run_sched_trace(SCHED_FAMILIES["chunked"](0))
        assert not report.ok and "scheduled_tokens" in report.divergences[0]


def _with_watermark(init, watermark):
    def patched(self, manager, **kwargs):
        init(self, manager, **{**kwargs, "watermark": watermark})
    return patched
