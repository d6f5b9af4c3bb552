"""The scheduler's promises, checked under random arrivals, memory sizes and policies.

Invariants (the scheduler module docstring states them; each is asserted below):
    0. preemption takes the most recently arrived running group first;
    1. every request is in exactly one place: waiting, running, swapped, finished or rejected;
    2. waiting, running and swapped are each in arrival order, and admission is FCFS: the
       requests ever admitted (or rejected) are always a prefix of the arrival order;
    3. the memory manager agrees with the scheduler: each running sequence holds exactly its
       tokens (all of them while prefilling, all but the just-sampled one while decoding), a
       swapped sequence is swapped in the manager, and the manager's own invariants hold;
    4. after everything has run, every request finished with exactly the token streams a run
       without any memory pressure produces (preemption by swap or recompute loses nothing),
       and the cache is empty again.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from invariants import check_invariants

from minipaged.serving.memory_policy import ContiguousPolicy, PagedPolicy, make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig
from minipaged.sharing.sequence import FINISHED, REJECTED, RUNNING, SWAPPED, WAITING
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import VOCAB, SimExecutor
from minipaged.sim.memory import preset

MAX_LEN = 32
COST = CostModel.for_preset(preset("opt-13b"))


def expected_streams(prompt: list[int], n: int, output_len: int) -> list[list[int]]:
    """What SimExecutor produces for a greedy / parallel-sampling request with no pressure."""
    def nxt(toks):
        return (toks[-1] * 1103515245 + len(toks) * 12345 + 1) % VOCAB + 1
    first = nxt(prompt)
    heads = [first] if n == 1 else [(first + j * 7919) % VOCAB + 1 for j in range(n)]
    outs = []
    for h in heads:
        toks = prompt + [h]
        while len(toks) - len(prompt) < output_len:
            toks.append(nxt(toks))
        outs.append(toks)
    return sorted(outs)


class SchedulerMachine(RuleBasedStateMachine):
    KINDS = ("paged",)

    @initialize(kind_index=st.integers(0, 2), block_size=st.sampled_from([1, 2, 4, 8]),
                extra=st.integers(0, 4), mode=st.sampled_from(["recompute", "swap"]),
                chunked=st.booleans(), budget=st.integers(4, 40),
                max_num_seqs=st.integers(6, 32), prefix=st.booleans())
    def setup(self, kind_index, block_size, extra, mode, chunked, budget, max_num_seqs, prefix):
        kind = self.KINDS[kind_index % len(self.KINDS)]
        self.paged = kind == "paged"
        self.prefix = prefix and self.paged  # prefix caching (vLLM v1): no fork, so width 1
        self.width_max = 3 if self.paged and not self.prefix else 1
        if self.paged:
            # Room for the widest group at full length, so no group can starve itself.
            need = self.width_max * (-(-MAX_LEN // block_size) + 1) + 2
            slots = (need + extra) * block_size
        else:
            slots = MAX_LEN + extra * 8
        self.policy = make_policy(kind, num_slots=slots, block_size=block_size,
                                  max_seq_len=MAX_LEN, num_cpu_blocks=4 * slots,
                                  enable_prefix_caching=self.prefix,
                                  watermark=0.0 if not self.paged else 0.01)
        self.sched = Scheduler(self.policy, SchedulerConfig(
            max_num_seqs=max(max_num_seqs, self.width_max), max_model_len=MAX_LEN,
            chunked_prefill=chunked, max_num_batched_tokens=budget if chunked else None,
            preemption_mode=mode))
        self.ex = SimExecutor(COST, 1024, seed=1, block_size=block_size if self.paged else None)
        self.groups = []
        self.prompts = {}
        self.now = 0.0
        self.steps = 0

    @rule(prompt_len=st.integers(1, 14), output_len=st.integers(1, 14),
          width=st.integers(1, 3), beam=st.booleans(), shared=st.booleans())
    def add_request(self, prompt_len, output_len, width, beam, shared=False):
        if self.width_max == 1:
            width = 1
        rid = len(self.groups)
        # Shared prompts start alike (prefix-cache hits); the others differ from token 0.
        prompt = [(i if shared else rid * 7 + i) % 50 + 1 for i in range(prompt_len)]
        n, k = (1, width) if beam else (width, 1)
        g = self.sched.add_request(rid, prompt, output_len, arrival_s=self.now, n=n,
                                   beam_width=k)
        self.groups.append(g)
        self.prompts[rid] = prompt

    @rule(lens=st.lists(st.tuples(st.integers(1, 14), st.integers(4, 14)), min_size=3,
                        max_size=8))
    def add_burst(self, lens):
        """Several single-sequence requests at once: the usual way memory runs out."""
        for p, o in lens:
            self.add_request(p, o, 1, False)

    @precondition(lambda self: self.sched.has_unfinished())
    @rule()
    def step(self):
        out = self.sched.schedule()
        for g, _mode in out.preempted:  # the victim is always the most recently arrived
            assert all(r.order < g.order for r in self.sched.running), (
                f"preempted request {g.request_id} while newer ones keep running")
        res = self.ex.execute(out)
        self.now += res.duration_s
        self.sched.update(out, res, self.now)
        self.steps += 1

    @invariant()
    def one_place_each(self):
        s = self.sched
        places = {WAITING: list(s.waiting), RUNNING: s.running, SWAPPED: s.swapped,
                  FINISHED: s.finished, REJECTED: s.rejected}
        seen = {}
        for status, gs in places.items():
            for g in gs:
                assert id(g) not in seen, f"request {g.request_id} is in two places"
                seen[id(g)] = status
                assert g.status == status, f"request {g.request_id}: {g.status} vs {status}"
        assert len(seen) == len(self.groups), "a request was lost"

    @invariant()
    def arrival_order_and_fcfs(self):
        s = self.sched
        for gs in (list(s.waiting), s.running, s.swapped):
            orders = [g.order for g in gs]
            assert orders == sorted(orders), f"out of arrival order: {orders}"
        # A request leaves the waiting queue only by admission (a rejected one never enters
        # it); a preempted one comes back but was admitted before. So the requests ever
        # admitted must be a prefix of the arrivals that were not rejected.
        queued = [g.order for g in self.groups if g.status != REJECTED]
        ever = {g.order for g in self.groups if g.status != REJECTED and (
            g.status != WAITING or g.num_preemptions or g.first_token_s is not None)}
        assert ever == set(queued[:len(ever)]), f"admission not FCFS: {sorted(ever)}"

    @invariant()
    def memory_agrees(self):
        if not self.paged:
            c = self.policy.cache
            live = {s.seq_id for g in self.sched.running for s in g.seqs}
            assert set(c.seq_ids) == live
            for g in self.sched.running:
                for s in g.seqs:
                    want = len(s.token_ids) - (0 if s.prefilling else 1)
                    assert c.seq_len(s.seq_id) == want
            return
        m = self.policy.manager
        check_invariants(m)
        live = set()
        for g in self.sched.running:
            for s in g.seqs:
                live.add(s.seq_id)
                want = len(s.token_ids) - (0 if s.prefilling else 1)
                assert m.token_ids(s.seq_id) == s.token_ids[:want], f"seq {s.seq_id} differs"
                assert not m.is_swapped(s.seq_id)
        for g in self.sched.swapped:
            for s in g.seqs:
                live.add(s.seq_id)
                assert m.is_swapped(s.seq_id)
        assert set(m.seq_ids) == live, "the manager holds a sequence the scheduler forgot"

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        guard = 0
        while self.sched.has_unfinished():
            self.step()
            guard += 1
            assert guard < 20000, "the scheduler made no progress (livelock)"
            if guard % 50 == 0:
                self.memory_agrees()
        self.one_place_each()
        assert not self.sched.rejected, "a request that fits was rejected"
        # Progress within a bound derived from the work (tests/test_scheduler_liveness.py
        # explains it): every step computes a token or preempts a group.
        work = [max(g.n, g.beam_width) * (g.prompt_len + g.output_len) for g in self.groups]
        pre = [g.num_preemptions for g in self.groups]
        assert self.steps <= sum(w * (1 + p) for w, p in zip(work, pre)) + sum(pre)
        for g in self.groups:
            assert g.status == FINISHED
            if g.beam_width == 1:
                assert sorted(g.outputs) == expected_streams(self.prompts[g.request_id], g.n,
                                                             g.output_len), (
                    f"request {g.request_id}: token streams changed by preemption")
            else:
                assert len(g.outputs) == g.beam_width
                assert all(len(o) == g.prompt_len + g.output_len for o in g.outputs)
        if isinstance(self.policy, PagedPolicy):
            m = self.policy.manager
            assert m.num_free_blocks == m.num_blocks and not m.seq_ids, "blocks leaked"
        else:
            assert isinstance(self.policy, ContiguousPolicy)
            assert self.policy.cache.num_free == self.policy.cache.num_slots


class ContiguousSchedulerMachine(SchedulerMachine):
    KINDS = ("orca-max", "orca-pow2", "orca-oracle")


_settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
SchedulerMachine.TestCase.settings = _settings
ContiguousSchedulerMachine.TestCase.settings = _settings
TestPagedScheduler = SchedulerMachine.TestCase
TestContiguousScheduler = ContiguousSchedulerMachine.TestCase
