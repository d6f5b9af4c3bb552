"""What the drills, the fact-check and the lessons share: one Context of measurements.

A ``Context`` fixes the simulation size and seed; each simulation, experiment and fact-check
finding is computed once and reused, so a figure that a drill and the fact-check both print is
the same number from the same run. ``canonical()`` is THE run configuration of the course:
lessons 04, 06, 07 and 10, ``minipaged quiz``, ``minipaged factcheck`` and the slides' figures
(``kit/figures.py``) all state their shared figures from it, and print ``ctx.label`` beside
them; a run of any other size says so the same way (tests/test_factcheck.py checks that every
place states the same figure).

Also here, the one way each thing is done: ``pct`` and ``nbytes`` (``minipaged.sim``'s) format
figures; ``drill`` makes a ``Drill`` of the function that computes its ``Answer``; ``finding``
makes the fact-check's ``Finding`` on one claim, with one of the ``VERDICTS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipaged._checks import cdiv, check_int
from minipaged.kit.quiz.answer import CLAIMS
from minipaged.sim import (
    experiments,
    pct,  # the one percentage format (re-exported)
    simulator,
    workloads,
)
from minipaged.sim import nbytes as nbytes  # the one byte format (re-exported)

# The canonical run configuration (see the module docstring).
CANONICAL_REQUESTS = 300          # requests per simulation (Alpaca sweeps: 5x as many)
CANONICAL_SEED = 0
BLOCK_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)   # the block-size sweep (experiment 4)
PRESSURE_RUN = {"kv_cache_gb": 2.0, "request_rate": 2.0}   # "preemptions in a 2 GiB cache"

# The fact-check's verdicts, each with the colour the quiz and the table print it in.
VERDICTS = {"holds": "green", "off": "red", "unsupported": "yellow"}


@dataclass
class Answer:
    """An answer: short prose, the figures measured for it, how to reproduce them, and the
    fact-check's verdict on each claim of the interview answer it covers."""

    text: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, str, str]] = field(default_factory=list)  # (claim, verdict, why)
    run: str = ""            # the run its simulations came from (Context.label)


@dataclass(frozen=True)
class Drill:
    """A question in Chinese and English, and the function that answers it from a Context."""

    key: str                 # short id, e.g. "question", "follow-up-1", "why-16"
    source: str              # "the interview question" | "follow-up N" | "pitfall N" | ...
    zh: str
    en: str
    answer: Callable[[Context], Answer]

    def __call__(self, ctx: Context) -> Answer:
        return self.answer(ctx)


def drill(key: str, zh: str, en: str, source: str = "interviewer"):
    """Decorator: the function, which computes an ``Answer`` from a ``Context``, becomes the
    ``Drill`` that asks ``zh`` / ``en`` (still callable with a Context)."""
    return lambda answer: Drill(key, source, zh, en, answer)


@dataclass
class Finding:
    """The fact-check's finding on one claim of the interview answer (``factcheck.py``)."""

    claim_id: str
    quote: str          # the claim in Chinese, as the interview answer makes it
    claim: str          # the claim in English
    measured: str       # what minipaged measures or computes
    verdict: str        # holds | off | unsupported
    right: str          # the right figure, or the evidence, with its source
    figures: dict
    run: str = ""       # the run its simulations came from (Context.label)


def finding(claim_id: str, measured: str, verdict: str, right: str, **figures) -> Finding:
    assert verdict in VERDICTS, verdict
    zh, en = CLAIMS[claim_id]
    return Finding(claim_id, zh, en, measured, verdict, right, figures)


class Context:
    """The simulation size and seed behind every figure, and a cache of what was measured."""

    def __init__(self, num_requests: int = CANONICAL_REQUESTS, seed: int = CANONICAL_SEED
                 ) -> None:
        self.num_requests = check_int("num_requests", num_requests, low=1)
        self.seed = check_int("seed", seed, low=0)  # the simulator's seed
        self._cache: dict[tuple, Any] = {}

    @property
    def label(self) -> str:
        """The run every figure of this context comes from, to print beside it."""
        canon = (self.num_requests, self.seed) == (CANONICAL_REQUESTS, CANONICAL_SEED)
        return (f"{'canonical run: ' if canon else ''}{self.num_requests} requests per "
                f"simulation, seed {self.seed}")

    def cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def sim(self, **kw: Any):
        """``minipaged.sim.simulator.simulate`` with this context's size and seed."""
        kw = {"num_requests": self.num_requests, "seed": self.seed, **kw}
        return self.cached(("sim", *sorted(kw.items())),
                           lambda: simulator.simulate(simulator.SimConfig(**kw)))

    def sim_command(self, **kw: Any) -> str:
        """The ``minipaged simulate`` command line that reproduces ``sim(**kw)``: workload,
        policy, size and seed first, then the other options in alphabetical order."""
        opts = {"workload": "sharegpt", "policy": "paged", "num_requests": self.num_requests,
                "seed": self.seed, **dict(sorted(kw.items()))}
        flag = {"preemption_mode": "preemption"}
        return " ".join(["minipaged simulate", *(f"--{flag.get(k, k).replace('_', '-')} {v}"
                                                 for k, v in opts.items())])

    def final_lens(self, workload: str = "sharegpt") -> np.ndarray:
        """Final lengths (prompt + output) of at least 1000 synthetic requests, int64 [N]."""
        def make():
            reqs = workloads.synthetic(workload, max(self.num_requests, 1000), seed=self.seed)
            return np.array([r.prompt_len + r.output_len for r in reqs], dtype=np.int64)
        return self.cached(("final_lens", workload), make)

    def unused_slots(self, block_size: int, workload: str = "sharegpt") -> np.ndarray:
        """Slots left empty in each sequence's last block at ``block_size``, int64 [N]."""
        lens = self.final_lens(workload)
        return cdiv(lens, block_size) * block_size - lens

    def fig2(self) -> dict:
        """Experiment 1 (the paper's Fig. 2): KV usage of every policy while requests queue."""
        return self.cached(("fig2",), lambda: experiments.fig2(self.num_requests, self.seed))

    def rates(self) -> dict:
        """Experiment 3: the highest request rate each policy sustains."""
        return self.cached(("rates",),
                           lambda: experiments.rates(self.num_requests, self.seed, iters=6))

    def block_sweep(self) -> dict:
        """Experiment 4 (Fig. 18b) on both workloads, the block sizes of ``BLOCK_SIZES``."""
        return self.cached(("blocks",), lambda: experiments.block_size(
            self.num_requests, self.seed, sizes=BLOCK_SIZES, workloads=("sharegpt", "alpaca")))

    def sharing(self) -> dict:
        """Experiment 2 (Fig. 15) on Alpaca: {"parallel" | "beam": {2 | 4 | 6: saving}}."""
        return self.cached(("sharing",), lambda: experiments.sharing(
            self.num_requests, self.seed, workloads=("alpaca",))["alpaca"])

    def pressure(self):
        """The memory-pressure run: ShareGPT in a 2 GiB KV cache at 2 requests/s, preemption
        by recomputation (``PRESSURE_RUN``)."""
        return self.sim(**PRESSURE_RUN)

    def shared_figures(self) -> dict[str, str]:
        """The figures several places state, formatted as they print them."""
        return {
            "preemptions_2gib": str(self.pressure().num_preemptions),
            "parallel_saving_n6": pct(self.sharing()["parallel"][6]),
            "best_alpaca_block_size": str(self.block_sweep()["alpaca"]["best_block_size"]),
        }

    def finding(self, claim_id: str) -> Finding:
        """The fact-check's finding on one claim of the interview answer."""
        from minipaged.kit.quiz import factcheck  # factcheck imports this module

        def make():
            f = factcheck.CHECKS[claim_id](self)
            f.run = self.label
            return f
        return self.cached(("finding", claim_id), make)

    def verdicts(self, *claim_ids: str) -> list[tuple[str, str, str]]:
        """(claim, verdict, why) for drills: the very verdicts ``minipaged factcheck`` prints."""
        return [(f.quote, f.verdict, f.right) for f in map(self.finding, claim_ids)]


_CANONICAL: list[Context] = []


def canonical() -> Context:
    """The course's one shared Context (``CANONICAL_REQUESTS``, ``CANONICAL_SEED``), built once
    per process, so a lesson that prints a figure twice computes it once."""
    if not _CANONICAL:
        _CANONICAL.append(Context(CANONICAL_REQUESTS, CANONICAL_SEED))
    return _CANONICAL[0]
