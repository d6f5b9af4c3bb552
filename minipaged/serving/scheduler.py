"""Iteration-level scheduling with preemption: who runs this step, and who gives up memory.

What this teaches: vLLM's scheduler (paper section 4.5). Every step (one forward pass) it
    1. admits waiting requests first-come-first-served while memory allows, keeping a small
       watermark of free blocks (continuous batching: requests join between steps, not batches);
    2. gives every running sequence a slot for one more token (one decode step each);
    3. when a running sequence cannot get a slot, *preempts* the most recently arrived sequence
       group, all or nothing: all samples / beams of one request share blocks, so evicting part
       of a group frees little. Preemption either **swaps** the group's blocks to a CPU pool or
       drops them to **recompute** the tokens later as one prefill (the default, as in recent
       vLLM); swapped groups come back before any new admission.
Optional chunked prefill caps the tokens of one step (``max_num_batched_tokens``) and splits long
prompts over several steps, decodes first.

The scheduler knows nothing of GPUs or cost models. ``schedule()`` returns a ``SchedulerOutput``
(what to compute: prefill chunks as token ranges, decodes, blocks to copy / swap, preempted
groups); an *executor* runs it (the simulator's cost model, or a real model) and returns a
``StepResult`` (how long it took, the sampled tokens); ``update()`` applies the result. Memory
comes through a ``memory_policy.MemoryPolicy``: paged blocks or an Orca-style contiguous cache.
Read before: ``memory_policy.py``, ``sequence.py``. Read next: ``sim/simulator.py``.

Vocabulary. A *sequence* is one token stream; a *sequence group* is one request (n parallel
samples or k beams are n or k sequences sharing the prompt). A sequence's ``token_ids`` are the
prompt plus every sampled token; ``num_computed`` of them have K/V in the cache. In the decode
state the last token is the one just sampled: the step computes its K/V and samples the next.

Invariants (asserted by tests/test_scheduler_stateful.py):
    * every request is in exactly one place: waiting, running, swapped, finished or rejected;
    * running, swapped and waiting groups are each in arrival order, and admission is FCFS:
      no group is admitted before an earlier-arrived group that is still waiting;
    * a preempted group resumes with exactly its token streams (recomputed or swapped back);
    * once everything has finished, the cache is empty again.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from minipaged.serving.memory_policy import MemoryPolicy

# Re-exported: the engine, the simulator and the tests import these names from here too.
from minipaged.sharing.sequence import (  # noqa: F401
    FINISHED,
    REJECTED,
    RUNNING,
    SWAPPED,
    WAITING,
    PrefillChunk,
    Sequence,
    SequenceGroup,
    _order,
)


@dataclass
class SchedulerOutput:
    """One step's plan. Apply data movement in this order: swap-outs, swap-ins, copies (CoW),
    then write the step's new K/V. ``sampled`` lists the sequences that get new tokens, in the
    order ``StepResult.samples`` must follow: finishing prefill chunks first, then decodes."""

    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)  # each computes its last token
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[tuple[SequenceGroup, str]] = field(default_factory=list)  # (group, mode)
    sampled: list[Sequence] = field(default_factory=list)
    num_prefill_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + len(self.decodes)

    @property
    def is_empty(self) -> bool:
        return not (self.prefills or self.decodes or self.blocks_to_swap_out)


@dataclass
class StepResult:
    """What the executor reports. ``samples[i]`` is for ``out.sampled[i]``: an int (the next
    token), or a list of tokens, one per child: the sequence continues with the first, each
    further one forks it (parallel sampling, beam search), an empty list drops it (a beam that
    lost)."""

    duration_s: float
    samples: list


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: max(max_model_len, 2048); 512 chunked
    max_model_len: int = 2048
    chunked_prefill: bool = False
    preemption_mode: str = "recompute"  # or "swap"
    keep_outputs: bool = True  # False: finished token streams are dropped (long simulations)

    def __post_init__(self) -> None:
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode={self.preemption_mode!r} must be 'recompute' "
                             f"or 'swap'")
        for f in ("max_num_seqs", "max_model_len"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"{f}={getattr(self, f)!r} must be an int >= 1")
        b = self.token_budget
        if not self.chunked_prefill and b < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens={b} must be >= max_model_len="
                             f"{self.max_model_len} without chunked prefill (a whole prompt "
                             f"is one step)")
        if b < 1:
            raise ValueError(f"max_num_batched_tokens={b} must be >= 1")

    @property
    def token_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 512 if self.chunked_prefill else max(self.max_model_len, 2048)


class Scheduler:
    """FCFS continuous batching over a memory policy. See the module docstring."""

    def __init__(self, policy: MemoryPolicy, config: SchedulerConfig | None = None) -> None:
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.finished: list[SequenceGroup] = []
        self.rejected: list[SequenceGroup] = []
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_recomputed = 0
        self._next_seq_id = 0
        self._next_order = 0
        self._oom = policy.oom_error

    # ---- requests --------------------------------------------------------------------------
    def add_request(self, request_id, prompt_token_ids: list[int], output_len: int, *,
                    arrival_s: float = 0.0, n: int = 1, beam_width: int = 1) -> SequenceGroup:
        prompt = list(prompt_token_ids)
        if not prompt:
            raise ValueError(f"request {request_id!r}: prompt_token_ids is empty")
        if not isinstance(output_len, int) or output_len < 1:
            raise ValueError(f"request {request_id!r}: output_len={output_len!r} must be an "
                             f"int >= 1")
        if len(prompt) + output_len > self.config.max_model_len:
            raise ValueError(f"request {request_id!r}: prompt_len={len(prompt)} + output_len="
                             f"{output_len} exceeds max_model_len={self.config.max_model_len}")
        if n < 1 or beam_width < 1 or (n > 1 and beam_width > 1):
            raise ValueError(f"request {request_id!r}: n={n}, beam_width={beam_width}: both "
                             f">= 1 and at most one of them > 1")
        if (n > 1 or beam_width > 1) and not self.policy.supports_sharing:
            self.policy.fork(0, 1)  # raises the policy's own explanation
        if self.waiting and arrival_s < self.waiting[-1].arrival_s:
            raise ValueError(f"request {request_id!r}: arrival_s={arrival_s} is before the "
                             f"last waiting request's {self.waiting[-1].arrival_s}: add "
                             f"requests in arrival order")
        g = SequenceGroup(request_id, self._next_order, arrival_s, len(prompt), output_len,
                          n, beam_width)
        self._next_order += 1
        g.seqs.append(self._new_seq(g, prompt))
        self.waiting.append(g)
        return g

    def _new_seq(self, g: SequenceGroup, token_ids: list[int]) -> Sequence:
        s = Sequence(self._next_seq_id, g, token_ids)
        self._next_seq_id += 1
        return s

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_running_seqs(self) -> int:
        return sum([len(g.seqs) for g in self.running])

    # ---- schedule --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.token_budget
        if self.config.chunked_prefill:
            # Decodes first (1 token each), then unfinished prompt chunks, then swapped groups,
            # then new prompts, all within one token budget.
            budget -= self._schedule_running(out)
            budget = self._schedule_prefill_chunks(out, budget)
            # A step that had to preempt admits nothing: memory is short, and the victim (its
            # blocks now free, or cached) would otherwise be re-admitted in the same step.
            if not out.preempted:
                budget -= self._schedule_swapped(out)
                if not self.swapped:
                    self._schedule_admissions(out, budget)
        else:
            # vLLM v0's default: a step is either all prefills or all decodes; new prompts win,
            # unless a group is swapped out (it comes back before anything new is admitted).
            if not self.swapped:
                self._schedule_admissions(out, budget)
            if not out.prefills:
                self._schedule_running(out)
                if not out.preempted:
                    self._schedule_swapped(out)
        out.blocks_to_copy = self.policy.take_copies()
        out.sampled = [c.seq for c in out.prefills if c.end == len(c.seq.token_ids)]
        out.sampled += out.decodes
        return out

    def _schedule_running(self, out: SchedulerOutput) -> int:
        """One slot per decoding sequence, oldest group first; preempt the newest when full."""
        running = self.running
        i, n = 0, len(running)  # groups [i, n) are still to serve; victims come off the end
        append, oom, decodes = self.policy.append_slot, self._oom, out.decodes
        while i < n:
            g = running[i]
            i += 1
            seqs = g.seqs
            if len(seqs) == 1:  # the common case, kept lean: it runs once per token
                s = seqs[0]
                if s.prefilling:
                    continue
                while True:
                    try:
                        append(s.seq_id, s.token_ids[-1])
                        break
                    except oom:
                        n -= 1
                        self._preempt(running[n], out)
                        if n < i:  # it was this group itself: nothing left to preempt
                            break
                if n >= i:
                    decodes.append(s)
            else:  # all or nothing for the group: check before appending any
                ready = [s for s in seqs if not s.prefilling]
                ids = [s.seq_id for s in ready]
                while ids and n >= i and not self.policy.can_append(ids):
                    n -= 1
                    self._preempt(running[n], out)
                if n >= i:
                    for s in ready:
                        append(s.seq_id, s.token_ids[-1])
                    decodes.extend(ready)
        self.running = running[:n]
        return len(decodes)

    def _schedule_prefill_chunks(self, out: SchedulerOutput, budget: int) -> int:
        for g in self.running:
            for s in g.seqs:
                if s.prefilling and budget > 0:
                    end = min(len(s.token_ids), s.num_computed + budget)
                    out.prefills.append(PrefillChunk(s, s.num_computed, end))
                    out.num_prefill_tokens += end - s.num_computed
                    budget -= end - s.num_computed
        return budget

    def _schedule_swapped(self, out: SchedulerOutput) -> int:
        """Bring swapped groups back, oldest first, while they fit with a slot each to grow."""
        n = 0
        while self.swapped:
            g = self.swapped[0]
            ids = [s.seq_id for s in g.seqs]
            if (self.num_running_seqs + len(ids) > self.config.max_num_seqs
                    or not self.policy.can_swap_in(ids)):
                break
            out.blocks_to_swap_in += self.policy.swap_in(ids)
            self.swapped.pop(0)
            g.status = RUNNING
            # Not always newest: a recomputed older group may have been re-admitted meanwhile.
            bisect.insort(self.running, g, key=_order)
            for s in g.seqs:
                self.policy.append_slot(s.seq_id, s.token_ids[-1])
            out.decodes.extend(g.seqs)
            n += len(ids)
        return n

    def _schedule_admissions(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting groups strictly in arrival order while memory and budgets allow."""
        chunked = self.config.chunked_prefill
        num_seqs = self.num_running_seqs
        # Without chunking, a group larger than the budget may still run alone in its step.
        while self.waiting and (budget > 0 or (not chunked and not out.prefills)):
            g = self.waiting[0]
            lens = [len(s.token_ids) for s in g.seqs]
            if not self.policy.fits_ever(lens, g.final_len):
                # Could never fit, even in an empty cache: refuse it rather than wait forever.
                self.waiting.popleft()
                g.status = REJECTED
                self.rejected.append(g)
                continue
            if num_seqs + max(g.width, len(g.seqs)) > self.config.max_num_seqs:
                break
            if not chunked and sum(lens) > budget and out.prefills:
                # Over budget: wait for a step of its own. (Alone it may exceed the budget:
                # a recomputed multi-sequence group re-prefills each of its sequences.)
                break
            cached = self.policy.admit([s.seq_id for s in g.seqs],
                                       [s.token_ids for s in g.seqs], g.final_len)
            if cached is None:
                break
            self.waiting.popleft()
            g.status = RUNNING
            if self.running and self.running[-1].order > g.order:
                bisect.insort(self.running, g, key=_order)  # re-admitted after a recompute
            else:
                self.running.append(g)
            num_seqs += max(g.width, len(g.seqs))
            for s, c in zip(g.seqs, cached):
                s.num_computed, s.prefilling = c, True
                end = min(len(s.token_ids), c + budget) if chunked else len(s.token_ids)
                if end > c:
                    out.prefills.append(PrefillChunk(s, c, end))
                    out.num_prefill_tokens += end - c
                    budget -= end - c

    def _preempt(self, g: SequenceGroup, out: SchedulerOutput) -> None:
        """Evict a whole group. Swap when asked to (and always for a multi-sequence group, whose
        sharing a recompute would lose, as vLLM v0 does) if the policy can; else recompute."""
        self.num_preemptions += 1
        g.num_preemptions += 1
        ids = [s.seq_id for s in g.seqs]
        want_swap = self.config.preemption_mode == "swap" or len(ids) > 1
        if (want_swap and self.policy.supports_swap and not any(s.prefilling for s in g.seqs)
                and self.policy.can_swap_out(ids)):
            out.blocks_to_swap_out += self.policy.swap_out(ids)
            g.status = SWAPPED
            bisect.insort(self.swapped, g, key=_order)
            out.preempted.append((g, "swap"))
            self.num_swapped_out += 1
        else:
            for s in g.seqs:
                self.policy.free(s.seq_id)
                s.num_computed, s.prefilling = 0, True
            g.status = WAITING
            i = 0  # back into the waiting queue at its arrival position (near the front)
            while i < len(self.waiting) and self.waiting[i].order < g.order:
                i += 1
            self.waiting.insert(i, g)
            out.preempted.append((g, "recompute"))
            self.num_recomputed += 1

    # ---- update ----------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, result: StepResult, now: float) -> list[SequenceGroup]:
        """Apply a step's results at time ``now``; returns the groups that finished."""
        sampled, samples = out.sampled, result.samples
        if len(samples) != len(sampled):
            raise ValueError(f"StepResult.samples has {len(samples)} entries for "
                             f"{len(sampled)} sampled sequences")
        for c in out.prefills:
            s = c.seq
            s.num_computed = c.end
            if c.end == len(s.token_ids):
                s.prefilling = False
                if s.group.first_token_s is None:
                    s.group.first_token_s = now
        finished: list[Sequence] = []
        for s, toks in zip(sampled, samples):
            tl = s.token_ids
            s.num_computed = len(tl)  # the step computed every token the sequence had
            if type(toks) is int:     # the common case: one new token
                tl.append(toks)
                if len(tl) >= s.stop_len:
                    finished.append(s)
                continue
            g = s.group
            if not toks:  # a beam that lost: its blocks go (shared ones lose one user)
                self.policy.free(s.seq_id)
                g.seqs.remove(s)
                if not g.seqs:
                    raise ValueError(f"request {g.request_id!r}: every sequence was dropped")
                continue
            for t in toks[1:]:  # parallel sampling / beam search: children share the blocks
                child = self._new_seq(g, tl + [t])
                child.num_computed, child.prefilling = len(tl), False
                self.policy.fork(s.seq_id, child.seq_id)
                g.seqs.append(child)
                if len(child.token_ids) >= child.stop_len:
                    finished.append(child)
            tl.append(toks[0])
            if len(tl) >= s.stop_len:
                finished.append(s)
        done = [s.group for s in finished if self._end_seq(s, now)]
        if done:
            self.running = [g for g in self.running if g.status == RUNNING]
            self.finished.extend(done)
        return done

    def _end_seq(self, s: Sequence, now: float) -> bool:
        g = s.group
        self.policy.free(s.seq_id)
        g.seqs.remove(s)
        if self.config.keep_outputs:
            g.outputs.append(s.token_ids)
        if not g.seqs:
            g.status, g.finish_s = FINISHED, now
            return True
        return False

    def finish_seq(self, s: Sequence, now: float) -> bool:
        """End a running sequence before its output length (an end-of-sequence token, a stop
        string: the executor's decision), exactly as ``update`` ends one that reached it.
        Returns True when that finished its whole group."""
        if s.group.status != RUNNING or s not in s.group.seqs:
            raise ValueError(f"{s!r} is not a running sequence")
        if not self._end_seq(s, now):
            return False
        self.running = [g for g in self.running if g is not s.group]
        self.finished.append(s.group)
        return True
