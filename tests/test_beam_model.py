"""The simulator's model of beam survival (``SimExecutor.beam_step``) and the paper's Fig. 15.

What is promised, and tested here:
- the rule as stated: new beam j extends current beam j unless displaced, with probability
  d / k; d = 0 never displaces, d = k draws every parent uniformly; the first step (one beam)
  forks the prompt k ways; the choice is deterministic for a seed;
- on the canonical run (300 Alpaca requests, seed 0), beam search saves within 10 points of the
  paper at widths 2, 4 and 6 (37.6 / 53.1 / 55.2%) and parallel sampling within 5 points
  (6.1 / 8.5 / 9.8%); drawing every parent uniformly (d = k) overshoots width 6, so the
  parameter is what the fit rests on, and the test would notice a model that ignored it.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kit.quiz.context import canonical
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import VOCAB, SimExecutor, _mix, _mix_in
from minipaged.sim.experiments import PAPER_FIG15_ALPACA
from minipaged.sim.memory import preset
from minipaged.sim.simulator import SimConfig, simulate

COST = CostModel.for_preset(preset("opt-13b"))


def _parents(d: float, k: int, steps: int = 4000, seed: int = 0) -> list[list[int]]:
    ex = SimExecutor(COST, 1, seed, beam_displaced=d)
    return [[p for p, _ in ex.beam_step(7, pos, k, k)] for pos in range(steps)]


def _beam_step_by_definition(ex: SimExecutor, order: int, pos: int, k: int, num_beams: int):
    """The rule of ``beam_step``'s docstring with the hash helpers called, not written out."""
    out = []
    for j in range(k):
        h = _mix(ex.seed, order, pos, j)
        parent = h % num_beams
        u = (_mix_in(h, 1) >> 11) / float(1 << 53)
        if j < num_beams and u >= ex.beam_displaced / num_beams:
            parent = j
        out.append((parent, (h >> 20) % VOCAB + 1))
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 10**6), st.integers(0, 4096),
       st.integers(1, 8), st.integers(1, 8), st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_beam_step_is_its_definition(seed, order, pos, k, num_beams, d):
    ex = SimExecutor(COST, 1, seed, beam_displaced=d)
    assert ex.beam_step(order, pos, k, num_beams) == _beam_step_by_definition(
        ex, order, pos, k, num_beams)


def test_no_displacement_keeps_every_lineage():
    assert all(p == list(range(6)) for p in _parents(0.0, 6))


def test_the_first_step_forks_the_prompt():
    ex = SimExecutor(COST, 1, 0)
    assert [p for p, _ in ex.beam_step(3, 10, 4, 1)] == [0, 0, 0, 0]


@pytest.mark.parametrize("d, k", [(1.0, 2), (1.0, 4), (1.0, 6), (6.0, 6)])
def test_displacements_per_step_follow_the_parameter(d, k):
    """A slot keeps its own beam with probability 1 - d/k + (d/k)(1/k) (a displaced slot may
    draw its own beam again); measured over 4000 steps, within 3 standard errors."""
    steps = _parents(d, k)
    kept = sum(p[j] == j for p in steps for j in range(k)) / (len(steps) * k)
    want = 1 - d / k + (d / k) / k
    se = (want * (1 - want) / (len(steps) * k)) ** 0.5
    assert abs(kept - want) < 3 * se + 1e-12, (kept, want)
    if d == k:   # uniform: every parent equally likely
        counts = Counter(i for p in steps for i in p)
        assert max(counts.values()) / min(counts.values()) < 1.1


def test_a_negative_parameter_is_refused():
    with pytest.raises(ValueError, match="beam_displaced"):
        SimExecutor(COST, 1, 0, beam_displaced=-1.0)


def test_the_choice_is_deterministic_for_a_seed():
    assert _parents(1.0, 4, 200, seed=3) == _parents(1.0, 4, 200, seed=3)
    assert _parents(1.0, 4, 200, seed=3) != _parents(1.0, 4, 200, seed=4)


def test_fig15_on_the_canonical_run():
    saved = canonical().sharing()
    for k in (2, 4, 6):
        assert abs(100 * saved["beam"][k] - PAPER_FIG15_ALPACA["beam"][k]) < 10, (k, saved)
        assert abs(100 * saved["parallel"][k] - PAPER_FIG15_ALPACA["parallel"][k]) < 5
        assert saved["beam"][k] > saved["parallel"][k]


def test_uniform_parents_overshoot_width_6(monkeypatch):
    """The old rule (every parent uniform, d = k) merges histories too fast: beyond 10 points
    of the paper at width 6, where the default d = 1 lands within them."""
    monkeypatch.setattr(SimExecutor, "BEAM_DISPLACED", 6.0)
    r = simulate(SimConfig(workload="alpaca", num_requests=300, seed=0, beam_width=6))
    assert 100 * r.memory_saving - PAPER_FIG15_ALPACA["beam"][6] > 10
    assert 65 < 100 * r.memory_saving < 73  # "about 69%" (lesson 07, sim/executor.py)
