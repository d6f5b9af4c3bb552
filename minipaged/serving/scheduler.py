"""Iteration-level scheduling with preemption: who runs this step, and who gives up memory.

What this teaches (lesson 06; vLLM paper, section 4.5). A step admits waiting requests FCFS while
memory allows or, admitting none, gives every running sequence a slot for one more token (chunked
prefill: both); when one cannot, the newest group is preempted, all or nothing, by swapping or (the
default, and vLLM v1's only way: ``vllm/v1/core/sched/scheduler.py``) recomputing. Swapped groups
come back before new admissions. Chunked prefill (Sarathi, arXiv 2308.16369; vLLM's
``enable_chunked_prefill``) caps a step's tokens and splits long prompts over steps, decodes first.

Progress is a property: a request that could not finish even alone is refused up front
(``queues.py``; vLLM v0 checks the prompt only: ``vllm/core/scheduler.py``), so the oldest
group can always grow and finish; a group that could never be swapped back in is recomputed; a
step with nothing to do while requests remain raises ``NoProgressError``.

Invariants (tests/test_scheduler_stateful.py): every request is in exactly one place; each queue
is in arrival order and admission is FCFS; a preempted group resumes with its token streams; at
the end the cache is empty again.

Read next: ``sim/simulator.py``.
"""

from __future__ import annotations

import bisect
from operator import attrgetter

from minipaged.serving.memory_policy import MemoryPolicy

# The step's contract is imported from here by the engine, the simulator and the tests.
from minipaged.serving.queues import (  # noqa: F401
    RequestQueues,
    SchedulerConfig,
    SchedulerOutput,
    StepResult,
)
from minipaged.sharing.sequence import (
    RUNNING,
    SWAPPED,
    WAITING,
    PrefillChunk,
    Sequence,
    SequenceGroup,
)

# Every queue is kept in arrival order, with bisect.insort: a group that comes back (swapped in,
# or re-admitted after a recompute) is not always the newest.
BY_ARRIVAL = attrgetter("order")


class NoProgressError(RuntimeError):
    """A step that could run nothing while requests remain: a bug, reported instead of a hang."""


class Scheduler(RequestQueues):
    """FCFS continuous batching over a memory policy."""

    def __init__(self, policy: MemoryPolicy, config: SchedulerConfig | None = None) -> None:
        super().__init__(policy, config)
        self.num_preemptions = self.num_swapped_out = self.num_recomputed = 0

    def schedule(self) -> SchedulerOutput:
        if self._pending is not None:  # its slots are taken: a second plan would take more
            raise ValueError("schedule() again before update() applied the last step's output")
        out = SchedulerOutput()
        budget = self.config.token_budget
        if self.config.chunked_prefill:
            # One token budget: decodes (1 token each), prompt chunks, swapped groups, new prompts.
            budget -= self._schedule_running(out)
            budget = self._schedule_prefill_chunks(out, budget)
            # A step that had to preempt admits nothing: memory is short, and the victim (its
            # blocks now free, or cached) would otherwise be re-admitted in the same step.
            if not out.preempted:
                budget -= self._schedule_swapped(out)
                if not self.swapped:
                    self._schedule_admissions(out, budget)
        else:
            # vLLM v0's default: a step is either all prefills or all decodes; new prompts first.
            if not self.swapped:
                self._schedule_admissions(out, budget)
            if not out.prefills:
                self._schedule_running(out)
                if not out.preempted:
                    self._schedule_swapped(out)
        if out.is_empty and self.has_unfinished():
            raise NoProgressError(self.stall_report())
        out.blocks_to_copy = self.policy.take_copies()
        out.sampled = [c.seq for c in out.prefills if c.end == len(c.seq.token_ids)]
        out.sampled += out.decodes
        self._pending = out
        return out

    def _schedule_running(self, out: SchedulerOutput) -> int:
        """One slot per decoding sequence; returns the number of decodes."""
        ready = [s for g in self.running for s in g.seqs if not s.prefilling]
        if not self.policy.can_append([s.seq_id for s in ready]):
            return self._decode_by_group(out)
        # The usual step: room for every sequence at once, so each group's own check in
        # ``_decode_by_group`` would pass. Skipping them measured 20% off experiment 3 (budget
        # 10 s). tests/test_scheduler.py checks that both paths plan the same steps.
        for s in ready:
            self.policy.append_slot(s.seq_id, s.token_ids[-1])
        out.decodes += ready
        return len(out.decodes)

    def _decode_by_group(self, out: SchedulerOutput) -> int:
        """The general path: groups oldest first, each checked before it appends; while one
        does not fit, the newest group is preempted."""
        i = 0
        while i < len(self.running):
            g = self.running[i]
            ready = [s for s in g.seqs if not s.prefilling]
            ids = [s.seq_id for s in ready]
            while ids and not self.policy.can_append(ids):
                victim = self.running.pop()  # the newest group, possibly g itself
                self._preempt(victim, out)
                if victim is g:
                    return len(out.decodes)
            for s in ready:
                self.policy.append_slot(s.seq_id, s.token_ids[-1])
            out.decodes += ready
            i += 1
        return len(out.decodes)

    def _schedule_prefill_chunks(self, out: SchedulerOutput, budget: int) -> int:
        for g in self.running:
            for s in g.seqs:
                if s.prefilling and budget > 0:
                    end = min(len(s.token_ids), s.num_computed + budget)
                    budget -= self._add_chunk(out, s, end)
        return budget

    def _add_chunk(self, out: SchedulerOutput, s: Sequence, end: int) -> int:
        """Plan the K/V of ``s.token_ids[s.num_computed:end]``; returns its number of tokens."""
        out.prefills.append(PrefillChunk(s, s.num_computed, end))
        self.policy.computed(s.seq_id, end)
        out.num_prefill_tokens += end - s.num_computed
        return end - s.num_computed

    def _schedule_swapped(self, out: SchedulerOutput) -> int:
        """Bring swapped groups back, oldest first, while they fit with a slot each to grow.
        Returns the number of sequences brought back (each decodes this step)."""
        n = 0
        while self.swapped:
            g = self.swapped[0]
            ids = g.seq_ids
            if (self.num_running_seqs + len(ids) > self.config.max_num_seqs
                    or not self.policy.can_swap_in(ids)):
                break
            out.blocks_to_swap_in += self.policy.swap_in(ids)
            self.swapped.pop(0)
            g.status = RUNNING
            bisect.insort(self.running, g, key=BY_ARRIVAL)
            for s in g.seqs:
                self.policy.append_slot(s.seq_id, s.token_ids[-1])
            out.decodes += g.seqs
            n += len(ids)
        return n

    def _schedule_admissions(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting groups strictly in arrival order while memory and budgets allow."""
        chunked = self.config.chunked_prefill
        num_seqs = self.num_running_seqs
        # Without chunking a group may exceed the budget alone in its step (a recomputed
        # multi-sequence group re-prefills each of its sequences); with others, it waits.
        while self.waiting and (budget > 0 or (not chunked and not out.prefills)):
            g = self.waiting[0]
            if num_seqs + max(g.width, len(g.seqs)) > self.config.max_num_seqs:
                break
            if not chunked and sum(len(s.token_ids) for s in g.seqs) > budget and out.prefills:
                break
            cached = self.policy.admit(g.seq_ids, [s.token_ids for s in g.seqs], g.final_len)
            if cached is None:
                break
            self.waiting.popleft()
            g.status = RUNNING
            bisect.insort(self.running, g, key=BY_ARRIVAL)
            num_seqs += max(g.width, len(g.seqs))
            for s, c in zip(g.seqs, cached):
                s.num_computed, s.prefilling = c, True
                end = min(len(s.token_ids), c + budget) if chunked else len(s.token_ids)
                if end > c:
                    budget -= self._add_chunk(out, s, end)

    def _preempt(self, g: SequenceGroup, out: SchedulerOutput) -> None:
        """Evict a whole group. Swap when asked to, or always for a multi-sequence group (its
        sharing a recompute would lose; vLLM v0's ``_preempt``, ``vllm/core/scheduler.py``), if
        the policy can; else recompute."""
        self.num_preemptions += 1
        g.num_preemptions += 1
        ids = g.seq_ids
        want_swap = self.config.preemption_mode == "swap" or len(ids) > 1
        if want_swap and not any(s.prefilling for s in g.seqs) and self.policy.can_swap_out(ids):
            mapping = self.policy.swap_out(ids)
            if self.policy.can_ever_swap_in(ids):
                out.blocks_to_swap_out += mapping
                g.status = SWAPPED
                bisect.insort(self.swapped, g, key=BY_ARRIVAL)
                out.preempted.append((g, "swap"))
                self.num_swapped_out += 1
                return
            # Its blocks plus a slot per sequence exceed the whole pool: swapped out, it would
            # wait forever. Drop the CPU copy (nothing was copied yet) and recompute instead.
        for s in g.seqs:
            self.policy.free(s.seq_id)
            s.num_computed, s.prefilling = 0, True
        g.status = WAITING
        bisect.insort(self.waiting, g, key=BY_ARRIVAL)  # back at its arrival position
        out.preempted.append((g, "recompute"))
        self.num_recomputed += 1

    def stall_report(self) -> str:
        """Who cannot run and the numbers: for a ``NoProgressError``."""
        g = (self.swapped or list(self.waiting) or self.running)[0]
        lens = [len(s.token_ids) for s in g.seqs]
        return (f"no progress: request {g.request_id!r} ({g.status}, {len(lens)} sequence(s) "
                f"of {lens} tokens, final length {g.final_len}) cannot run; groups running "
                f"{len(self.running)}, waiting {len(self.waiting)}, swapped {len(self.swapped)};"
                f" memory: {self.policy.describe()}")
