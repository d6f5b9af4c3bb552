"""The vLLM differential tests: their fixtures and the agreement figures they print.

Every test here needs the ``vllm`` capability (tests/capabilities.py): without vLLM it is
skipped with the reason, and with ``MINIPAGED_REQUIRE`` naming ``vllm`` (as ``.ci/run`` sets it
for this folder) the skip becomes a failure. Nothing is imported from vLLM (or torch) before a
test has passed that check, so collecting this folder costs nothing on a machine without it.

After the run, the terminal summary prints the agreement figures of the lockstep comparison
(the README quotes them): per trace family, traces, steps, operations and the share of equal
comparisons per metric.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from capabilities import require

# comparison ("normalised", "stock", "scheduler", "scheduler-stock") -> family -> reports
REPORTS: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))


@pytest.fixture(scope="session")
def lockstep():
    """The lockstep runner (imports vLLM, so only after the capability check)."""
    require("vllm")
    import peer_lockstep

    return peer_lockstep


@pytest.fixture
def record():
    """``record(reference, family, report)`` keeps a report for the figures."""
    def add(reference: str, family: str, report) -> None:
        REPORTS[reference][family].append(report)
    return add


def _pct(equal: int, total: int) -> str:
    return f"{100 * equal / total:.2f}%" if total else "-"


def agreement_table(reports: dict[str, list]) -> list[str]:
    """Rows per family: traces, traces fully equal, steps, operations (block manager only),
    the share of equal comparisons per metric, and prompt tokens hit (minipaged / vLLM)."""
    every = [r for rs in reports.values() for r in rs]
    metrics = list(dict.fromkeys(m for r in every for m in r.compared))
    has_ops = any(getattr(r, "ops", 0) for r in every)
    has_hits = any(r.stats["hit_tokens"] for r in every)

    def row(name: str, rs: list) -> str:
        c, e = sum((r.compared for r in rs), Counter()), sum((r.equal for r in rs), Counter())
        cells = f"{name:28}{len(rs):>7}{sum(r.ok for r in rs):>6}{sum(r.steps for r in rs):>7}"
        if has_ops:
            cells += f"{sum(r.ops for r in rs):>7}"
        cells += "".join(f"{_pct(e[m], c[m]):>17}" for m in metrics)
        if has_hits:
            mp = sum(r.stats["hit_tokens_minipaged"] for r in rs)
            cells += f"{mp:>9}/{sum(r.stats['hit_tokens'] for r in rs):<6}"
        return cells

    head = f"{'family':28}{'traces':>7}{'equal':>6}{'steps':>7}" + (f"{'ops':>7}" if has_ops
                                                                  else "")
    head += "".join(f"{m:>17}" for m in metrics) + (f"{'hits mp/vLLM':>15}" if has_hits else "")
    return [head] + [row(f, rs) for f, rs in sorted(reports.items())] + [row("all", every)]


def pytest_terminal_summary(terminalreporter) -> None:
    titles = {
        "normalised": "block manager vs vLLM (duplicate rule normalised; asserted)",
        "stock": "block manager vs stock vLLM (what the duplicate rule costs; figures only)",
        "scheduler": "scheduler vs vLLM (prompt allocated at admission, normalised; asserted)",
        "scheduler-stock": "scheduler vs stock vLLM (figures only)"}
    for reference in titles:
        if REPORTS[reference]:
            terminalreporter.write_sep("-", f"agreement: {titles[reference]}")
            for line in agreement_table(REPORTS[reference]):
                terminalreporter.write_line(line)
