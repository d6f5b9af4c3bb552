"""What the drills and the fact-check share: one Context of measurements, and how they print.

A ``Context`` fixes the simulation size and seed; each simulation, experiment and fact-check
finding is computed once and reused, so a figure that a drill and the fact-check both print is
the same number from the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class Drill:
    key: str                 # short id, e.g. "seed", "follow-up-1", "why-16"
    source: str              # "interview answer" | "... follow-up N" | "... pitfall N" | ...
    zh: str
    en: str
    answer: Callable[[Context], Answer]


class Context:
    """The simulation size and seed behind every figure, and a cache of what was measured."""

    def __init__(self, num_requests: int = 300, seed: int = 0) -> None:
        if isinstance(num_requests, bool) or not isinstance(num_requests, int) \
                or num_requests < 1:
            raise ValueError(f"num_requests={num_requests!r} must be an int >= 1")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an int >= 0 (the simulator's seed)")
        self.num_requests = num_requests
        self.seed = seed
        self._cache: dict[tuple, Any] = {}

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
        """Experiment 4 (Fig. 18b) on both workloads, block sizes 4 to 128."""
        from minipaged.sim.experiments import block_size

        return self.cached(("blocks",), lambda: block_size(
            self.num_requests, self.seed, sizes=(4, 8, 16, 32, 64, 128),
            workloads=("sharegpt", "alpaca")))

    def finding(self, claim_id: str):
        """The fact-check's finding on one claim of the interview answer."""
        from minipaged.kit.quiz import factcheck

        return self.cached(("finding", claim_id), lambda: factcheck.CHECKS[claim_id](self))

    def verdicts(self, *claim_ids: str) -> list[tuple[str, str, str]]:
        """(claim, verdict, why) for drills: the very verdicts ``minipaged factcheck`` prints."""
        return [(f.quote, f.verdict, f.right) for f in map(self.finding, claim_ids)]
