"""LLM: the paged engine. Prompts in, completions out, through the shared scheduler.

What it teaches: how the pieces of the course become a serving engine (the paper, section 4).

    Scheduler                     who runs this step: admissions FCFS, one decode slot per running
      (../serving/scheduler.py)   sequence, preemption of the newest group by swap or recompute
    KVCacheManager                which physical blocks hold which sequence (through PagedPolicy)
      (../serving/swap.py)
    PagedRunner (runner.py)       the K/V arrays and one packed forward pass per step
    sampling.py                   the next token (greedy, seeded sampling, beam search)
    engine_samples.py             the request records; sampling and parallel samples
    engine_beams.py               beam search: beams forked and dropped as sequences of a group

``generate`` checks the requests and makes their records, ``_run`` admits each at its arrival
step and steps until all are done. One ``_step``: ``schedule()`` returns the plan; the runner
applies its swap-outs, swap-ins and copy-on-write copies, then runs the step's prefill chunks and
decodes in one forward pass (K/V written with reshape_and_cache, read with paged attention); the
call's decoder object (engine_samples.Samples, or engine_beams.Beams for beam search), handed the
records explicitly, picks the tokens that ``update()`` appends, forks or drops, then ends the
sequences that ended early. With ``enable_prefix_caching=True`` parallel samples are not forked
(vLLM v1): the n samples become n requests whose full prompt blocks come out of the prefix cache.

The oracle is reference.py: the same model, a contiguous cache per sequence, no sharing, no
batching. tests/test_engine.py checks that both produce the same tokens for every request.

Read before: runner.py, ../serving/scheduler.py. Read next: engine_samples.py, engine_beams.py, then
lessons/09_model_end_to_end.py.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from minipaged._checks import check_bool, check_choice, check_int
from minipaged.model.decoder import Decoder
from minipaged.model.engine_beams import Beams
from minipaged.model.engine_samples import BYTES_PER_SAMPLE, RequestRecord, Samples
from minipaged.model.pool import cpu_pool_size, pool_size
from minipaged.model.runner import PagedRunner, SeqWork
from minipaged.model.sampling import (
    RequestOutput,
    SamplingParams,
    check_return_logits,
    max_new_tokens,
    resolve_seed,
)
from minipaged.model.tokenizer import check_tokenizer, encode_prompts
from minipaged.serving.memory_policy import PagedPolicy
from minipaged.serving.scheduler import NoProgressError, Scheduler, SchedulerConfig, StepResult
from minipaged.serving.swap import KVCacheManager
from minipaged.sim.host import refuse_if_too_big

PREEMPTION_MODES = ("recompute", "swap")
LONG_CONTEXT = 8192     # more positions: chunked prefill unless asked otherwise


class PoolTooSmallError(ValueError):
    """A request that could not run to its end even alone in an empty pool, refused before
    anything runs: prompt ``prompt_index``, ``num_seqs`` sequences of up to ``final_len`` tokens
    each (the message adds the scheduler's figures). A front end names its own settings with
    these: ``minipaged generate`` names its flags."""

    def __init__(self, prompt_index: int, num_seqs: int, final_len: int, reason: str) -> None:
        super().__init__(f"prompts[{prompt_index}] {reason}: raise num_blocks (or kv_cache_gb), "
                         "or lower max_tokens, n or beam_width")
        self.prompt_index, self.num_seqs, self.final_len = prompt_index, num_seqs, final_len


@dataclass
class StepStats:
    """What one step did, for --show-blocks and the lesson."""

    step: int
    num_prefill_tokens: int
    num_decodes: int
    copies: list
    swapped_out: int
    swapped_in: int
    preempted: list
    block_tables: dict            # seq_id -> physical blocks (sequences on the "GPU")
    num_free_blocks: int


class LLM:
    """A paged generation engine over a Decoder.

    model                     a Decoder, a Hugging Face model directory (hf.py), or None
    num_blocks, block_size    the KV pool: num_blocks blocks of block_size token slots; None:
                              what kv_cache_gb GiB hold (not both); with neither, 1 GiB for a
                              directory and 256 blocks for a model object; refused if it needs
                              over half of the memory available (pool.py)
    enable_prefix_caching     share full prompt blocks across requests by hash, as vLLM's
                              automatic prefix caching; n samples then become n requests,
                              as vLLM v1 runs them (lesson 05)
    preemption                "recompute" (default) or "swap" (then a CPU pool of
                              num_cpu_blocks >= 1 blocks, num_blocks by default)
    chunked_prefill           split prompts over steps of at most max_num_batched_tokens;
                              None: on when the model has more than LONG_CONTEXT positions
    backend                   "numpy" (the CPU default), "cuda-cpu" (the CUDA kernels of
                              minipaged/cuda under their CPU emulation) or "cupy" (the same
                              kernels on a GPU, through DLPack); see runner.py
    """

    def __init__(self, model: Decoder | str | os.PathLike | None = None, *, tokenizer=None,
                 num_blocks: int | None = None, block_size: int = 16,
                 kv_cache_gb: float | None = None, enable_prefix_caching: bool = False,
                 preemption: str = "recompute", num_cpu_blocks: int | None = None,
                 chunked_prefill: bool | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int = 256, backend: str = "numpy"):
        from_dir = isinstance(model, (str, os.PathLike))
        if not (from_dir or model is None or isinstance(model, Decoder)):
            raise TypeError(f"model={model!r:.60} must be a Decoder, a Hugging Face model "
                            f"directory or None (the shipped model), got {type(model).__name__}")
        check_tokenizer(tokenizer)
        if num_blocks is not None:
            num_blocks = check_int("num_blocks", num_blocks, low=1)
        block_size = check_int("block_size", block_size, low=1)
        check_choice("preemption", preemption, PREEMPTION_MODES)
        self.enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        if chunked_prefill is not None:
            check_bool("chunked_prefill", chunked_prefill)
        num_cpu_blocks = cpu_pool_size(preemption, num_cpu_blocks)   # None: num_blocks
        if from_dir:               # a Hugging Face model directory: its weights and tokenizer
            from minipaged.model.hf import load_hf
            model, hf_tokenizer = load_hf(model)
            tokenizer = tokenizer if tokenizer is not None else hf_tokenizer
        if model is None:
            from minipaged.model.checkpoint import load_model
            model = load_model()
        num_blocks, self.pool_note = pool_size(model, num_blocks, block_size, kv_cache_gb,
                                               from_dir, num_cpu_blocks=num_cpu_blocks)
        if chunked_prefill is None:  # else one launch could span a whole long-context prompt
            chunked_prefill = model.cfg.max_seq_len > LONG_CONTEXT
        num_cpu_blocks = num_blocks if num_cpu_blocks is None else num_cpu_blocks
        self.model = model
        self.tokenizer = check_tokenizer(tokenizer)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.preemption = preemption
        self.chunked_prefill = bool(chunked_prefill)
        self.num_cpu_blocks = num_cpu_blocks
        self.manager = self._new_manager()
        self.runner = PagedRunner(model, self.num_blocks, self.block_size,
                                  num_cpu_blocks=num_cpu_blocks, backend=backend)
        self.sched_config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_model_len=model.cfg.max_seq_len,
            chunked_prefill=self.chunked_prefill, max_num_batched_tokens=max_num_batched_tokens,
            preemption_mode=preemption)
        self.num_preemptions = 0
        self.num_steps = 0
        self.on_step = None        # callback(StepStats) after every step (--show-blocks)

    def _new_manager(self) -> KVCacheManager:
        return KVCacheManager(self.num_blocks, self.block_size,
                              enable_prefix_caching=self.enable_prefix_caching,
                              num_cpu_blocks=self.num_cpu_blocks)

    # ---- generate ----------------------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | None = None, *,
                 return_logits: bool = False, arrival_steps=None) -> list[RequestOutput]:
        """Complete every prompt; outputs in prompt order. ``arrival_steps[i]`` (optional) is
        the step at which prompt i joins the running batch (continuous batching). ``params``
        may be a list, one per prompt, that differ only in max_tokens (as vLLM's LLM.generate
        takes a list of SamplingParams; here the rest must agree)."""
        texts, encoded = encode_prompts(self.tokenizer, prompts, self.model.cfg.max_seq_len)
        params = SamplingParams() if params is None else params
        per_prompt = list(params) if isinstance(params, (list, tuple)) else [params] * len(encoded)
        params = per_prompt[0] if per_prompt else SamplingParams()   # []: refused by count
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if len(per_prompt) != len(encoded) or any(
                not isinstance(q, SamplingParams) or replace(q, max_tokens=1) != replace(
                    params, max_tokens=1) for q in per_prompt):
            raise ValueError(f"params has {len(per_prompt)} SamplingParams for {len(encoded)} "
                             "prompts; expected one per prompt, differing in max_tokens only")
        if params.beam_width > 1 and self.chunked_prefill:
            raise ValueError("beam search needs every beam of a request sampled in the same "
                             "step; run it with chunked_prefill=False")
        check_return_logits(return_logits, params)
        sched = Scheduler(PagedPolicy(self.manager), self.sched_config)
        # v1 mode: with prefix caching there is no fork; n samples become n requests whose
        # full prompt blocks come out of the prefix cache. They need not fit in the pool at
        # once, but each is a record (BYTES_PER_SAMPLE): refused if memory cannot hold them.
        split = params.n > 1 and self.enable_prefix_caching
        if split:
            refuse_if_too_big(f"{len(encoded)} prompt(s) x n={params.n} samples (one request "
                              "each with enable_prefix_caching=True)",
                              len(encoded) * params.n * BYTES_PER_SAMPLE)
        out_lens = [max_new_tokens(q, len(ids), self.model.cfg.max_seq_len)
                    for q, ids in zip(per_prompt, encoded)]
        for i, ids in enumerate(encoded):
            # Refused up front, before anything runs: a request that could not run to its end
            # even alone in an empty pool (the scheduler's own rule).
            width, final_len = 1 if split else params.num_seqs, len(ids) + out_lens[i] - 1
            reason = sched.refusal(width, final_len)
            if reason is not None:
                raise PoolTooSmallError(i, width, final_len, reason)
        if arrival_steps is None:
            arrival_steps = [0] * len(encoded)
        elif isinstance(arrival_steps, (str, bytes, Mapping, Set)) or not hasattr(
                arrival_steps, "__len__"):   # a dict or a set has no order of prompts
            raise TypeError(f"arrival_steps={arrival_steps!r:.60} must be a sequence of steps, "
                            f"one per prompt, got {type(arrival_steps).__name__}")
        if len(arrival_steps) != len(encoded):
            raise ValueError(f"arrival_steps has {len(arrival_steps)} steps; expected one per "
                             f"prompt ({len(encoded)})")
        arrival_steps = [check_int(f"arrival_steps[{i}]", a, low=0)
                         for i, a in enumerate(arrival_steps)]
        # This call's records, shared explicitly with its decoder object (engine_samples.py)
        reqs = [RequestRecord(i, ids, out_lens[i], first_index=j)
                for i, ids in enumerate(encoded) for j in range(params.n if split else 1)]
        if params.beam_width > 1:
            decoder = Beams(reqs, params.beam_width, self.tokenizer)
        else:
            decoder = Samples(reqs, params, resolve_seed(params), self.tokenizer,
                              by_fork=not split, return_logits=return_logits)
        try:
            self.num_steps += self._run(sched, decoder, reqs, arrival_steps,
                                        1 if split else params.n, params.beam_width)
        except BaseException:
            # Interrupted (an on_step callback raised, Ctrl-C): the manager may still hold this
            # call's sequences and, with prefix caching, blocks registered by hash whose K/V
            # the interrupted step never wrote. Start over from an empty manager, so that the
            # next generate is exact.
            self.manager = self._new_manager()
            raise
        results = [RequestOutput(i, texts[i], ids) for i, ids in enumerate(encoded)]
        for r, req in enumerate(reqs):
            results[req.prompt_index].outputs += decoder.outputs(r)
        for res in results:
            res.outputs.sort(key=lambda o: o.index)
            times = [q.first_token for q in reqs
                     if q.prompt_index == res.request_id and q.first_token is not None]
            res.first_token_time = min(times, default=None)
        return results

    def _run(self, sched: Scheduler, decoder, reqs: list[RequestRecord],
             arrival_steps: list[int], n: int, beam_width: int) -> int:
        """The scheduling loop: each request joins at its arrival step, then one step at a time
        until all are done; an idle engine jumps straight to the next arrival. Returns the
        number of steps run."""
        pending = deque(sorted(range(len(reqs)),
                               key=lambda r: arrival_steps[reqs[r].prompt_index]))
        step = steps_run = 0
        while pending or sched.has_unfinished():
            if not sched.has_unfinished():
                step = max(step, arrival_steps[reqs[pending[0]].prompt_index])
            while pending and arrival_steps[reqs[pending[0]].prompt_index] <= step:
                r = pending.popleft()
                req = reqs[r]
                req.group = sched.add_request(r, req.ids, req.out_len, arrival_s=float(step),
                                              n=n, beam_width=beam_width)
                decoder.admit(r, req.group.seqs[0])
            if sched.has_unfinished():  # (always: every request passed the refusal check)
                self._step(sched, decoder, step)
                steps_run += 1
            step += 1
        return steps_run

    def _step(self, sched: Scheduler, decoder, step: int) -> None:
        out = sched.schedule()
        if out.is_empty:  # the scheduler raises first; this guards any other scheduler
            raise NoProgressError(f"step {step}: {sched.stall_report()}")
        self.num_preemptions += len(out.preempted)
        r, m = self.runner, self.manager
        # Data movement first, in the scheduler's order: swap-outs, swap-ins, copies.
        if out.blocks_to_swap_out:
            r.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            r.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            r.copy(out.blocks_to_copy)
        work = []
        for c in out.prefills:
            s = c.seq
            work.append(SeqWork(s.token_ids[c.start:c.end], c.start,
                                m.slot_mapping(s.seq_id, c.start, c.end),
                                m.block_table(s.seq_id), c.end == len(s.token_ids)))
        for s in out.decodes:
            n = len(s.token_ids)
            work.append(SeqWork([s.token_ids[-1]], n - 1, m.slot_mapping(s.seq_id, n - 1, n),
                                m.block_table(s.seq_id)))
        logits = r.execute(work)       # one per out.sampled: finishing prefills, then decodes
        samples = decoder.samples(out.sampled, logits)
        sched.update(out, StepResult(0.0, samples), float(step))
        decoder.after_update(sched, out, step)
        if self.on_step is not None:
            self.on_step(StepStats(step, out.num_prefill_tokens, len(out.decodes),
                                   list(out.blocks_to_copy), len(out.blocks_to_swap_out),
                                   len(out.blocks_to_swap_in),
                                   [(g.request_id, mode) for g, mode in out.preempted],
                                   {sid: m.block_table(sid) for sid in m.seq_ids
                                    if not m.is_swapped(sid)},
                                   m.num_free_blocks))
