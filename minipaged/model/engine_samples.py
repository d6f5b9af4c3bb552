"""The paged engine's samples: what it records per request and sequence, and the tokens it picks.

What it teaches: the engine-side half of sampling (``sampling.py`` holds the rules, shared with
the reference generator). The scheduler knows sequences only as token lists that come and go;
the engine keeps its own record of every sample (``_SeqState``) and request (``_Request``), so
that a completion survives its sequence being freed, preempted or forked. Each step:

    _samples        one token per sequence that the scheduler sampled this step. A prompt
                    with n > 1 samples (vLLM v0) draws all n first tokens from the prompt's
                    logits; it goes on as sample 0 and the scheduler forks one child per
                    other sample (the children share the prompt's blocks; the partly filled
                    last one is copied on the first write)
    _after_update   after ``Scheduler.update``: the forked children get their records, and a
                    sample that ended early (<eos>, a stop string) is ended with
                    ``Scheduler.finish_seq``, which frees it exactly as ``update`` would
    _collect        at the end of ``generate``: the records become RequestOutputs, in prompt
                    order and sample order

With ``enable_prefix_caching=True`` there is no fork (vLLM v1): the engine made the n samples
n requests, each a plain single-sample request here.

``LLM`` (engine.py) inherits these methods; the state they read (``self._params``,
``self._reqs``, ``self._live``, ...) is set up by ``LLM.generate``.

Read before: engine.py. Read next: engine_beams.py (beam search in the same engine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minipaged.model.sampling import (
    CompletionOutput,
    RequestOutput,
    SamplingParams,
    apply_stop,
    finish_reason,
    log_softmax,
    sample_token,
)


@dataclass
class _SeqState:
    """The engine's record of one sample or beam (kept after the scheduler forgets it)."""

    request: int                      # index into self._reqs
    index: int                        # sample index: picks the random stream of this sample
    tokens: list = field(default_factory=list)    # generated token ids
    cum_logprob: float = 0.0
    logits: list = field(default_factory=list)    # [V] per generated token, if asked for
    reason: str | None = None


@dataclass
class _Request:
    prompt_index: int
    ids: list[int]
    first_index: int = 0              # v1 mode splits n samples into n requests
    group: object = None
    states: list = field(default_factory=list)    # every _SeqState of this request
    beams: dict = field(default_factory=dict)     # beam search: seq_id -> live Beam
    beams_done: list = field(default_factory=list)  # beam search: (Beam, reason)
    beam_over: bool = False
    params: SamplingParams | None = None          # this request's (its own max_tokens)


class SamplingMixin:
    """Sampling and parallel samples for ``LLM`` (see the module docstring)."""

    def _record(self, st: _SeqState, lg: np.ndarray, t: int) -> None:
        # time to first token, per prompt: setdefault keeps the earliest of its samples
        self._first_token.setdefault(self._reqs[st.request].prompt_index, time.perf_counter())
        st.tokens.append(t)
        st.cum_logprob += float(log_softmax(lg)[t])
        if self._return_logits:
            st.logits.append(lg)

    def _samples(self, sampled, logits) -> list:
        p = self._params
        samples, self._forks = [], {}
        for s, lg in zip(sampled, logits):
            st = self._live[s.seq_id]
            if not st.tokens and p.n > 1 and not self.enable_prefix_caching:
                # The prompt's logits serve all n samples: this sequence continues as sample 0
                # and the scheduler forks one child per further sample (vLLM v0: the children
                # share every prompt block; the partly filled last one is copied on write).
                toks = [sample_token(lg, p, self._seed, i, 0) for i in range(p.n)]
                req = self._reqs[st.request]
                children = [_SeqState(st.request, i) for i in range(1, p.n)]
                for c, t in zip(children, toks[1:]):
                    self._record(c, lg, t)
                req.states.extend(children)
                self._forks[s.seq_id] = children
                self._record(st, lg, toks[0])
                samples.append(toks)
            else:
                t = sample_token(lg, p, self._seed, st.index, len(st.tokens))
                self._record(st, lg, t)
                samples.append(t)
        return samples

    def _after_update(self, sched, out, samples, step) -> None:
        """Give forked children their records; finish sequences that ended early."""
        touched = []
        for s in out.sampled:
            st = self._live[s.seq_id]
            touched.append((s, st))
            children = self._forks.get(s.seq_id, [])
            if children:
                known = set(self._live)
                new = [x for x in s.group.seqs if x.seq_id not in known]
                # Children appear in sample order; all of them are gone already only when
                # one token was all they could produce (then they have finished).
                for x, c in zip(new, children):
                    self._live[x.seq_id] = c
                    touched.append((x, c))
                if len(new) < len(children):
                    for c in children[len(new):]:
                        touched.append((None, c))
        for s, st in touched:
            req = self._reqs[st.request]
            st.reason = finish_reason(st.tokens, len(req.ids), req.params,
                                      self.model.cfg.max_seq_len, self.tokenizer.eos_ids,
                                      self.tokenizer.decode)
            if st.reason is None or s is None:
                continue
            if s in s.group.seqs:           # "length" was handled by update() already
                sched.finish_seq(s, float(step))
            self._live.pop(s.seq_id, None)

    # ---- results ---------------------------------------------------------------------------
    def _collect(self, prompts, encoded) -> list[RequestOutput]:
        p = self._params
        results = [RequestOutput(i, prompts[i], ids) for i, ids in enumerate(encoded)]
        for req in self._reqs:
            res = results[req.prompt_index]
            if p.beam_width > 1:
                res.outputs = self._beam_outputs(req)
                continue
            for st in req.states:
                text = apply_stop(self.tokenizer.decode(st.tokens), p.stop)[0]
                res.outputs.append(CompletionOutput(
                    st.index, text, st.tokens, st.cum_logprob, st.reason,
                    np.stack(st.logits) if self._return_logits else None))
        for res in results:
            res.outputs.sort(key=lambda o: o.index)
        for res in results:
            res.first_token_time = self._first_token.get(res.request_id)
        return results
