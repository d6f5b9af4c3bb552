"""Beam search in the paged engine: beams as the sequences of one group, forked and dropped.

What it teaches: how ``sampling.beam_step`` (the rule, shared with the reference generator)
becomes block sharing (vLLM v0, the paper's section 4.4). A request with ``beam_width`` k is one
sequence group, and ``Beams`` is the call's decoder object (the interface of engine_samples.py).
Every step all of a request's live beams are computed in the same forward pass; ``samples`` runs
one ``beam_step`` over them and tells the scheduler what each sequence becomes: the tokens of its
surviving children (the first continues the sequence, each other one forks it, sharing every
block; none: the sequence is dropped and its blocks lose a user, freed when no beam holds them
any more). ``after_update`` gives the forks their beams and ends a request that is done (k
hypotheses finished, or no live beam left) with ``Scheduler.finish_seq``; ``outputs`` returns its
best k hypotheses by length-normalised score.

Beams must all be sampled in the same step, so beam search runs without chunked prefill
(``LLM.generate`` refuses the combination). Because the beams of a step share the blocks of
their common history, a beam search holds far fewer blocks than k independent sequences: the
saving the paper measures in Fig. 15 (``minipaged experiment 2`` simulates it).

Read before: engine_samples.py. Read next: lessons/09_model_end_to_end.py.
"""

from __future__ import annotations

from minipaged.model.engine_samples import RequestRecord
from minipaged.model.sampling import Beam, CompletionOutput, beam_step, best_hypotheses, log_softmax
from minipaged.sharing.sequence import FINISHED


class Beams:
    """Beam search for the engine (see the module docstring)."""

    def __init__(self, reqs: list[RequestRecord], beam_width: int, tokenizer):
        self.reqs, self.k, self.tokenizer = reqs, beam_width, tokenizer
        self.live: dict[int, dict[int, Beam]] = {}          # request -> seq_id -> its beam
        self.done: dict[int, list[tuple[Beam, str]]] = {}   # request -> (hypothesis, reason)
        self.ending: list[int] = []   # this step: requests whose search is over
        self.plan: dict = {}          # this step: request -> (its sequences, children of each)

    def admit(self, r: int, seq) -> None:
        self.live[r], self.done[r] = {seq.seq_id: Beam([], 0.0)}, []

    def samples(self, sampled, logits) -> list:
        """One beam step per request whose beams were all computed this step."""
        eos = self.tokenizer.eos_id
        by_req: dict[int, list[int]] = {}
        for j, s in enumerate(sampled):
            by_req.setdefault(s.group.request_id, []).append(j)
        samples: list = [None] * len(sampled)
        self.ending, self.plan = [], {}
        for r, js in by_req.items():
            seqs = [sampled[j] for j in js]
            assert len(seqs) == len(self.reqs[r].group.seqs), "a beam group is sampled together"
            live = [self.live[r][s.seq_id] for s in seqs]
            survivors, done = beam_step(live, [log_softmax(logits[j]) for j in js], self.k, eos)
            self.done[r].extend((b, "stop") for b in done)
            new_live = [(i, Beam(live[i].tokens + [t], sc)) for i, t, sc in survivors]
            if len(self.done[r]) >= self.k or not new_live:
                self.ending.append(r)
                for j in js:
                    samples[j] = eos            # no forks; after_update ends the group
                continue
            if len(new_live[0][1].tokens) >= self.reqs[r].out_len:
                # update() ends every sequence at its length: the live beams finish as they are.
                self.done[r].extend((b, "length") for _, b in new_live)
                self.ending.append(r)
            per_parent = [[b for p, b in new_live if p == i] for i in range(len(seqs))]
            for i, j in enumerate(js):
                samples[j] = [b.tokens[-1] for b in per_parent[i]]
            if r not in self.ending:
                self.plan[r] = (seqs, per_parent)
        return samples

    def after_update(self, sched, out, step: int) -> None:
        for r, (seqs, per_parent) in self.plan.items():
            new = iter([x for x in self.reqs[r].group.seqs if x.seq_id not in self.live[r]])
            beams = {}
            for i, s in enumerate(seqs):   # the first child continues s, the others are forks
                for c, b in enumerate(per_parent[i]):
                    beams[s.seq_id if c == 0 else next(new).seq_id] = b
            self.live[r] = beams
        for r in sorted(self.ending):
            group = self.reqs[r].group
            if group.status != FINISHED:
                for s in list(group.seqs):
                    sched.finish_seq(s, float(step))
            self.live[r] = {}

    def outputs(self, r: int) -> list[CompletionOutput]:
        return best_hypotheses(self.done[r], self.k, self.tokenizer.decode)
