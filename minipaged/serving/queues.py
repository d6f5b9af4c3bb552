"""Requests in, tokens out: the queues of continuous batching and the contract of one step.

What this teaches (lesson 06): iteration-level batching (Orca, Yu et al., OSDI 2022; vLLM paper
section 2.3): between two steps a request can join and a sequence can leave. Each group is in one
queue: waiting (no memory), running, swapped, finished or rejected (``rejections`` says why). A
step is a contract with an *executor* (cost model or model): the plan (``SchedulerOutput``), the
answer (``StepResult``), and ``update``, which appends tokens, forks a sequence that sampled
several and frees the finished (in vLLM v0, ``vllm/engine/output_processor/single_step.py``).

Read next: ``serving/scheduler.py``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minipaged._checks import (
    SIZE_LIMIT,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_seq_id,
    check_token_ids,
)
from minipaged.serving.memory_policy import MemoryPolicy
from minipaged.sharing.sequence import (
    FINISHED,
    REJECTED,
    RUNNING,
    PrefillChunk,
    Sequence,
    SequenceGroup,
)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: max(max_model_len, 2048); 512 chunked
    max_model_len: int = 2048
    chunked_prefill: bool = False
    preemption_mode: str = "recompute"  # or "swap"
    keep_outputs: bool = True  # False: finished token streams are dropped (long simulations)

    def __post_init__(self) -> None:
        check_choice("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        check_int("max_num_seqs", self.max_num_seqs, low=1)
        check_int("max_model_len", self.max_model_len, low=1, high=SIZE_LIMIT)
        check_bool("chunked_prefill", self.chunked_prefill)
        check_bool("keep_outputs", self.keep_outputs)
        b = check_int("max_num_batched_tokens", self.token_budget, low=1)
        if not self.chunked_prefill and b < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens={b} must be >= max_model_len="
                             f"{self.max_model_len}, a prompt's step, unless chunked_prefill=True")

    @property
    def token_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 512 if self.chunked_prefill else max(self.max_model_len, 2048)


@dataclass
class SchedulerOutput:
    """One step's plan; data moves in this order: swap-outs, swap-ins, copies, the new K/V.
    ``sampled``: who gets a new token, in ``StepResult.samples`` order (prefills, decodes)."""

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
        """Nothing to compute, move or preempt: a step that makes no progress."""
        return not (self.prefills or self.decodes or self.blocks_to_swap_out or self.preempted)


@dataclass
class StepResult:
    """``samples[i]`` is for ``out.sampled[i]``: the next token, or a list (the sequence goes on
    with the first, each further one forks it; an empty list drops it: a beam that lost)."""

    duration_s: float
    samples: list


class RequestQueues:
    """The queues, requests joining them, a step's results applied; ``Scheduler`` adds the rest."""

    def __init__(self, policy: MemoryPolicy, config: SchedulerConfig | None = None) -> None:
        if not isinstance(policy, MemoryPolicy):
            raise TypeError(f"policy must be a MemoryPolicy (make_policy builds one), got "
                            f"{type(policy).__name__}")
        if config is not None and not isinstance(config, SchedulerConfig):
            raise TypeError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.finished: list[SequenceGroup] = []
        self.rejected: list[SequenceGroup] = []
        self.rejections: dict[int, str] = {}  # group order -> why it was refused
        self._next_seq_id = self._next_order = 0  # the next Sequence id and group order
        self._pending: SchedulerOutput | None = None  # the plan update() has yet to apply
        self._now = 0.0  # the time of the latest update: a clock never goes back
        self._request_ids: set = set()  # every request id queued so far: each names one request

    def add_request(self, request_id, prompt_token_ids: list[int], output_len: int, *,
                    arrival_s: float = 0.0, n: int = 1, beam_width: int = 1) -> SequenceGroup:
        """Queue one request (a bad argument queues nothing); one that ``refusal`` refuses is
        returned ``rejected``, with the reason in ``rejections``."""
        cfg, where = self.config, f"request {request_id!r}"
        try:
            prompt = check_token_ids("prompt_token_ids", prompt_token_ids)
            output_len = check_int("output_len", output_len, low=1)
            n = check_int("n", n, low=1)
            beam_width = check_int("beam_width", beam_width, low=1)
            arrival_s = check_float("arrival_s", arrival_s, low=0.0)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        if check_seq_id("request_id", request_id, new=True) in self._request_ids:
            raise ValueError(f"{where} was already added: request ids must be unique")
        if len(prompt) + output_len > cfg.max_model_len:
            raise ValueError(f"{where}: prompt_len={len(prompt)} + output_len={output_len} "
                             f"exceeds max_model_len={cfg.max_model_len}")
        if n > 1 and beam_width > 1:
            raise ValueError(f"{where}: n={n}, beam_width={beam_width}: at most one of them > 1")
        if (n > 1 or beam_width > 1) and not self.policy.supports_sharing:
            raise ValueError(f"{where}: {self.policy.no_sharing()}")
        if self.waiting and arrival_s < self.waiting[-1].arrival_s:
            raise ValueError(f"{where}: arrival_s={arrival_s} is before the last waiting request's"
                             f" {self.waiting[-1].arrival_s}: add requests in arrival order")
        self._request_ids.add(request_id)
        g = SequenceGroup(request_id, self._next_order, arrival_s, len(prompt), output_len,
                          n, beam_width)
        self._next_order += 1
        g.seqs.append(self._new_seq(g, prompt))
        reason = self.refusal(g.width, g.final_len)
        if reason is None:
            self.waiting.append(g)
        else:
            g.status = REJECTED
            self.rejected.append(g)
            self.rejections[g.order] = f"{where} {reason}"
        return g

    def refusal(self, width: int, final_len: int) -> str | None:
        """``MemoryPolicy.refusal``, or a group wider than ``max_num_seqs``; None if it can run."""
        reason = self.policy.refusal(width, final_len)
        if reason is None and width > self.config.max_num_seqs:
            reason = f"runs {width} sequences at once but max_num_seqs={self.config.max_num_seqs}"
        return reason

    def _new_seq(self, g: SequenceGroup, token_ids: list[int]) -> Sequence:
        s = Sequence(self._next_seq_id, g, token_ids)
        self._next_seq_id += 1
        return s

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_running_seqs(self) -> int:
        return sum(len(g.seqs) for g in self.running)

    def update(self, out: SchedulerOutput, result: StepResult, now: float) -> list[SequenceGroup]:
        """Apply the latest plan's results at time ``now``; returns the groups that finished.
        Checked first (``_check_step``): a bad result changes nothing."""
        self._check_step(out, result, now)
        self._pending, self._now = None, float(now)
        for c in out.prefills:
            c.seq.num_computed = c.end
            if c.end == len(c.seq.token_ids):
                c.seq.prefilling = False
                if c.seq.group.first_token_s is None:
                    c.seq.group.first_token_s = now
        finished: list[Sequence] = []
        for s, toks in zip(out.sampled, result.samples):
            tokens = s.token_ids
            s.num_computed = len(tokens)  # the step computed every token it had
            if not isinstance(toks, list):  # one new token (a NumPy int stored as an int)
                tokens.append(int(toks))
            elif not toks:  # a beam that lost: its blocks go (shared ones lose one user)
                self.policy.free(s.seq_id)
                s.group.seqs.remove(s)
                continue
            else:  # parallel sampling / beam search: the children share the parent's blocks
                for t in toks[1:]:
                    child = self._new_seq(s.group, tokens + [int(t)])
                    child.num_computed, child.prefilling = len(tokens), False
                    self.policy.fork(s.seq_id, child.seq_id)
                    s.group.seqs.append(child)
                    if len(child.token_ids) >= child.stop_len:
                        finished.append(child)
                tokens.append(int(toks[0]))
            if len(tokens) >= s.stop_len:
                finished.append(s)
        return self._finish(finished, now)

    def _check_step(self, out: SchedulerOutput, result: StepResult, now: float) -> None:
        """The plan is the latest one, applied once; each sample is a token id >= 0, or a list
        of them for a group that shares (empty: a beam lost), leaving it 1 to width sequences."""
        if out is None or out is not self._pending:
            raise ValueError("out must be the latest schedule()'s output, applied once")
        if not isinstance(result, StepResult):
            raise TypeError(f"result must be a StepResult, got {type(result).__name__}")
        check_float("now", now, low=self._now)
        samples = result.samples
        if not isinstance(samples, list) or len(samples) != len(out.sampled):
            raise ValueError(f"StepResult.samples={samples!r:.40} must be a list, one entry for "
                             f"each of the {len(out.sampled)} sampled sequences")
        live: dict[SequenceGroup, int] = {}  # group -> its sequences after these samples
        for i, (s, toks) in enumerate(zip(out.sampled, samples)):
            many = isinstance(toks, list)
            g = s.group
            if many:  # a lost beam leaves, each further token forks
                live[g] = live.get(g, len(g.seqs)) + len(toks) - 1
            if many and ((g.n == 1 and g.beam_width == 1) or (not toks and g.beam_width == 1)):
                raise ValueError(f"samples[{i}]={toks!r}: request {g.request_id!r} (n={g.n}, "
                                 f"beam_width={g.beam_width}) takes one token id here")
            for t in toks if many else (toks,):
                if type(t) is not int or t < 0:  # then check_int names what is wrong
                    check_int(f"samples[{i}]", t, low=0)
        for g, k in live.items():
            if not 1 <= k <= g.width:
                raise ValueError(f"StepResult.samples leave request {g.request_id!r} with {k} "
                                 f"sequences; expected 1 to its width, {g.width}")

    def _finish(self, seqs: list[Sequence], now: float) -> list[SequenceGroup]:
        """Free finished sequences; returns the groups they were the last of."""
        done = []
        for s in seqs:
            g = s.group
            self.policy.free(s.seq_id)
            g.seqs.remove(s)
            if self.config.keep_outputs:
                g.outputs.append(s.token_ids)
            if not g.seqs:
                g.status, g.finish_s = FINISHED, now
                done.append(g)
        if done:
            self.running = [g for g in self.running if g.status == RUNNING]
            self.finished += done
        return done

    def finish_seq(self, s: Sequence, now: float) -> bool:
        """End a running sequence early (an end-of-sequence token, a stop string: the executor
        decides) as ``update`` ends one at its length; True when that finished its group."""
        if not isinstance(s, Sequence) or s.group.status != RUNNING or s not in s.group.seqs:
            raise ValueError(f"{s!r:.60} is not a running sequence")
        if self._pending is not None:  # update() would append to it after it was freed
            raise ValueError("finish_seq between schedule() and update(): apply the step first")
        return bool(self._finish([s], check_float("now", now, low=self._now)))
