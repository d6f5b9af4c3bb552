"""The simulator's stand-in for the model: how long a step takes, and which tokens it samples.

What this holds: ``SimExecutor``, which takes the place of a model runner in ``simulator.py``.
It is given each step's ``SchedulerOutput`` and returns a ``StepResult``, as the paged engine's
runner and sampler do (``model/engine.py``), so the scheduler cannot tell the two apart:

    duration   the step's time from the roofline cost model (``cost.py``): the tokens it
               processes, the context its sequences attend over, the blocks a paged kernel
               reads and the blocks it swaps
    tokens     deterministic stand-ins instead of a language model: a hash of the sequence's
               history (``next_token``), so a preempted and recomputed sequence produces the same
               tokens again; n different first tokens for parallel samples; and for beam search
               one stated rule of which beams survive (``SimExecutor.beam_step``)

Only the beam rule bears on a measured figure: it decides how much of their text beams share,
and so the memory saving of beam search (Fig. 15, ``minipaged experiment 2``).

Read before: ``cost.py``. Read next: ``simulator.py`` (the loop that drives it).
"""

from __future__ import annotations

from minipaged._checks import cdiv, check_float
from minipaged.serving.scheduler import SchedulerOutput, StepResult
from minipaged.sim.cost import CostModel

VOCAB = 32000


_MASK64 = 0xFFFFFFFFFFFFFFFF


def _mix_in(h: int, x: int) -> int:
    """One round of a small deterministic integer hash (splitmix-style): ``x`` folded into
    ``h``."""
    h = ((h ^ (x & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
    return h ^ (h >> 31)


def _mix(*xs: int) -> int:
    """The hash of ``xs``: same inputs, same output. Because it folds them in one by one,
    ``_mix(a, b, c) == _mix_in(_mix(a, b), c)``, so a step hashes what its beams share once
    (re-hashing it for every beam was 7% of experiment 2's profile)."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = _mix_in(h, x)
    return h


def next_token(token_ids: list[int]) -> int:
    """The stand-in model's next token: a linear congruential step on the last token and the
    length, so a sequence's continuation depends on its history only."""
    return (token_ids[-1] * 1103515245 + len(token_ids) * 12345 + 1) % VOCAB + 1


class SimExecutor:
    """Stands in for the model: a step's duration from the cost model, tokens from a hash of the
    sequence's history (so a preempted and resumed sequence produces exactly the same tokens).

    Parallel sampling: the prompt's n samples start with n different tokens, then each goes on
    with ``next_token``. Beam search: which current beam each new beam extends is
    ``beam_step``'s rule (one parameter, ``beam_displaced``). This choice decides how much of
    the generated text beams share, so the measured saving (Fig. 15) is only as good as this
    model of beam survival."""

    # d: beams displaced per step, on average (see beam_step). An argument, not a measurement.
    BEAM_DISPLACED = 1.0

    def __init__(self, cost: CostModel, block_bytes: int, seed: int = 0, *,
                 block_size: int | None = None, beam_displaced: float | None = None) -> None:
        self.cost, self.block_bytes, self.seed = cost, block_bytes, seed
        d = self.BEAM_DISPLACED if beam_displaced is None else beam_displaced
        self.beam_displaced = check_float("beam_displaced", d, low=0.0)
        self.block_size = block_size  # None: a contiguous cache (no per-block cost)
        self.blocks_read = 0  # running total, for experiment 4

    def beam_step(self, order: int, pos: int, k: int, num_beams: int) -> list[tuple[int, int]]:
        """The ``k`` new beams of a group whose ``num_beams`` current beams are ``pos`` tokens
        long: for each, (index of the current beam it extends, its new token).

        The rule: new beam j extends current beam j, its own lineage, unless it is displaced,
        which happens with probability d / k (k = num_beams, d = ``beam_displaced``); a
        displaced slot goes to a beam drawn uniformly, i.e. a strong beam's second-best
        continuation takes a weak beam's place. So on average d beams die and d beams fork per
        step. Why d = 1: beam search keeps the k best continuations of k beams whose scores
        are close (they were the k best one step earlier), and a language model is usually
        confident about the next token, so most beams' best continuation stays in the top k
        and only the odd step swaps one beam for another's second choice: one death and one
        birth per step is the Moran process of population genetics. It is an assumption about
        the language, not a measurement (this simulator has no model), and it was not fitted to
        Fig. 15. d = k is the fully random choice (every parent drawn uniformly), which merges
        lineages faster and overshoots the paper at width 6 (about 69% saved against 55.2%).
        At the first step there is one beam, the prompt, and every new beam extends it."""
        # The two hash rounds of each new beam, _mix_in(h_step, j) and _mix_in(h, 1), are written
        # out in the loop: calling _mix_in was a tenth of ``simulate --num-requests 10000
        # --beam-width 4`` (sampled profile), whose budget is 60 s. test_beam_model.py checks
        # the loop against the definition, _mix(seed, order, pos, j).
        h_step = _mix(self.seed, order, pos)
        p_displaced = self.beam_displaced / num_beams
        out = []
        for j in range(k):
            h = ((h_step ^ j) * 0xBF58476D1CE4E5B9) & _MASK64  # h = _mix_in(h_step, j)
            h ^= h >> 31
            parent = h % num_beams  # displaced (or a beam beyond the current ones)
            if j < num_beams:
                u = ((h ^ 1) * 0xBF58476D1CE4E5B9) & _MASK64  # u = _mix_in(h, 1)
                if ((u ^ (u >> 31)) >> 11) / 2.0 ** 53 >= p_displaced:  # uniform in [0, 1)
                    parent = j
            out.append((parent, (h >> 20) % VOCAB + 1))
        return out

    def execute(self, out: SchedulerOutput) -> StepResult:
        # The context each sequence attends over: a prefill chunk up to its end, a decode all.
        ctx = [c.end for c in out.prefills] + [len(s.token_ids) for s in out.decodes]
        nb = 0
        if self.block_size is not None:
            nb = sum(cdiv(n, self.block_size) for n in ctx)
            self.blocks_read += nb
        dt = self.cost.step_time(out.num_tokens, sum(ctx), blocks_read=nb,
                                 blocks_swapped=len(out.blocks_to_swap_in)
                                 + len(out.blocks_to_swap_out), block_bytes=self.block_bytes)
        samples: list = []
        beams: dict[int, list[int]] = {}  # group order -> its beams' indices in out.sampled
        for i, s in enumerate(out.sampled):
            g = s.group
            if g.beam_width > 1:
                beams.setdefault(g.order, []).append(i)
                samples.append([])  # filled below, once the group's beams are all known
            elif g.n > 1 and len(s.token_ids) == g.prompt_len:
                first = next_token(s.token_ids)
                samples.append([(first + j * 7919) % VOCAB + 1 for j in range(g.n)])
            else:
                samples.append(next_token(s.token_ids))
        for idx in beams.values():
            g = out.sampled[idx[0]].group
            pos = len(out.sampled[idx[0]].token_ids)
            # The prompt's step makes k beams; every later step keeps as many as it samples
            # (all k, except when a recomputed group's prefill chunks end in different steps).
            k = g.beam_width if pos == g.prompt_len else len(idx)
            for parent, token in self.beam_step(g.order, pos, k, len(idx)):
                samples[idx[parent]].append(token)
        return StepResult(dt, samples)
