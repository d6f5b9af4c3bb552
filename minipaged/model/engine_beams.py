"""Beam search in the paged engine: beams as the sequences of one group, forked and dropped.

What it teaches: how ``sampling.beam_step`` (the rule, shared with the reference generator)
becomes block sharing (vLLM v0, the paper's section 4.4). A request with ``beam_width`` k is one
sequence group; every step, all of its live beams are computed in the same forward pass, and

    _beam_samples        runs one ``beam_step`` per request over its beams' log-probabilities
                         and tells the scheduler what each sequence becomes: the tokens of its
                         surviving children (the first continues the sequence, each other one
                         forks it, sharing every block; none: the sequence is dropped and its
                         blocks lose a user, freed when no beam holds them any more)
    _beam_after_update   after ``Scheduler.update``: the forks made there get their beams and
                         records; a request that is done (k hypotheses finished, or no live beam
                         left) has its group ended with ``Scheduler.finish_seq``
    _beam_outputs        the request's result: its best k hypotheses by length-normalised score

Beams must all be sampled in the same step, so beam search runs without chunked prefill
(``LLM.generate`` refuses the combination). Because the beams of a step share the blocks of
their common history, a beam search holds far fewer blocks than k independent sequences: the
saving the paper measures in Fig. 15 (``minipaged experiment 2`` simulates it).

``LLM`` (engine.py) inherits these methods; the records they update are those of
engine_samples.py.

Read before: engine_samples.py. Read next: lessons/09_model_end_to_end.py.
"""

from __future__ import annotations

from minipaged.model.engine_samples import _SeqState
from minipaged.model.sampling import Beam, CompletionOutput, beam_step, log_softmax
from minipaged.serving.scheduler import FINISHED


class BeamSearchMixin:
    """Beam search for ``LLM`` (see the module docstring)."""

    def _beam_samples(self, sampled, logits) -> list:
        """One beam step per request whose beams were all computed this step. Each sequence
        gets the tokens of its surviving children (the first continues it, the others fork it;
        none: it is dropped and its blocks lose a user)."""
        k, eos = self._params.beam_width, self.tokenizer.eos_id
        by_req: dict[int, list[int]] = {}
        for j, s in enumerate(sampled):
            by_req.setdefault(self._live[s.seq_id].request, []).append(j)
        samples: list = [None] * len(sampled)
        self._beam_plan = {}
        for r, js in by_req.items():
            req = self._reqs[r]
            seqs = [sampled[j] for j in js]
            assert len(seqs) == len(req.group.seqs), "a beam group must be sampled together"
            live = [req.beams[s.seq_id] for s in seqs]
            survivors, done = beam_step(live, [log_softmax(logits[j]) for j in js], k, eos)
            req.beams_done.extend((b, "stop") for b in done)
            new_live = [(i, Beam(live[i].tokens + [t], sc)) for i, t, sc in survivors]
            out_len = self._output_len(req.ids, req.params)
            if len(req.beams_done) >= k or not new_live:
                req.beam_over = True
                for j in js:
                    samples[j] = eos            # no forks; the engine ends the group after update
                continue
            if len(new_live[0][1].tokens) >= out_len:
                # update() ends every sequence at its length: the live beams finish as they are.
                req.beams_done.extend((b, "length") for _, b in new_live)
                req.beam_over = True
            per_parent = {i: [] for i in range(len(seqs))}
            for i, b in new_live:
                per_parent[i].append(b)
            for i, j in enumerate(js):
                samples[j] = [b.tokens[-1] for b in per_parent[i]]
            self._beam_plan[r] = (seqs, per_parent)
        return samples

    def _beam_after_update(self, sched, out, samples, step) -> None:
        for r, (seqs, per_parent) in self._beam_plan.items():
            req = self._reqs[r]
            if req.beam_over:
                continue
            known = set(req.beams)
            new = iter([x for x in req.group.seqs if x.seq_id not in known])
            beams = {}
            for i, s in enumerate(seqs):
                bs = per_parent[i]
                if bs:
                    beams[s.seq_id] = bs[0]
                    for b in bs[1:]:
                        child = next(new)
                        beams[child.seq_id] = b
                        self._live[child.seq_id] = _SeqState(r, 0)
            req.beams = beams
        for req in self._reqs:
            if req.beam_over and req.group is not None and req.group.status != FINISHED:
                for s in list(req.group.seqs):
                    sched.finish_seq(s, float(step))
                req.beams = {}

    def _beam_outputs(self, req) -> list[CompletionOutput]:
        """A finished request's completions: its best ``beam_width`` hypotheses by score."""
        ranked = sorted(req.beams_done, key=lambda br: -br[0].score())[: self._params.beam_width]
        return [CompletionOutput(i, self.tokenizer.decode(b.tokens), b.tokens, b.cum_logprob,
                                 reason)
                for i, (b, reason) in enumerate(ranked)]
