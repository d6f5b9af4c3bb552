"""The scheduler under bad input: requests, configs, step results and policies it refuses, each
with the reason, before changing anything; a request too big for the cache is rejected up
front, not waited for, and a step that can do nothing raises instead of spinning."""

from __future__ import annotations

import numpy as np
import pytest
from scheduler_helpers import paged, run

from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig, StepResult


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


def test_a_request_too_big_for_the_cache_is_rejected_not_waited_for():
    s = Scheduler(paged(num_blocks=4, block_size=2), SchedulerConfig(max_model_len=64))
    s.add_request(0, [1] * 20, 2)
    s.add_request(1, [1] * 2, 2)
    run(s)
    assert [g.request_id for g in s.rejected] == [0]
    assert [g.request_id for g in s.finished] == [1]


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


def test_samples_that_empty_a_group_or_overgrow_it_change_nothing():
    """Dropping every beam raised after the beams were freed; more samples than the width was
    accepted (and broke the admission check, which counts width sequences)."""
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    g = s.add_request("r", [1, 2, 3, 4, 5], 4, beam_width=2)
    out = s.schedule()
    s.update(out, StepResult(0.1, [[7, 8]]), 0.1)
    out = s.schedule()
    m, before = s.policy.manager, [list(q.token_ids) for q in g.seqs]
    tables = {q: m.block_table(q) for q in g.seq_ids}
    for samples, k in (([[], []], 0), ([[1, 2], [3]], 3)):
        with pytest.raises(ValueError, match=f"leave request 'r' with {k} sequences; expected "
                                             "1 to its width, 2"):
            s.update(out, StepResult(0.1, samples), 0.2)
        assert [list(q.token_ids) for q in g.seqs] == before
        assert {q: m.block_table(q) for q in g.seq_ids} == tables
    s.update(out, StepResult(0.1, [[], [np.int64(3), 4]]), 0.2)
    assert len(g.seqs) == 2 and all(type(t) is int for q in g.seqs for t in q.token_ids)


def test_a_second_plan_before_update_is_refused():
    """It took every decode's slot again: the manager held a token the sequence did not."""
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    s.add_request("a", [1, 2, 3], 6)
    s.update(s.schedule(), StepResult(0.1, [7]), 0.1)
    out = s.schedule()
    with pytest.raises(ValueError, match=r"schedule\(\) again before update\(\)"):
        s.schedule()
    assert s.policy.manager.seq_len(0) == 4
    s.update(out, StepResult(0.1, [np.int32(8)]), 0.2)
    # the manager holds the tokens with K/V slots: all but the newest
    assert s.running[0].seqs[0].token_ids[:-1] == [1, 2, 3, 7] == s.policy.manager.token_ids(0)


def test_finish_seq_checks_its_arguments_and_the_step():
    """A pending step's update() appended to the freed sequence's output; a string was a bare
    AttributeError and a bad clock was stored as the finish time; True was request 1."""
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    g = s.add_request("a", [1, 2, 3], 6)
    s.update(s.schedule(), StepResult(0.1, [7]), 0.1)
    seq = g.seqs[0]
    out = s.schedule()
    with pytest.raises(ValueError, match=r"between schedule\(\) and update\(\)"):
        s.finish_seq(seq, 0.2)
    s.update(out, StepResult(0.1, [8]), 0.2)
    with pytest.raises(ValueError, match="'x' is not a running sequence"):
        s.finish_seq("x", 0.3)
    with pytest.raises(TypeError, match="now='t' must be a number"):
        s.finish_seq(seq, "t")
    assert g.status == "running" and s.finish_seq(seq, 0.3)
    assert g.outputs == [[1, 2, 3, 7, 8]] and g.finish_s == 0.3
    with pytest.raises(TypeError, match="request_id=True must not be a bool"):
        s.add_request(True, [1], 4)


def test_the_clock_never_goes_back():
    # A step applied at an earlier time than the last one gave negative latencies.
    s = Scheduler(paged(), SchedulerConfig(max_model_len=64))
    g = s.add_request("a", [1, 2, 3], 6)
    s.update(s.schedule(), StepResult(0.1, [7]), 0.5)
    out = s.schedule()
    with pytest.raises(ValueError, match=r"now=0.2 is out of range: expected >= 0.5"):
        s.update(out, StepResult(0.1, [8]), 0.2)
    s.update(out, StepResult(0.1, [8]), 0.5)
    assert g.seqs[0].token_ids == [1, 2, 3, 7, 8]
    with pytest.raises(ValueError, match=r"now=0.2 is out of range: expected >= 0.5"):
        s.finish_seq(g.seqs[0], 0.2)
