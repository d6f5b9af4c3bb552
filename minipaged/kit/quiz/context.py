"""What the drills, the fact-check and the lessons share: one Context of measurements.

A ``Context`` fixes the simulation size and seed; each simulation, experiment and fact-check
finding is computed once and reused, so a figure that a drill and the fact-check both print is
the same number from the same run. ``canonical()`` is THE run configuration of the course:
lessons 04, 06, 07 and 10, ``minipaged quiz``, ``minipaged factcheck`` and the slides' figures
(``kit/figures.py``) all state their shared figures from it, and print ``ctx.label`` beside
them; a run of any other size says so the same way (tests/test_factcheck.py checks that every
place states the same figure).

Also here, the shapes of what they return: a drill's ``Answer``, and the fact-check's
``Finding`` on one claim with its verdict (``VERDICTS``; ``finding`` builds one from the
claim's id).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minipaged.kit.quiz.answer import CLAIMS

# The canonical run configuration (see the module docstring).
CANONICAL_REQUESTS = 300          # requests per simulation (Alpaca sweeps: 5x as many)
CANONICAL_SEED = 0
BLOCK_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)   # the block-size sweep (experiment 4)
PRESSURE_RUN = {"kv_cache_gb": 2.0, "request_rate": 2.0}   # "preemptions in a 2 GiB cache"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def nbytes(n: float) -> str:
    """Bytes with a binary unit: 512 B, 8.00 KiB, 1.25 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


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
    key: str                 # short id, e.g. "seed", "follow-up-1", "why-16"
    source: str              # "interview answer" | "... follow-up N" | "... pitfall N" | ...
    zh: str
    en: str
    answer: Callable[[Context], Answer]


VERDICTS = ("holds", "off", "unsupported")


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
        if isinstance(num_requests, bool) or not isinstance(num_requests, int) \
                or num_requests < 1:
            raise ValueError(f"num_requests={num_requests!r} must be an int >= 1")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an int >= 0 (the simulator's seed)")
        self.num_requests = num_requests
        self.seed = seed
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
        from minipaged.sim.simulator import SimConfig, simulate

        kw.setdefault("num_requests", self.num_requests)
        kw.setdefault("seed", self.seed)
        return self.cached(("sim", *sorted(kw.items())), lambda: simulate(SimConfig(**kw)))

    def sim_command(self, **kw: Any) -> str:
        """The ``minipaged simulate`` command line that reproduces ``sim(**kw)``."""
        kw = {"workload": "sharegpt", "policy": "paged", "num_requests": self.num_requests,
              "seed": self.seed, **kw}
        order = ["workload", "policy", "num_requests", "seed", "block_size", "model",
                 "kv_cache_gb", "n", "beam_width", "preemption_mode"]
        flags = {"preemption_mode": "--preemption"}
        parts = ["minipaged simulate"]
        for k in order + sorted(set(kw) - set(order)):
            if k in kw:
                parts.append(f"{flags.get(k, '--' + k.replace('_', '-'))} {kw[k]}")
        return " ".join(parts)

    def final_lens(self, workload: str = "sharegpt"):
        """Final lengths (prompt + output) of at least 1000 synthetic requests, int64 [N]."""
        import numpy as np

        from minipaged.sim.workloads import synthetic

        def make():
            reqs = synthetic(workload, max(self.num_requests, 1000), seed=self.seed)
            return np.array([r.prompt_len + r.output_len for r in reqs], dtype=np.int64)
        return self.cached(("final_lens", workload), make)

    def fig2(self) -> dict:
        """Experiment 1 (the paper's Fig. 2): KV usage of every policy while requests queue."""
        from minipaged.sim.experiments import fig2

        return self.cached(("fig2",), lambda: fig2(self.num_requests, self.seed))

    def rates(self) -> dict:
        """Experiment 3: the highest request rate each policy sustains."""
        from minipaged.sim.experiments import rates

        return self.cached(("rates",), lambda: rates(self.num_requests, self.seed, iters=6))

    def block_sweep(self) -> dict:
        """Experiment 4 (Fig. 18b) on both workloads, the block sizes of ``BLOCK_SIZES``."""
        from minipaged.sim.experiments import block_size

        return self.cached(("blocks",), lambda: block_size(
            self.num_requests, self.seed, sizes=BLOCK_SIZES, workloads=("sharegpt", "alpaca")))

    def sharing(self) -> dict:
        """Experiment 2 (Fig. 15) on Alpaca: {"parallel" | "beam": {2 | 4 | 6: saving}}."""
        from minipaged.sim.experiments import sharing

        return self.cached(("sharing",), lambda: sharing(
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

    def finding(self, claim_id: str):
        """The fact-check's finding on one claim of the interview answer."""
        from minipaged.kit.quiz import factcheck

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
