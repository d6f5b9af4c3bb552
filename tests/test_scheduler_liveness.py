"""Nothing hangs: every run of the scheduler ends, within a bound derived from its work.

Why the bound holds (the argument the scheduler module docstring sketches):
    * every step computes at least one token (a prefill chunk or a decode) or preempts at least
      one group, else ``schedule()`` raises NoProgressError;
    * a group of width w (n samples or k beams) with prompt P and output O computes at most
      W = w * (P + O) tokens per admission, and it is admitted once plus once per recompute;
    * so steps <= sum over groups of W * (1 + preemptions) + total preemptions;
    * a group is preempted only in a step in which an older group computes a token (the
      victim is the newest running group, and a group alone always fits, or it would have been
      refused up front), so a group's preemptions are at most the work of the groups older
      than it: the oldest request is never preempted.
The runs are random: pool sizes (some too small for some requests, which must then be refused
up front with the reason), CPU pools (none, tiny, large: a swap that could never come back is
recomputed), paged with or without prefix caching and the three Orca policies, n, beam widths,
chunked prefill, both preemption modes and arrival steps.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from minipaged._checks import cdiv
from minipaged.serving.memory_policy import PagedPolicy, make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig
from minipaged.sharing.sequence import FINISHED, REJECTED
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import SimExecutor
from minipaged.sim.memory import preset

MAX_LEN = 48
COST = CostModel.for_preset(preset("opt-13b"))
HARD_CAP = 50_000  # steps: only so that a broken scheduler fails the test instead of hanging it

requests = st.lists(st.tuples(st.integers(0, 12),      # arrival step
                              st.integers(1, 20),      # prompt length
                              st.integers(1, 20),      # output length
                              st.integers(1, 3),       # width
                              st.booleans()),          # beam search (else parallel sampling)
                    min_size=1, max_size=10)


@st.composite
def schedulers(draw):
    kind = draw(st.sampled_from(["paged", "paged", "prefix", "orca-max", "orca-pow2",
                                 "orca-oracle"]))
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    if kind in ("paged", "prefix"):
        slots = cdiv(draw(st.integers(4, 80)), bs) * bs  # tight: preemption is the point
        cpu = draw(st.sampled_from([0, 1, 3, 40]))
    else:
        slots, cpu = draw(st.integers(64, 300)), 0  # room for a buddy block of 64 >= MAX_LEN
    policy = make_policy("paged" if kind == "prefix" else kind, num_slots=slots, block_size=bs,
                         max_seq_len=MAX_LEN, num_cpu_blocks=cpu,
                         enable_prefix_caching=kind == "prefix",
                         watermark=draw(st.sampled_from([0.0, 0.01, 0.1])))
    chunked = draw(st.booleans())
    config = SchedulerConfig(max_num_seqs=draw(st.integers(1, 8)), max_model_len=MAX_LEN,
                             chunked_prefill=chunked,
                             max_num_batched_tokens=draw(st.integers(1, 40)) if chunked else None,
                             preemption_mode=draw(st.sampled_from(["recompute", "swap"])))
    sharing = kind == "paged"  # copy-on-write forks: the paged policy without prefix caching
    return Scheduler(policy, config), sharing


def run(sched: Scheduler, reqs, sharing: bool) -> tuple[list, int]:
    """Add each request at its arrival step (an idle scheduler jumps to the next one) and
    step until everything is done. Returns the groups, in arrival order, and the steps run."""
    paged = isinstance(sched.policy, PagedPolicy)
    ex = SimExecutor(COST, 1024, seed=3, block_size=sched.policy.block_size if paged else None)
    pending = sorted(reqs, key=lambda r: r[0])
    groups, step, steps_run = [], 0, 0
    while pending or sched.has_unfinished():
        if not sched.has_unfinished():
            step = max(step, pending[0][0])
        while pending and pending[0][0] <= step:
            arrival, p, o, width, beam = pending.pop(0)
            width = width if sharing else 1
            n, k = (1, width) if beam else (width, 1)
            prompt = [(len(groups) * 13 + i) % 97 + 1 for i in range(p)]
            groups.append(sched.add_request(len(groups), prompt, o, arrival_s=float(step),
                                            n=n, beam_width=k))
        if sched.has_unfinished():
            out = sched.schedule()  # raises NoProgressError on a step that would do nothing
            sched.update(out, ex.execute(out), float(step))
            steps_run += 1
            assert steps_run < HARD_CAP, "the scheduler does not terminate"
        step += 1
    return groups, steps_run


@given(schedulers(), requests)
@settings(max_examples=150, deadline=None)
def test_every_run_terminates_within_a_bound_derived_from_its_work(sched_sharing, reqs):
    sched, sharing = sched_sharing
    groups, steps = run(sched, reqs, sharing)
    work = [g.width * (g.prompt_len + g.output_len) for g in groups]
    pre = [g.num_preemptions for g in groups]
    assert steps <= sum(w * (1 + p) for w, p in zip(work, pre)) + sum(pre), (steps, work, pre)
    for i, g in enumerate(groups):
        older = sum(w * (1 + p) for w, p in zip(work[:i], pre[:i]))
        assert g.num_preemptions <= older, (i, g.num_preemptions, older)
    policy = sched.policy
    for g in groups:
        if g.status == REJECTED:
            reason = sched.rejections[g.order]
            assert reason.startswith(f"request {g.request_id!r} "), reason
            if isinstance(policy, PagedPolicy):  # refused only when it could not run alone
                worst = g.width * cdiv(g.final_len, policy.block_size)
                room = policy.manager.num_blocks - policy.watermark_blocks
                assert worst > room or g.width > sched.config.max_num_seqs, reason
        else:
            assert g.status == FINISHED and g.finish_s is not None
            assert len(g.outputs) == g.width
            assert all(len(t) == g.prompt_len + g.output_len for t in g.outputs)
    assert policy.blocks_in_use() == 0, "memory leaked"
    assert not sched.has_unfinished()
