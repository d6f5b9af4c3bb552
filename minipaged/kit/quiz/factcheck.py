"""A measured fact-check of the interview answer about PagedAttention (``minipaged factcheck``).

What this teaches: to trust a number only after measuring it. For every checkable claim of the
interview answer (``answer.py``) one function runs the project's own instruments (the
simulator, ``kv-calc``'s arithmetic, the real block managers) and returns what they measure,
with a verdict:

    holds        what we measure (or the paper reports) agrees
    off          it disagrees: the right figure is given
    unsupported  neither the paper nor the code says so, and our measurements do not back it

This module lists the checks in the answer's order (``CHECKS``), runs them (``run``) and prints
the table; the checks themselves are in ``factcheck_memory.py`` (where KV memory goes, sharing,
preemption, batch and throughput) and ``factcheck_blocks.py`` (block size, block tables,
kernels), and a ``Finding`` is defined in ``context.py``, which the drills share. Each verdict
is the one verdict of its claim: the quiz's drills print the same finding.
Read before: ``sim/experiments.py``. Read next: ``factcheck_memory.py``, then
``factcheck_blocks.py``. Lesson: ``lessons/10_factcheck.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from minipaged.kit.quiz import factcheck_blocks as blocks
from minipaged.kit.quiz import factcheck_memory as memory
from minipaged.kit.quiz.answer import CLAIMS
from minipaged.kit.quiz.context import (
    CANONICAL_REQUESTS,
    CANONICAL_SEED,
    VERDICTS,
    Context,
    Finding,
    canonical,
)

__all__ = ["CHECKS", "VERDICTS", "Finding", "run", "table"]

# One check per claim, in the answer's order; memory: factcheck_memory.py, blocks:
# factcheck_blocks.py.
CHECKS: dict[str, Callable[[Context], Finding]] = {
    f.__name__.replace("_", "-"): f for f in (
        memory.max_reservation_internal, memory.contiguous_external, memory.utilization_before,
        blocks.default_block_16, memory.no_external_fragmentation, memory.copy_on_write,
        memory.refcount_cap, blocks.sweet_spot_16, memory.no_page_replacement,
        memory.utilization_after, memory.throughput_2_4x, memory.batch_8_to_32,
        blocks.block_table_32k, blocks.int32_compression, blocks.block_table_128k,
        blocks.block_size_tradeoff, blocks.block_32_example, blocks.flashattention_compatible,
        blocks.others_page_too)}
assert list(CHECKS) == list(CLAIMS), "one check per claim of the interview answer, in order"


def run(quick: bool = False, seed: int = 0, progress: Callable[[int, int], None] | None = None,
        ctx: Context | None = None) -> list[Finding]:
    """Every finding, in the answer's order: from the canonical run (``context.canonical``),
    or with ``quick`` from 150 requests per simulation (each finding says which run)."""
    if ctx is None:
        canon = not quick and seed == CANONICAL_SEED
        ctx = canonical() if canon else Context(150 if quick else CANONICAL_REQUESTS, seed)
    out = []
    for i, claim_id in enumerate(CHECKS, 1):
        out.append(ctx.finding(claim_id))
        if progress is not None:
            progress(i, len(CHECKS))
    return out


def table(findings: list[Finding]):
    from rich.markup import escape
    from rich.table import Table

    runs = sorted({f.run for f in findings if f.run})
    t = Table(title="Fact-check of the interview answer: every checkable claim, measured"
                    + (f" ({'; '.join(runs)})" if runs else ""), show_lines=True)
    for col in ("claim (the interview answer)", "minipaged measures", "verdict"):
        t.add_column(col, ratio=3)
    color = {"holds": "green", "off": "red", "unsupported": "yellow"}
    for f in findings:
        t.add_row(f"{escape(f.claim)}\n[dim]{escape(f.quote)}[/dim]", escape(f.measured),
                  f"[{color[f.verdict]}]{f.verdict}[/]: {escape(f.right)}")
    return t
