"""The paged engine's samples: its records of requests and samples, and the tokens it picks.

What it teaches: the engine-side half of sampling (``sampling.py`` holds the rules, shared with
the reference generator). The scheduler knows sequences only as token lists that come and go;
the engine keeps its own record of every request (``RequestRecord``) and sample
(``SeqRecord``), so that a completion survives its sequence being freed, preempted or forked.

The seam between the engine and the way it decodes: ``LLM.generate`` makes one
``RequestRecord`` per request and hands the list to a decoder object, ``Samples`` here or
``Beams`` (engine_beams.py), which owns everything else and offers four methods:

    admit(r, seq)                  request r joins the batch as sequence ``seq``
    samples(sampled, logits)       for ``Scheduler.update``, one entry per sampled sequence: a
                                   token, or tokens (the first continues it, the others fork it)
    after_update(sched, out, step) records for the forks ``update`` made; a sequence that ended
                                   early (<eos>, a stop string) is ended with
                                   ``Scheduler.finish_seq`` (it frees it as ``update`` would)
    outputs(r)                     request r's CompletionOutputs, once it is done

A prompt with n > 1 samples (vLLM v0) draws all n first tokens from the prompt's logits; it goes
on as sample 0 and the scheduler forks one child per other sample (the children share the
prompt's blocks; the partly filled last one is copied on the first write). With
``enable_prefix_caching=True`` there is no fork (vLLM v1): the engine made the n samples n
requests, each a plain single-sample request here.

Read before: engine.py. Read next: engine_beams.py (beam search in the same engine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minipaged.model.sampling import (
    CompletionOutput,
    SamplingParams,
    apply_stop,
    finish_reason,
    log_softmax,
    sample_token,
)

# What one sample holds until the outputs are returned (its record, token ids, text), measured
# with /usr/bin/time: about 5 KB with 20 new tokens (2,000 and 8,000 samples of one prompt with
# prefix caching, which makes each sample a request). generate refuses more than memory holds,
# and so does ``minipaged generate`` (kit/cli/generation_checks.py), with this figure.
BYTES_PER_SAMPLE = 8_000


@dataclass
class RequestRecord:
    """One request, made by the engine; what its decoder needs to know about it."""

    prompt_index: int
    ids: list[int]
    out_len: int                      # new tokens at most (max_tokens, or the model's end)
    first_index: int = 0              # v1 mode splits n samples into n requests
    group: object = None              # its SequenceGroup, once admitted
    first_token: float | None = None  # time.perf_counter() when its first token came


@dataclass
class SeqRecord:
    """The engine's record of one sample (kept after the scheduler forgets its sequence)."""

    request: int                      # index into the request records
    index: int                        # sample index: picks the random stream of this sample
    tokens: list = field(default_factory=list)    # generated token ids
    cum_logprob: float = 0.0
    logits: list = field(default_factory=list)    # [V] per generated token, if asked for
    reason: str | None = None


class Samples:
    """Sampling and parallel samples for the engine (see the module docstring)."""

    def __init__(self, reqs: list[RequestRecord], params: SamplingParams, seed: int, tokenizer,
                 *, by_fork: bool, return_logits: bool):
        self.reqs, self.params, self.seed, self.tokenizer = reqs, params, seed, tokenizer
        self.by_fork, self.return_logits = by_fork, return_logits
        self.live: dict[int, SeqRecord] = {}        # seq_id -> the sample it computes
        self.of_request: dict[int, list[SeqRecord]] = {}   # request -> its samples
        self.forks: dict[int, list[SeqRecord]] = {}  # this step: seq_id -> children to fork

    def admit(self, r: int, seq) -> None:
        st = SeqRecord(r, self.reqs[r].first_index)
        self.of_request[r] = [st]
        self.live[seq.seq_id] = st

    def _record(self, st: SeqRecord, lg: np.ndarray, t: int) -> None:
        req = self.reqs[st.request]
        if req.first_token is None:
            req.first_token = time.perf_counter()
        st.tokens.append(t)
        st.cum_logprob += float(log_softmax(lg)[t])
        if self.return_logits:
            st.logits.append(lg)

    def samples(self, sampled, logits) -> list:
        p = self.params
        samples, self.forks = [], {}
        for s, lg in zip(sampled, logits):
            st = self.live[s.seq_id]
            if not st.tokens and p.n > 1 and self.by_fork:
                # The prompt's logits serve all n samples: this sequence continues as sample 0
                # and the scheduler forks one child per further sample (vLLM v0: the children
                # share every prompt block; the partly filled last one is copied on write).
                toks = [sample_token(lg, p, self.seed, i, 0) for i in range(p.n)]
                children = [SeqRecord(st.request, i) for i in range(1, p.n)]
                for c, t in zip(children, toks[1:]):
                    self._record(c, lg, t)
                self.of_request[st.request].extend(children)
                self.forks[s.seq_id] = children
                self._record(st, lg, toks[0])
                samples.append(toks)
            else:
                t = sample_token(lg, p, self.seed, st.index, len(st.tokens))
                self._record(st, lg, t)
                samples.append(t)
        return samples

    def after_update(self, sched, out, step: int) -> None:
        """Give forked children their records; finish sequences that ended early."""
        touched = []
        for s in out.sampled:
            touched.append((s, self.live[s.seq_id]))
            children = self.forks.get(s.seq_id, [])
            if children:
                new = [x for x in s.group.seqs if x.seq_id not in self.live]
                # Children appear in sample order; all of them are gone already only when
                # one token was all they could produce (then they have finished).
                for x, c in zip(new, children):
                    self.live[x.seq_id] = c
                    touched.append((x, c))
                touched.extend((None, c) for c in children[len(new):])
        for s, st in touched:
            st.reason = finish_reason(st.tokens, self.reqs[st.request].out_len, self.params,
                                      self.tokenizer)
            if st.reason is None or s is None:
                continue
            if s in s.group.seqs:           # "length" was handled by update() already
                sched.finish_seq(s, float(step))
            self.live.pop(s.seq_id, None)

    def outputs(self, r: int) -> list[CompletionOutput]:
        return [CompletionOutput(st.index, apply_stop(self.tokenizer.decode(st.tokens),
                                                      self.params.stop)[0],
                                 st.tokens, st.cum_logprob, st.reason,
                                 np.stack(st.logits) if self.return_logits else None)
                for st in self.of_request[r]]
