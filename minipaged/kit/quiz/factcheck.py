"""A measured fact-check of the interview answer about PagedAttention (``minipaged factcheck``).

What this teaches: to trust a number only after measuring it. For every checkable claim of the
interview answer (``answer.py``), in its order (where KV memory goes, sharing, preemption, what
paging buys, then the block's size, its table and the kernels that read it), one check runs the
project's own instruments (the simulator's experiments through the shared ``Context``,
``kv-calc``'s arithmetic, the real block managers), or cites the source where there is nothing
to measure (``sourced``), and returns a ``Finding`` (``context.py``) with one verdict:

    holds        what we measure (or the paper reports) agrees
    off          it disagrees: the right figure is given
    unsupported  neither the paper nor the code says so, and our measurements do not back it

The quiz's drills print these very findings (``Context.verdicts``): one verdict per claim.
The claims about the block's size, its table and the kernels are in ``factcheck_blocks.py``.
Read before: ``sim/experiments.py``. Read next: ``factcheck_blocks.py``, ``drills_answer.py``.
Lesson: ``lessons/10_factcheck.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.table import Table

from minipaged import KVCacheManager
from minipaged._checks import cdiv
from minipaged.kit.quiz.answer import CLAIMS
from minipaged.kit.quiz.context import VERDICTS, Context, Finding, canonical, finding, pct

__all__ = ["CHECKS", "VERDICTS", "Finding", "run", "table"]

ORCA = ("orca-max", "orca-pow2", "orca-oracle")

# One check per claim of the interview answer (put in the answer's order at the end).
CHECKS: dict[str, Callable[[Context], Finding]] = {}


def check(fn: Callable[[Context], Finding]) -> Callable[[Context], Finding]:
    """Register a measuring check under its claim id (the function's name, dashed)."""
    CHECKS[fn.__name__.replace("_", "-")] = fn
    return fn


def sourced(claim_id: str, measured: str, verdict: str, right: str) -> None:
    """Register a claim checked against its sources alone: there is nothing to measure."""
    CHECKS[claim_id] = lambda ctx: finding(claim_id, measured, verdict, right)


def one_sequence_waste(num_tokens: int, block_size: int) -> tuple[int, int]:
    """(unused slots, slots allocated) of one finished sequence of ``num_tokens`` in a paged
    cache, read from a real ``KVCacheManager``: the unused slots are its last block's tail."""
    m = KVCacheManager(cdiv(num_tokens, block_size) + 1, block_size)
    m.allocate("r", list(range(num_tokens)))
    u = m.usage({"r": num_tokens})
    return u.internal_fragmentation, u.used


@check
def max_reservation_internal(ctx: Context) -> Finding:
    u = ctx.fig2()["orca-max"]["usage"]
    return finding(
        "max-reservation-internal", f"orca-max: internal fragmentation "
        f"{pct(u['internal_fragmentation'])}, reserved {pct(u['reserved'])} of KV memory",
        "holds", "the paper: about 57% internal fragmentation for Orca (Max) (read off Fig. 2)",
        internal_fragmentation=u["internal_fragmentation"])


@check
def contiguous_external(ctx: Context) -> Finding:
    ext = {p: ctx.fig2()[p]["usage"]["external_fragmentation"] for p in ORCA}
    return finding(
        "contiguous-external", "external fragmentation while requests queue: "
        + ", ".join(f"{p} {pct(v)}" for p, v in ext.items()),
        "holds", "the paper: about 9% to 42% 'external fragmentation & others' (read off "
        "Fig. 2)", **ext)


@check
def utilization_before(ctx: Context) -> Finding:
    tok = {p: ctx.fig2()[p]["usage"]["token"] for p in ORCA}
    lo, hi = min(tok.values()), max(tok.values())
    return finding(
        "utilization-before", "token states while requests queue: "
        + ", ".join(f"{p} {pct(v)}" for p, v in tok.items()),
        "off", f"the paper reports 20.4%-38.2% (Fig. 2), not 30%-60%; we measure "
        f"{pct(lo)}-{pct(hi)}", **tok)


@check
def no_external_fragmentation(ctx: Context) -> Finding:
    u = ctx.fig2()["paged"]["usage"]
    return finding(
        "no-external-fragmentation", "paged external fragmentation in the simulation: "
        f"{pct(u['external_fragmentation'])}", "holds",
        "blocks all have one size, so any free block serves any sequence and no free memory "
        "is unusable (paper section 1); only the last block of a sequence is partly empty",
        external_fragmentation=u["external_fragmentation"])


@check
def copy_on_write(ctx: Context) -> Finding:
    m = KVCacheManager(8, 16)
    m.allocate("parent", list(range(20)))  # 1 full block + 4 tokens in the second
    m.fork("parent", "child")
    table = m.block_table("child")
    ref_counts = [m.ref_count(b) for b in table]
    child_slot = m.append_slot("child", 99)
    copies = m.take_copies()
    parent_slot = m.append_slot("parent", 98)
    return finding(
        "copy-on-write", f"fork then append: copies {copies} for the writer; the other owner, "
        f"now alone, writes in place (copies afterwards: {m.take_copies()})", "holds",
        "the paper, section 4.4; only the last, partly filled block ever needs a copy "
        "(vLLM v0's forks; vLLM 0.32's v1 engine has no forks and copies a block only when a "
        "prefix-cache hit ends inside it, which hybrid models' finer hashes allow: "
        "vllm/v1/core/single_type_kv_cache_manager.py, _apply_cow; vllm/v1/core/kv_cache_utils.py)",
        copies=copies, table=table, ref_counts=ref_counts, child_slot=child_slot,
        child_table=m.block_table("child"), parent_slot=parent_slot)


@check
def refcount_cap(ctx: Context) -> Finding:
    m = KVCacheManager(4, 16)
    m.allocate(0, list(range(16)))
    for i in range(1, 101):
        m.fork(0, i)
    rc = m.ref_count(m.block_table(0)[0])
    return finding(
        "refcount-cap", f"100 forks of one sequence: the shared block's reference count is {rc}",
        "off", "there is no cap: the paper (section 4.4) has none and vLLM v0's RefCounter "
        "(vllm/core/block/common.py) only asserts counts stay >= 0; 16 is the default block "
        "size", ref_count=rc)


@check
def no_page_replacement(ctx: Context) -> Finding:
    r = ctx.pressure()
    m = KVCacheManager(4, 4, enable_prefix_caching=True)   # room for one 9-token prompt
    hits = []
    for i, tokens in enumerate(([1] * 9, [1] * 9, [2] * 9, [3] * 9, [1] * 9)):
        hits.append(m.allocate(i, tokens))
        m.free(i)
    return finding(
        "no-page-replacement", f"ShareGPT in a 2 GiB KV cache at 2 req/s: {r.num_preemptions} "
        f"preemptions (recompute); a 4-block prefix cache reused {hits[1]} tokens of a prompt "
        f"seen before, and {hits[4]} after two other prompts evicted it (LRU)",
        "off", "vLLM preempts whole sequence groups when blocks run out (swap or recompute, "
        "paper section 4.5; the v1 engine recomputes only, vllm/v1/core/sched/scheduler.py) "
        "and its prefix cache evicts the least recently used free block "
        "(vllm/v1/core/block_pool.py)",
        preemptions=r.num_preemptions, hit_before=hits[1], hit_after=hits[4])


@check
def utilization_after(ctx: Context) -> Finding:
    f = ctx.fig2()["paged"]
    return finding(
        "utilization-after", f"paged (block 16): token states {pct(f['usage']['token'])} of "
        f"all KV memory, {pct(f['token_share_of_used'])} of the memory in use",
        "holds", "the paper: about 96% (read off Fig. 2); the waste is below one block per "
        "sequence (section 4.3)",
        token=f["usage"]["token"], token_share_of_used=f["token_share_of_used"])


@check
def throughput_2_4x(ctx: Context) -> Finding:
    sp = {p: ctx.rates()[p]["paged_speedup"] for p in ORCA}
    lo, hi = min(sp.values()), max(sp.values())
    # The claim is a range over baselines; it holds if our ratios overlap it.
    return finding(
        "throughput-2-4x", "highest sustainable request rate, paged over "
        + ", ".join(f"{p} {v:.2f}x" for p, v in sp.items()),
        "holds" if hi >= 2.0 and lo <= 4.0 else "off",
        "the paper: 2-4x the throughput of Orca and FasterTransformer at the same latency "
        f"(abstract); our cost model reaches {hi:.1f}x over the worst baseline and "
        f"{lo:.1f}x over the best (the paper, ShareGPT: 1.7-2.7x over Orca (Oracle), 2.7-8x over "
        "Orca (Max), section 6.2)", speedup=sp)


@check
def batch_8_to_32(ctx: Context) -> Finding:
    f = ctx.fig2()
    b = {p: f[p]["avg_batch_size"] for p in ("orca-max", "orca-oracle", "paged")}
    return finding(
        "batch-8-to-32", f"OPT-13B, 12 GiB KV, ShareGPT, saturated: orca-max {b['orca-max']:.1f}"
        f", orca-oracle {b['orca-oracle']:.1f}, paged {b['paged']:.1f} sequences per decode "
        f"step ({b['paged'] / b['orca-max']:.1f}x and {b['paged'] / b['orca-oracle']:.1f}x)",
        "holds", "a loose rounding (8 -> 32 is 4x) of the paper's Fig. 13 (section 6.2): on "
        "ShareGPT vLLM batches about 4.3x more requests than Orca (Max) and 2.2x more than "
        "Orca (Oracle); the simulator's ratios "
        + ("point the same way" if b["paged"] > b["orca-oracle"] > b["orca-max"]
           else "do not point the same way"),
        **b)


# The block's size, its table and the kernels that read it: registered by their own module.
from minipaged.kit.quiz import factcheck_blocks  # noqa: E402,F401

assert set(CHECKS) == set(CLAIMS), "one check per claim of the interview answer"
CHECKS = {claim_id: CHECKS[claim_id] for claim_id in CLAIMS}  # in the answer's order


def run(quick: bool = False, seed: int = 0, progress: Callable[[int, int], None] | None = None,
        ctx: Context | None = None) -> list[Finding]:
    """Every finding, in the answer's order: from the canonical run (``context.canonical``),
    or with ``quick`` from 150 requests per simulation (each finding says which run)."""
    if ctx is None and quick:
        ctx = Context(150, seed)
    elif ctx is None:
        ctx = canonical() if seed == canonical().seed else Context(seed=seed)
    out = []
    for i, claim_id in enumerate(CHECKS, 1):
        out.append(ctx.finding(claim_id))
        if progress is not None:
            progress(i, len(CHECKS))
    return out


def table(findings: list[Finding]) -> Table:
    runs = sorted({f.run for f in findings if f.run})
    t = Table(title="Fact-check of the interview answer: every checkable claim, measured"
                    + (f" ({'; '.join(runs)})" if runs else ""), show_lines=True)
    for col in ("claim (the interview answer)", "minipaged measures", "verdict"):
        t.add_column(col, ratio=3, overflow="fold")  # paths are long words: never cut them
    for f in findings:
        t.add_row(f"{escape(f.claim)}\n[dim]{escape(f.quote)}[/dim]", escape(f.measured),
                  f"[{VERDICTS[f.verdict]}]{f.verdict}[/]: {escape(f.right)}")
    return t
