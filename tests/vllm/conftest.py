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

# reference ("normalised" / "stock") -> family -> list of peer_lockstep.Report
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
    from peer_lockstep import OP_METRICS, STEP_METRICS

    metrics = [m for m in OP_METRICS + STEP_METRICS
               if any(r.compared[m] for rs in reports.values() for r in rs)]
    head = (f"{'family':28}{'traces':>7}{'equal':>6}{'steps':>7}{'ops':>7}"
            + "".join(f"{m:>16}" for m in metrics) + f"{'hits mp/vLLM':>15}")
    lines = [head]
    total_c, total_e, totals = Counter(), Counter(), Counter()
    for family, rs in sorted(reports.items()):
        c, e = sum((r.compared for r in rs), Counter()), sum((r.equal for r in rs), Counter())
        row = Counter(traces=len(rs), ok=sum(r.ok for r in rs),
                      steps=sum(r.steps for r in rs), ops=sum(r.ops for r in rs),
                      mp=sum(r.stats["hit_tokens_minipaged"] for r in rs),
                      vl=sum(r.stats["hit_tokens"] for r in rs))
        total_c += c
        total_e += e
        totals += row
        lines.append(f"{family:28}{row['traces']:>7}{row['ok']:>6}{row['steps']:>7}"
                     f"{row['ops']:>7}" + "".join(f"{_pct(e[m], c[m]):>16}" for m in metrics)
                     + f"{row['mp']:>8}/{row['vl']:<6}")
    lines.append(f"{'all':28}{totals['traces']:>7}{totals['ok']:>6}{totals['steps']:>7}"
                 f"{totals['ops']:>7}" + "".join(f"{_pct(total_e[m], total_c[m]):>16}"
                                                 for m in metrics)
                 + f"{totals['mp']:>8}/{totals['vl']:<6}")
    return lines


def pytest_terminal_summary(terminalreporter) -> None:
    titles = {"normalised": "minipaged vs vLLM (duplicate rule normalised; the asserted test)",
              "stock": "minipaged vs stock vLLM (what the duplicate rule costs)"}
    for reference in ("normalised", "stock"):
        if REPORTS[reference]:
            terminalreporter.write_sep("-", f"agreement: {titles[reference]}")
            for line in agreement_table(REPORTS[reference]):
                terminalreporter.write_line(line)
